//! CouchDB's `[replicator]` section read with CouchDB's meanings: scheduler settings, the
//! per-job defaults a replication document overrides (`worker_processes`,
//! `connection_timeout`, `use_bulk_get`, ...), TLS to endpoints, and the allowed endpoint and
//! proxy protocols. Keys CouchDB 3.4 reads that have no counterpart here are listed in
//! [`IGNORED`] with the reason, so an operator's `local.ini` loads unchanged and the log says
//! what was not applied.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::replication::ReplicationOptions;
use crate::replication::http::auth::AuthPolicy;
use crate::replication::http::tls::TlsOptions;
use crate::replication::options::values::ranged;
use crate::replicator::{NodeType, ReplicatorSettings, TimingPolicy};

use super::config_file::ConfigFile;

/// How a scheduler key's whole number becomes its setting.
type Setter = fn(&mut ReplicatorSettings, u64);

/// Scheduler keys (CouchDB 4.x's names; their unit is in the name or CouchDB's): the
/// `[replicator]` key, the [`ReplicatorSettings`] field it fills (to name the key in range
/// errors), and how. `node_types` is a list, read apart.
const SCHEDULER: &[(&str, &str, Setter)] = &[
    ("max_jobs", "max_jobs", |s, v| s.max_jobs = v as usize),
    ("interval_sec", "interval", |s, v| s.interval = secs(v)),
    ("max_churn", "max_churn", |s, v| s.max_churn = v as usize),
    ("max_acceptors", "max_acceptors", |s, v| {
        s.max_acceptors = v as usize
    }),
    ("min_run_time_sec", "min_run_time", |s, v| {
        s.min_run_time = secs(v)
    }),
    (
        "transient_job_max_age_sec",
        "transient_job_max_age",
        |s, v| s.transient_job_max_age = secs(v),
    ),
    ("startup_jitter", "startup_jitter", |s, v| {
        s.startup_jitter = Duration::from_millis(v)
    }),
    ("health_threshold_sec", "health_threshold", |s, v| {
        s.health_threshold = secs(v)
    }),
    ("min_backoff_penalty_sec", "min_backoff_penalty", |s, v| {
        s.min_backoff_penalty = secs(v)
    }),
    ("max_backoff_penalty_sec", "max_backoff_penalty", |s, v| {
        s.max_backoff_penalty = secs(v)
    }),
    ("max_history", "max_history", |s, v| {
        s.max_history = v as usize
    }),
    (
        "stats_update_interval_sec",
        "stats_update_interval",
        |s, v| s.stats_update_interval = secs(v),
    ),
    ("job_timeout_sec", "job_timeout", |s, v| {
        s.job_timeout = secs(v)
    }),
    ("node_timeout_sec", "node_timeout", |s, v| {
        s.node_timeout = secs(v)
    }),
    ("cluster_quiet_period", "cluster_quiet_period", |s, v| {
        s.cluster_quiet_period = secs(v)
    }),
    ("cluster_start_period", "cluster_start_period", |s, v| {
        s.cluster_start_period = secs(v)
    }),
    (
        "rate_limiter_max_interval_msec",
        "rate_limiter_max_interval",
        |s, v| s.rate_limiter_max_interval = Duration::from_millis(v),
    ),
    (
        "connection_close_interval",
        "connection_close_interval",
        |s, v| s.connection_close_interval = Duration::from_millis(v),
    ),
    // Ours, not CouchDB's: see the field.
    (
        "max_requests_per_endpoint",
        "max_requests_per_endpoint",
        |s, v| s.max_requests_per_endpoint = v as usize,
    ),
];

fn secs(v: u64) -> Duration {
    Duration::from_secs(v)
}

/// Fair-share coefficients (fractions, 0..=1); the shares themselves are `[replicator.shares]`.
const FAIR_SHARE: &[&str] = &["usage_coeff", "priority_coeff"];

/// Per-job defaults: document option names, also CouchDB's `[replicator]` key names.
const PER_JOB_NUMBERS: &[&str] = &[
    "worker_processes",
    "worker_batch_size",
    "http_connections",
    "connection_timeout",
    "retries_per_request",
    "checkpoint_interval",
    "request_timeout",
    "max_document_id_length",
    "missing_doc_retry_msec",
];
const PER_JOB_BOOLS: &[&str] = &["use_checkpoints", "use_bulk_get"];

/// TLS and protocol keys.
const TLS_AND_PROTOCOLS: &[&str] = &[
    "verify_ssl_certificates",
    "ssl_trusted_certificates_file",
    "ssl_certificate_max_depth",
    "cert_file",
    "key_file",
    "password",
    "valid_endpoint_protocols",
    "valid_proxy_protocols",
    "auth_plugins",
    "session_refresh_interval_sec",
];

