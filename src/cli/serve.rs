//! `couch-replicator serve`: runs one replicator node with CouchDB's HTTP API. The job store
//! is the embedded engine under `--data-dir`, an etcd cluster with `--etcd-endpoints`, or
//! FoundationDB with `--fdb-cluster-file` when built with `fdb` ([`super::serve_store`]); settings come from a config file ([`super::config_file`]), environment
//! overrides, then command-line flags, in that order of increasing precedence. Prints
//! `listening on http://ADDR` once the API accepts connections, then `listening on
//! https://ADDR` when `[ssl]` turns HTTPS on ([`super::ssl_section`]); stops gracefully on
//! Ctrl-C or SIGTERM (running jobs checkpoint and go back to pending).
//!
//! The HTTP API (with `/_steps`) and the `_replicator` doc processor are the last children of
//! the node's tree, run only by `api_frontend` nodes (the HTTP child, its listeners and their
//! ports kept across restarts, is [`super::serve_http`]); `[steps] workers` starts steps
//! workers ([`super::serve_steps`]). Each config section is read by its own module
//! (`[chttpd_auth]` by [`super::chttpd_auth_section`], ...). The server uuid (part of every
//! replication id) is kept in the data directory; nodes sharing one etcd or FoundationDB
//! cluster must set the same `[couchdb] uuid` (checked at start against the uuid recorded in
//! the store).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::http::{HttpConfig, auth::Users};
use crate::replicator::replicator_db::doc_processor::{DocProcessorConfig, ReplicatorDb};
use crate::replicator::{Frontend, NodeType, Replicator, ReplicatorConfig};
use crate::store::Db;

use crate::http::connection_limit::DEFAULT_PER_CLIENT;
use crate::http::couchdb_auth::CouchDbAuth;
use crate::replication::http::tls::TlsOptions;

use super::chttpd_auth_section;
use super::config_file::ConfigFile;
use super::couchdb_auth_section;
use super::lockout_section;
use super::prometheus_section;
use super::replicator_section;
use super::serve_http::{Bound, Listeners, http_service};
use super::serve_steps::{STEPS_KEYS, StepsSetup};
use super::serve_store::{self, EtcdArgs};
use super::ssl_section::{self, Https};

/// `serve` flags.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Directory of the embedded job store (created if missing).
    #[arg(long, env = "COUCH_REPLICATOR_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// Use FoundationDB through this cluster file instead of the embedded store.
    #[cfg(feature = "fdb")]
    #[arg(long, env = "FDB_CLUSTER_FILE")]
    pub fdb_cluster_file: Option<PathBuf>,
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Config files (CouchDB ini, or flat TOML) with [replicator], [admins], [chttpd], ...;
    /// repeatable, later files win, a directory stands for its *.ini files (CouchDB's
    /// `default.ini` then `local.ini` load unchanged).
    #[arg(
        long,
        short = 'c',
        env = "COUCH_REPLICATOR_CONFIG",
        value_delimiter = ','
    )]
    pub config: Vec<PathBuf>,
    /// What this node runs: api_frontend, replication, or both (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub node_type: Option<Vec<String>>,
    /// HTTP port (0 = any free port); default [chttpd] port or 5984.
    #[arg(long, short = 'p')]
    pub port: Option<u16>,
    /// Address to bind; default [chttpd] bind_address or 127.0.0.1.
    #[arg(long)]
    pub bind: Option<String>,
    /// A server admin `name:password` (repeatable); adds to [admins].
    #[arg(
        long = "admin",
        env = "COUCH_REPLICATOR_ADMINS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub admins: Vec<String>,
    /// A `_replicator` database URL to follow (repeatable); adds to [replicator_dbs].
    #[arg(long = "replicator-db")]
    pub replicator_dbs: Vec<String>,
    /// This node's name in the cluster; default [couchdb] node_name or node1@127.0.0.1.
    #[arg(long)]
    pub node: Option<String>,
    /// A CouchDB whose `_users` (and admins) may call this node; sets [auth_couchdb] url.
    #[arg(long, value_name = "URL")]
    pub auth_couchdb: Option<String>,
}

/// Everything `serve` needs, resolved from file, environment and flags.
#[derive(Debug)]
pub struct NodeSetup {
    pub replicator: ReplicatorConfig,
    pub http: HttpConfig,
    pub addr: SocketAddr,
    /// The HTTPS listener beside the plain one, when `[ssl]` turns it on.
    pub https: Option<Https>,
    pub dbs: Vec<ReplicatorDb>,
    /// What to tell the operator once at start: keys not applied, sections not used.
    pub notes: Vec<String>,
    /// TLS to `https` endpoints and replicator databases.
    pub tls: TlsOptions,
    /// Where the metrics are served on their own (`[prometheus] additional_port`).
    pub prometheus: Option<SocketAddr>,
    /// `[chttpd] max_connections_per_client`.
    pub per_client: usize,
}

fn pairs(v: &[(String, String)]) -> Vec<(String, String)> {
    v.to_vec()
}

/// Reads the config file and environment and applies the flags.
pub fn load(
    args: &ServeArgs,
    env: Vec<(String, String)>,
) -> Result<(ConfigFile, Vec<(String, String)>), String> {
    let mut cfg = ConfigFile::load(&args.config).map_err(|e| e.to_string())?;
    cfg.apply_env(env);
    if let Some(types) = &args.node_type {
        cfg.set("replicator", "node_types", types.join(","));
    }
    if let Some(p) = args.port {
        cfg.set("chttpd", "port", p.to_string());
    }
    if let Some(b) = &args.bind {
        cfg.set("chttpd", "bind_address", b.clone());
    }
    if let Some(n) = &args.node {
        cfg.set("couchdb", "node_name", n.clone());
    }
    if let Some(u) = &args.auth_couchdb {
        cfg.set(couchdb_auth_section::SECTION, "url", u.clone());
    }
    args.etcd.apply(&mut cfg);
    let mut admins = pairs(cfg.section("admins"));
    for a in &args.admins {
        let (n, p) = a
            .split_once(':')
            .ok_or_else(|| "--admin takes name:password".to_string())?;
        admins.push((n.to_owned(), p.to_owned()));
    }
    Ok((cfg, admins))
}

/// Turns the configuration into the node's parts.
pub fn setup(
    args: &ServeArgs,
    cfg: &ConfigFile,
    admins: Vec<(String, String)>,
    db: Db,
    server_uuid: String,
) -> Result<NodeSetup, String> {
    let section = replicator_section::read(cfg)?;
    let mut notes = section.notes;
    notes.extend(cfg.unused(is_used));
    let tls = section.settings.job_defaults.tls.clone();
    let mut replicator = ReplicatorConfig::new(db);
    replicator.settings = section.settings;
    replicator.server_uuid = cfg
        .get("couchdb", "uuid")
        .map_or(server_uuid, str::to_owned);
    if let Some(n) = cfg.get("couchdb", "node_name") {
        replicator.node = n.into();
    }
    let port: u16 = cfg
        .get("chttpd", "port")
        .unwrap_or("5984")
        .parse()
        .map_err(|_| "[chttpd] port must be a port number".to_string())?;
    let bind = cfg.get("chttpd", "bind_address").unwrap_or("127.0.0.1");
    let addr: SocketAddr = format!("{bind}:{port}")
        .parse()
        .map_err(|_| format!("[chttpd] bind_address `{bind}` is not an IP address"))?;
    let https = ssl_section::read(cfg, addr.ip())?;
    let dbs = replicator_dbs(args, cfg)?;
    let mut users = Users::configure(
        admins,
        pairs(cfg.section("users")),
        &chttpd_auth_section::read(cfg)?,
    )?;
    if let Some(s) = couchdb_auth_section::read(cfg)? {
        users = users.with_couchdb(Arc::new(CouchDbAuth::new(s)?));
    }
    let mut http = HttpConfig {
        users,
        replicator_dbs: dbs.iter().map(|d| d.name.clone()).collect(),
        user_limits: super::user_limits_section::read(cfg)?,
        ..HttpConfig::default()
    };
    if let Some(v) = cfg.get("chttpd", "max_http_request_size") {
        http.max_body_bytes = v
            .parse()
            .map_err(|_| "[chttpd] max_http_request_size must be a byte count".to_string())?;
    }
    Ok(NodeSetup {
        replicator,
        http,
        addr,
        https,
        dbs,
        notes,
        tls,
        prometheus: prometheus_section::read(cfg)?,
        per_client: per_client(cfg)?,
    })
}