/// CouchDB 3.4 keys accepted and not applied, with why.
pub const IGNORED: &[(&str, &str)] = &[
    (
        "session_min_update_interval",
        "a cookie is refreshed at most every 5 s (CouchDB's default)",
    ),
    (
        "valid_socket_options",
        "only nodelay of socket_options has an effect here",
    ),
    ("ibrowse_options", "ibrowse is CouchDB's HTTP client"),
    ("valid_ibrowse_options", "ibrowse is CouchDB's HTTP client"),
    (
        "update_docs",
        "_replicator documents always get CouchDB's terminal states",
    ),
    (
        "valid_endpoint_protocols_log",
        "no insecure-protocol audit log",
    ),
    (
        "verify_ssl_certificates_log",
        "no certificate audit log; use verify_ssl_certificates",
    ),
];

/// Everything `[replicator]` configures.
#[derive(Debug)]
pub struct ReplicatorSection {
    /// Scheduler settings, with the per-job defaults inside.
    pub settings: ReplicatorSettings,
    /// What to tell the operator once at start (ignored keys, TLS limits).
    pub notes: Vec<String>,
}

/// Every key this section understands (applied or deliberately ignored).
pub fn is_known(key: &str) -> bool {
    SCHEDULER.iter().any(|(k, _, _)| *k == key)
        || key == "node_types"
        || key == "cluster_timing"
        || FAIR_SHARE.contains(&key)
        || PER_JOB_NUMBERS.contains(&key)
        || PER_JOB_BOOLS.contains(&key)
        || TLS_AND_PROTOCOLS.contains(&key)
        || super::limits_section::KEYS.contains(&key)
        || super::user_limits_section::KEYS.contains(&key)
        || IGNORED.iter().any(|(k, _)| *k == key)
        || matches!(key, "interval" | "health_threshold" | "socket_options")
}

fn boolean(key: &str, v: &str) -> Result<bool, String> {
    match v.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!(
            "[replicator] {key} must be true or false, not `{v}`"
        )),
    }
}

/// Reads `[replicator]`; errors name the key and what it must be.
pub fn read(cfg: &ConfigFile) -> Result<ReplicatorSection, String> {
    let mut notes = Vec::new();
    let mut settings = scheduler(cfg)?;
    let mut m = Map::new();
    for (k, v) in cfg.section("replicator") {
        let key = k.as_str();
        if PER_JOB_NUMBERS.contains(&key) || key == "socket_options" {
            m.insert(k.clone(), Value::String(v.clone()));
        } else if PER_JOB_BOOLS.contains(&key) {
            m.insert(k.clone(), Value::Bool(boolean(key, v)?));
        } else if let Some((_, why)) = IGNORED.iter().find(|(i, _)| *i == key) {
            notes.push(format!("[replicator] {key} is not applied: {why}"));
        }
    }
    let mut defaults =
        ReplicationOptions::from_json(&m).map_err(|e| format!("[replicator] {e}"))?;
    defaults.tls = tls(cfg, &mut notes)?;
    for (key, field) in [
        ("valid_endpoint_protocols", &mut defaults.endpoint_protocols),
        ("valid_proxy_protocols", &mut defaults.proxy_protocols),
    ] {
        if let Some(v) = cfg.get("replicator", key) {
            *field = protocols(key, v)?;
        }
    }
    defaults.auth = auth_policy(cfg, &mut notes)?;
    defaults.limits = super::limits_section::read(cfg)?;
    settings.job_defaults = defaults;
    settings.validate().map_err(|e| {
        // Named as the operator wrote it: the `[replicator]` key, not the field.
        let key = SCHEDULER
            .iter()
            .find(|(_, field, _)| *field == e.setting)
            .map_or(e.setting, |(k, _, _)| k);
        format!("[replicator] {key} {}", e.rule)
    })?;
    Ok(ReplicatorSection { settings, notes })
}