/// The `_replicator` databases to follow: `[replicator_dbs]` (name = URL), then each
/// `--replicator-db` URL (named after its path). Each name must end with `_replicator` and be
/// unique.
fn replicator_dbs(args: &ServeArgs, cfg: &ConfigFile) -> Result<Vec<ReplicatorDb>, String> {
    let mut dbs = Vec::new();
    for (name, url) in cfg.section("replicator_dbs") {
        dbs.push(ReplicatorDb {
            name: name.clone(),
            url: url.clone(),
        });
    }
    for url in &args.replicator_dbs {
        dbs.push(ReplicatorDb::from_url(url).map_err(|e| e.to_string())?);
    }
    for d in &dbs {
        if !d.name.ends_with("_replicator") {
            return Err(format!(
                "replicator database `{}`: the name must end with `_replicator`",
                d.name
            ));
        }
        if dbs.iter().filter(|o| o.name == d.name).count() > 1 {
            return Err(format!(
                "two replicator databases are named `{}`: name them in [replicator_dbs] (name = URL)",
                d.name
            ));
        }
    }
    Ok(dbs)
}

/// `[chttpd] max_connections_per_client` (ours): connections one client address may hold.
fn per_client(cfg: &ConfigFile) -> Result<usize, String> {
    match cfg.get("chttpd", "max_connections_per_client") {
        None => Ok(DEFAULT_PER_CLIENT),
        Some(v) => v.trim().parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
            format!("[chttpd] max_connections_per_client must be a whole number of at least 1, not `{v}`")
        }),
    }
}

/// Whether this node reads `[section] key` (an empty key asks about the whole section).
fn is_used(section: &str, key: &str) -> bool {
    match section {
        "admins" | "users" | "replicator_dbs" => true,
        "replicator" => replicator_section::is_known(key),
        // Database names: every key is a fair-share weight.
        "replicator.shares" => true,
        "chttpd" => matches!(
            key,
            "port" | "bind_address" | "max_http_request_size" | "max_connections_per_client"
        ),
        "couchdb" => matches!(key, "uuid" | "node_name"),
        "ssl" => ssl_section::SSL_KEYS.contains(&key),
        "daemons" => key == "httpsd",
        s if chttpd_auth_section::SECTIONS.contains(&s) => chttpd_auth_section::KEYS.contains(&key),
        "steps" => STEPS_KEYS.contains(&key),
        serve_store::SECTION => serve_store::KEYS.contains(&key),
        couchdb_auth_section::SECTION => couchdb_auth_section::KEYS.contains(&key),
        lockout_section::SECTION => lockout_section::KEYS.contains(&key),
        prometheus_section::SECTION => prometheus_section::KEYS.contains(&key),
        _ => false,
    }
}

/// Runs the node until Ctrl-C / SIGTERM. The HTTP API and the doc processor are children
/// of the node's tree (on `api_frontend` nodes only); `serve` waits for the signal, then
/// shuts the tree down (jobs checkpoint) and stops the steps workers.
pub async fn run(args: ServeArgs) -> Result<(), String> {
    let (cfg, admins) = load(&args, std::env::vars().collect())?;
    let (db, shared_store) = serve_store::open(&args, &cfg).await?;
    let uuid = serve_store::server_uuid(&args.data_dir)?;
    let setup = setup(&args, &cfg, admins, db.clone(), uuid)?;
    if shared_store {
        serve_store::check_uuid(&db, &setup.replicator.server_uuid).await?;
    }
    let steps_setup = StepsSetup::from_config(&cfg, setup.replicator.node.as_str())?;
    log_setup(&setup);
    let frontend = setup.replicator.settings.runs(NodeType::ApiFrontend);
    let (addr_tx, mut addr_rx) = tokio::sync::watch::channel(None);
    let http = http_service(
        Listeners {
            http: setup.addr,
            https: setup.https,
            prometheus: setup.prometheus,
            per_client: setup.per_client,
        },
        setup.http,
        steps_setup.clone(),
        Arc::new(addr_tx),
    );
    let parts = Frontend {
        doc_processor: Some(DocProcessorConfig {
            dbs: setup.dbs,
            tls: setup.tls,
            ..DocProcessorConfig::default()
        }),
        http: Some(http),
    };
    let replicator = Replicator::start_with(setup.replicator, parts)
        .await
        .map_err(|e| e.to_string())?;
    let steps = steps_setup.steps(replicator.jobs().clone())?;
    let workers = steps_setup.start_workers(steps).await?;
    match announce(frontend, &mut addr_rx, &replicator).await {
        Ok(true) => {}
        stop => {
            replicator.shutdown().await;
            return stop.map(|_| ());
        }
    }
    shutdown_signal().await;
    replicator.shutdown().await;
    if let Some(w) = workers {
        w.stop(Duration::from_secs(5)).await;
    }
    // The FDB client's network thread must stop before the process exits.
    #[cfg(feature = "fdb")]
    crate::store::fdb::stop_network();
    Ok(())
}

/// Logs what the configuration decided (and warns when no admin can change state).
fn log_setup(setup: &NodeSetup) {
    for note in &setup.notes {
        tracing::info!("config: {note}");
    }
    if setup.http.users.has_no_admins() {
        tracing::warn!(
            "no server admin configured (--admin name:password, [admins] or [auth_couchdb] url): requests that change state need one"
        );
    }
    if let Some(c) = setup.http.users.couchdb() {
        tracing::info!(couchdb = %c.url(), "callers not in [admins]/[users] are checked by this CouchDB");
    }
}