/// The scheduler keys, CouchDB 3.x names mapped onto ours: `interval` (milliseconds, rounded
/// up to whole seconds) and `health_threshold` (seconds); our `interval_sec` /
/// `health_threshold_sec` win when both are set.
fn scheduler(cfg: &ConfigFile) -> Result<ReplicatorSettings, String> {
    let mut settings = ReplicatorSettings::default();
    let number = |k: &str, v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("[replicator] {k} must be a whole number, not `{v}`"))
    };
    if let Some(v) = cfg.get("replicator", "interval") {
        settings.interval = secs(number("interval", v)?.div_ceil(1000));
    }
    if let Some(v) = cfg.get("replicator", "health_threshold") {
        settings.health_threshold = secs(number("health_threshold", v)?);
    }
    for (k, v) in cfg.section("replicator") {
        if k == "node_types" {
            settings.node_types = node_types(v)?;
        } else if k == "cluster_timing" {
            settings.cluster_timing = match v.trim() {
                "adopt" => TimingPolicy::Adopt,
                "replace" => TimingPolicy::Replace,
                _ => {
                    return Err(format!(
                        "[replicator] cluster_timing must be adopt or replace, not `{v}`"
                    ));
                }
            };
        } else if let Some((_, _, set)) = SCHEDULER.iter().find(|(key, _, _)| key == k) {
            set(&mut settings, number(k, v)?);
        }
    }
    for k in FAIR_SHARE {
        if let Some(v) = cfg.get("replicator", k) {
            let x: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("[replicator] {k} must be a number, not `{v}`"))?;
            match *k {
                "usage_coeff" => settings.usage_coeff = x,
                _ => settings.priority_coeff = x,
            }
        }
    }
    // `[replicator.shares]`: fair-share weight per `_replicator` database.
    for (db, v) in cfg.section("replicator.shares") {
        let n: u32 = v
            .trim()
            .parse()
            .map_err(|_| format!("[replicator.shares] {db} must be a number of shares"))?;
        settings.shares.insert(db.clone(), n);
    }
    Ok(settings)
}

/// `node_types`: a comma-separated list of `api_frontend` and `replication`.
fn node_types(v: &str) -> Result<Vec<NodeType>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "api_frontend" => Ok(NodeType::ApiFrontend),
            "replication" => Ok(NodeType::Replication),
            other => Err(format!(
                "[replicator] node_types: unknown node type `{other}` (api_frontend, replication)"
            )),
        })
        .collect()
}

fn tls(cfg: &ConfigFile, notes: &mut Vec<String>) -> Result<TlsOptions, String> {
    let get = |k: &str| cfg.get("replicator", k).filter(|v| !v.trim().is_empty());
    let path = |k: &str| get(k).map(|v| PathBuf::from(v.trim()));
    let mut t = TlsOptions::default();
    if let Some(v) = get("verify_ssl_certificates") {
        t.verify = boolean("verify_ssl_certificates", v)?;
    }
    t.ca_file = path("ssl_trusted_certificates_file");
    if let Some(v) = get("ssl_certificate_max_depth") {
        t.max_depth = ranged("ssl_certificate_max_depth", &Value::String(v.to_owned()))
            .map_err(|e| format!("[replicator] {e}"))? as u32;
        notes.push(
            "[replicator] ssl_certificate_max_depth is checked but not applied: the TLS \
             stack (native-tls) has no depth setting, OpenSSL's default limit applies"
                .into(),
        );
    }
    t.cert_file = path("cert_file");
    t.key_file = path("key_file");
    t.password = get("password").map(str::to_owned);
    if t.cert_file.is_some() != t.key_file.is_some() {
        notes.push(
            "[replicator] cert_file and key_file must both be set for a client certificate; \
             none is used"
                .into(),
        );
    }
    if t.ca_file.is_some() && !t.verify {
        notes.push(
            "[replicator] ssl_trusted_certificates_file has no effect while \
             verify_ssl_certificates is false"
                .into(),
        );
    }
    // Fail at start, not at the first https replication, when a file is unusable.
    #[cfg(feature = "tls")]
    if t.verify || t.has_client_cert() {
        crate::replication::http::tls::connector(&t).map_err(|e| format!("[replicator] {e}"))?;
    }
    Ok(t)
}

/// `auth_plugins` (CouchDB tries them in order; the session plugin falls back to Basic when
/// a server grants no cookie, so only whether it is listed matters) and
/// `session_refresh_interval_sec`.
fn auth_policy(cfg: &ConfigFile, notes: &mut Vec<String>) -> Result<AuthPolicy, String> {
    let mut p = AuthPolicy::default();
    if let Some(v) = cfg.get("replicator", "auth_plugins") {
        const SESSION: &str = "couch_replicator_auth_session";
        const NOOP: &str = "couch_replicator_auth_noop";
        let names: Vec<&str> = v
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        p.session = names.contains(&SESSION);
        for n in names.iter().filter(|n| **n != SESSION && **n != NOOP) {
            notes.push(format!(
                "[replicator] auth_plugins: `{n}` is not available here"
            ));
        }
    }
    if let Some(v) = cfg.get("replicator", "session_refresh_interval_sec") {
        let secs = ranged("session_refresh_interval_sec", &Value::String(v.to_owned()))
            .map_err(|e| format!("[replicator] {e}"))?;
        p.refresh = Duration::from_secs(secs);
    }
    Ok(p)
}

fn protocols(key: &str, v: &str) -> Result<Vec<String>, String> {
    let list: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    let known = ["http", "https", "socks5"];
    if let Some(bad) = list.iter().find(|p| !known.contains(&p.as_str())) {
        return Err(format!(
            "[replicator] {key}: unknown protocol `{bad}` (http, https, socks5)"
        ));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> Result<ReplicatorSection, String> {
        read(&ConfigFile::parse(text).unwrap())
    }

    #[test]
    fn couchdb_keys_keep_their_meaning() {
        let s = section(
            "[replicator]\ninterval = 60000\nmax_churn = 20\nhealth_threshold = 90\n\
             worker_processes = 8\nuse_bulk_get = false\nconnection_timeout = 45000\n\
             socket_options = [{keepalive, true}, {nodelay, true}]\nrequest_timeout = infinity\n\
             auth_plugins = couch_replicator_auth_noop\nvalid_endpoint_protocols = https\n\
             session_refresh_interval_sec = 60\nusage_coeff = 0.4\nupdate_docs = true\n\
             [replicator.shares]\nbig/_replicator = 900\n",
        )
        .unwrap();
        let st = &s.settings;
        assert_eq!(
            (st.interval, st.max_churn, st.health_threshold),
            (Duration::from_secs(60), 20, Duration::from_secs(90))
        );
        let d = &st.job_defaults;
        assert_eq!(d.worker_processes, 8);
        assert!(!d.use_bulk_get && d.tcp_nodelay);
        assert_eq!(d.connection_timeout, Duration::from_secs(45));
        assert_eq!(d.request_timeout, None);
        assert_eq!(d.endpoint_protocols, vec!["https".to_string()]);
        assert!(!d.auth.session);
        assert_eq!(d.auth.refresh, Duration::from_secs(60));
        assert_eq!((st.usage_coeff, st.priority_coeff), (0.4, 0.98));
        assert_eq!(st.shares["big/_replicator"], 900);
        assert!(
            s.notes.iter().any(|n| n.contains("update_docs")),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn scheduler_keys_keep_couchdbs_units() {
        let mut cfg = ConfigFile::parse(
            "[replicator]\ninterval = 1500\nstartup_jitter = 250\n\
             rate_limiter_max_interval_msec = 300\nconnection_close_interval = 1500\n\
             job_timeout_sec = 30\nmin_run_time_sec = 7\ncluster_quiet_period = 3\n\
             transient_job_max_age_sec = 600\nnode_types = replication\n",
        )
        .unwrap();
        let st = read(&cfg).unwrap().settings;
        let ms = Duration::from_millis;
        // CouchDB's `interval` is in milliseconds; the cycle runs in whole seconds.
        assert_eq!(st.interval, ms(2000));
        assert_eq!(
            (st.startup_jitter, st.rate_limiter_max_interval),
            (ms(250), ms(300))
        );
        assert_eq!(st.connection_close_interval, ms(1500));
        assert_eq!((st.job_timeout, st.min_run_time), (secs(30), secs(7)));
        assert_eq!(
            (st.cluster_quiet_period, st.transient_job_max_age),
            (secs(3), secs(600))
        );
        assert_eq!(st.node_types, vec![NodeType::Replication]);
        // Ours wins over CouchDB 3.x's name; an environment override wins over the file.
        cfg.set("replicator", "interval_sec", "4".into());
        cfg.apply_env([(
            "COUCH_REPLICATOR__REPLICATOR__STATS_UPDATE_INTERVAL_SEC".to_string(),
            "2".to_string(),
        )]);
        let st = read(&cfg).unwrap().settings;
        assert_eq!((st.interval, st.stats_update_interval), (secs(4), secs(2)));
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = |t: &str| section(&format!("[replicator]\n{t}\n")).unwrap_err();
        assert!(e("worker_processes = 100000").contains("worker_processes"));
        assert!(e("checkpoint_interval = soon").contains("checkpoint_interval"));
        assert!(e("use_checkpoints = yes").contains("use_checkpoints"));
        assert!(e("verify_ssl_certificates = 1").contains("verify_ssl_certificates"));
        assert!(e("interval = often").contains("interval"));
        assert!(e("ssl_certificate_max_depth = 1000").contains("ssl_certificate_max_depth"));
        assert!(e("valid_proxy_protocols = http, gopher").contains("gopher"));
        assert!(e("max_jobs = 0").contains("max_jobs"));
        assert!(e("interval = 0").contains("interval_sec must be greater than 0"));
        assert!(e("node_types = replication, gateway").contains("gateway"));
        let e = e("rate_limiter_max_interval_msec = 25001");
        assert!(
            e.contains("rate_limiter_max_interval_msec must be at most"),
            "{e}"
        );
    }
}