/// Waits until the HTTP API listens (on frontend nodes) and says where; false when the
/// signal to stop came first; an error when a listener failed to bind.
async fn announce(
    frontend: bool,
    addr_rx: &mut tokio::sync::watch::Receiver<Option<Result<Bound, String>>>,
    replicator: &Replicator,
) -> Result<bool, String> {
    if !frontend {
        println!("running without HTTP API (node types: replication)");
        tracing::info!(node = %replicator.node(), "replicator node running");
        return Ok(true);
    }
    let wait = addr_rx.wait_for(Option::is_some);
    let local = tokio::select! {
        r = wait => r.map_err(|e| e.to_string())?.clone(),
        _ = shutdown_signal() => None,
    };
    match local {
        Some(Ok(local)) => {
            println!("listening on http://{}", local.http);
            if let Some(https) = local.https {
                println!("listening on https://{https}");
            }
            tracing::info!(node = %replicator.node(), local = %local.http, https = ?local.https, "replicator node running");
            Ok(true)
        }
        Some(Err(e)) => Err(e),
        // The signal came before the API was up.
        None => Ok(false),
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args(extra: &[&str]) -> ServeArgs {
        let mut v = vec!["serve"];
        v.extend_from_slice(extra);
        Cmd::parse_from(v).serve
    }

    fn db() -> Db {
        Db::new(Arc::new(MemoryStore::new()))
    }

    #[test]
    fn flags_beat_env_beat_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("n.ini");
        std::fs::write(
            &file,
            "[replicator]\nmax_jobs = 7\n[chttpd]\nport = 6001\n[admins]\nroot = r00t\n\
             [replicator_dbs]\nmine_replicator = http://127.0.0.1:1/x\n[couchdb]\nuuid = u1\n",
        )
        .unwrap();
        let a = args(&[
            "--config",
            file.to_str().unwrap(),
            "--port",
            "6003",
            "--node-type",
            "replication",
            "--admin",
            "cli:pw",
            "--replicator-db",
            "http://u:p@127.0.0.1:2/a%2F_replicator",
        ]);
        let env = vec![
            ("COUCH_REPLICATOR__CHTTPD__PORT".into(), "6002".into()),
            ("COUCH_REPLICATOR__REPLICATOR__MAX_JOBS".into(), "9".into()),
        ];
        let (cfg, admins) = load(&a, env).unwrap();
        let s = setup(&a, &cfg, admins, db(), "gen".into()).unwrap();
        assert_eq!(s.addr.port(), 6003);
        assert_eq!(s.replicator.settings.max_jobs, 9);
        assert_eq!(
            s.replicator.settings.node_types,
            vec![NodeType::Replication]
        );
        assert_eq!(s.replicator.server_uuid, "u1");
        let names: Vec<&str> = s.dbs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, vec!["mine_replicator", "a/_replicator"]);
        assert_eq!(s.http.replicator_dbs, names);
        assert!(!s.http.users.has_no_admins());
        assert!(!format!("{:?}", s.http.users).contains("r00t"));
        assert!(s.http.users.couchdb().is_none());
    }

    #[test]
    fn auth_couchdb_from_flag_or_file() {
        let a = args(&["--auth-couchdb", "http://127.0.0.1:5984"]);
        let (cfg, admins) = load(&a, Vec::new()).unwrap();
        let s = setup(&a, &cfg, admins, db(), "u".into()).unwrap();
        let c = s.http.users.couchdb().unwrap();
        assert_eq!(c.url(), "http://127.0.0.1:5984");
        // CouchDB vouches for admins, so no warning about having none.
        assert!(!s.http.users.has_no_admins());
        assert!(
            s.notes.iter().all(|n| !n.contains("auth_couchdb")),
            "{:?}",
            s.notes
        );
        let a = args(&[]);
        let env = vec![(
            "COUCH_REPLICATOR__AUTH_COUCHDB__URL".to_string(),
            "http://u:secret@127.0.0.1:5984".to_string(),
        )];
        let (cfg, admins) = load(&a, env).unwrap();
        let e = setup(&a, &cfg, admins, db(), "u".into()).unwrap_err();
        assert!(e.contains("credentials") && !e.contains("secret"), "{e}");
    }

    #[test]
    fn ssl_keys_are_read_and_erlang_only_ones_noted() {
        let a = args(&[]);
        let mut cfg = ConfigFile::parse(
            "[ssl]\nport = 7000\ncert_file = c.pem\nsecure_renegotiate = true\n\
             [daemons]\nhttpsd = x\n",
        )
        .unwrap();
        cfg.apply_env(Vec::new());
        let s = setup(&a, &cfg, Vec::new(), db(), "u".into()).unwrap();
        assert!(s.https.is_none(), "HTTPS is off without enable = true");
        let ssl: Vec<_> = s.notes.iter().filter(|n| n.starts_with("[ssl]")).collect();
        assert_eq!(
            ssl,
            ["[ssl] keys not used by this node: secure_renegotiate"]
        );
        assert!(
            !s.notes.iter().any(|n| n.contains("daemons")),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn bad_settings_are_reported() {
        let bad = |extra: &[&str], text: &str| {
            let a = args(extra);
            let mut cfg = ConfigFile::parse(text).unwrap();
            cfg.apply_env(Vec::new());
            setup(&a, &cfg, Vec::new(), db(), "u".into()).unwrap_err()
        };
        assert!(bad(&[], "[replicator]\nmax_jobs = 0").contains("max_jobs"));
        assert!(bad(&[], "[chttpd]\nport = http").contains("port"));
        assert!(bad(&[], "[chttpd]\nbind_address = localhost").contains("bind_address"));
        assert!(bad(&[], "[replicator_dbs]\nplain = http://127.0.0.1:1/x").contains("_replicator"));
        assert!(
            bad(
                &[
                    "--replicator-db",
                    "http://127.0.0.1:1/_replicator",
                    "--replicator-db",
                    "http://127.0.0.1:2/_replicator"
                ],
                ""
            )
            .contains("two replicator databases")
        );
        let a = args(&["--admin", "nocolon"]);
        assert!(load(&a, Vec::new()).unwrap_err().contains("name:password"));
    }
}
