//! Per-replication options with CouchDB's names and defaults, parsed from the JSON a
//! `_replicator` document or a `POST /_replicate` body carries, over the node's per-job
//! defaults (its `[replicator]` section), with clear validation errors. Every number has a
//! range ([`super::values::LIMITS`]). [`ReplicationSpec`] bundles source, target and
//! options.

use std::time::Duration;

use serde_json::{Map, Value};

use super::values::{infinity_or, ranged, socket_nodelay};
use crate::replication::endpoint::database::Endpoint;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::auth::AuthPolicy;
use crate::replication::http::limits::EndpointLimits;
use crate::replication::http::tls::TlsOptions;

/// Which changes to replicate.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// Every change.
    None,
    /// `doc_ids`: these documents only (sorted, unique).
    DocIds(Vec<String>),
    /// `selector`: a Mango selector evaluated by the source.
    Selector(Value),
    /// `filter`: a named filter (`ddoc/name` or a built-in `_name`) with its `query_params`.
    Named {
        /// `ddoc/name` or `_view` etc.
        name: String,
        /// Query parameters passed to the filter (an object).
        query_params: Map<String, Value>,
    },
}

/// All per-replication options. Durations keep CouchDB's millisecond semantics.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicationOptions {
    /// Follow the feed forever.
    pub continuous: bool,
    /// Create the target database first.
    pub create_target: bool,
    /// Query parameters for the target `PUT` when creating it.
    pub create_target_params: Map<String, Value>,
    /// Changes filter.
    pub filter: Filter,
    /// Start sequence overriding checkpoints (3.x semantics).
    pub since_seq: Option<Value>,
    /// Replicate only winning revisions.
    pub winning_revs_only: bool,
    /// Parallel workers per replication.
    pub worker_processes: usize,
    /// Changes per worker batch.
    pub worker_batch_size: usize,
    /// Concurrent connections per endpoint.
    pub http_connections: usize,
    /// Inactivity timeout of a request.
    pub connection_timeout: Duration,
    /// Retries of a failed request.
    pub retries_per_request: u32,
    /// Period between checkpoints.
    pub checkpoint_interval: Duration,
    /// Write and read `_local` checkpoints.
    pub use_checkpoints: bool,
    /// Use `_bulk_get` before individual fetches.
    pub use_bulk_get: bool,
    /// Overall request timeout (`None` = infinity).
    pub request_timeout: Option<Duration>,
    /// Skip (and count as failures) document ids longer than this.
    pub max_document_id_length: Option<usize>,
    /// Wait before retrying a revision reported missing.
    pub missing_doc_retry: Duration,
    /// Proxy for both endpoints.
    pub source_proxy: Option<String>,
    /// Proxy for the target.
    pub target_proxy: Option<String>,
    /// TCP_NODELAY from `socket_options`.
    pub tcp_nodelay: bool,
    /// The request asked to cancel a running replication.
    pub cancel: bool,
    /// TLS to `https` endpoints (node configuration only: CouchDB has no per-replication
    /// TLS options).
    pub tls: TlsOptions,
    /// Endpoint URL schemes allowed (`valid_endpoint_protocols`, node configuration only).
    pub endpoint_protocols: Vec<String>,
    /// Proxy URL schemes allowed (`valid_proxy_protocols`, node configuration only).
    pub proxy_protocols: Vec<String>,
    /// How endpoints authenticate (`auth_plugins`, node configuration only).
    pub auth: AuthPolicy,
    /// What endpoints may send (node configuration only: a document cannot raise it).
    pub limits: EndpointLimits,
}

impl Default for ReplicationOptions {
    fn default() -> Self {
        Self {
            continuous: false,
            create_target: false,
            create_target_params: Map::new(),
            filter: Filter::None,
            since_seq: None,
            winning_revs_only: false,
            worker_processes: 4,
            worker_batch_size: 500,
            http_connections: 20,
            connection_timeout: Duration::from_millis(30_000),
            retries_per_request: 5,
            checkpoint_interval: Duration::from_millis(30_000),
            use_checkpoints: true,
            use_bulk_get: true,
            request_timeout: None,
            max_document_id_length: None,
            missing_doc_retry: Duration::from_millis(2000),
            source_proxy: None,
            target_proxy: None,
            tcp_nodelay: false,
            cancel: false,
            tls: TlsOptions::default(),
            endpoint_protocols: vec!["http".into(), "https".into()],
            proxy_protocols: vec!["http".into(), "https".into(), "socks5".into()],
            auth: AuthPolicy::default(),
            limits: EndpointLimits::default(),
        }
    }
}

/// Source, target and options of one replication.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicationSpec {
    /// Where documents come from.
    pub source: Endpoint,
    /// Where documents go.
    pub target: Endpoint,
    /// Options.
    pub options: ReplicationOptions,
}

impl ReplicationSpec {
    /// A spec with default options.
    pub fn new(source: Endpoint, target: Endpoint) -> Self {
        Self {
            source,
            target,
            options: ReplicationOptions::default(),
        }
    }

    /// Parses a `_replicator` document or `POST /_replicate` body over CouchDB's defaults.
    pub fn from_json(doc: &Value) -> Result<Self> {
        Self::from_json_with(doc, &ReplicationOptions::default())
    }

    /// Parses a document over the node's per-job defaults `base`.
    pub fn from_json_with(doc: &Value, base: &ReplicationOptions) -> Result<Self> {
        let m = doc
            .as_object()
            .ok_or_else(|| invalid("the replication document must be a JSON object"))?;
        let source = Endpoint::from_json(
            m.get("source")
                .ok_or_else(|| invalid("`source` is missing"))?,
        )?;
        let target = Endpoint::from_json(
            m.get("target")
                .ok_or_else(|| invalid("`target` is missing"))?,
        )?;
        for (name, ep) in [("source", &source), ("target", &target)] {
            let scheme = ep.parsed_url().scheme();
            if !base.endpoint_protocols.iter().any(|p| p == scheme) {
                return Err(invalid(format!(
                    "`{name}` uses {scheme}, which this node does not allow \
                     (valid_endpoint_protocols: {})",
                    base.endpoint_protocols.join(",")
                )));
            }
        }
        Ok(Self {
            source,
            target,
            options: ReplicationOptions::from_json_with(m, base)?,
        })
    }
}

/// A `doc_ids` entry as CouchDB reads it: `%XX` decoded, `+` as a space, other text kept.
fn unquote(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn invalid(msg: impl Into<String>) -> ReplicationError {
    ReplicationError::InvalidOptions(msg.into())
}

fn get_bool(m: &Map<String, Value>, k: &str, default: bool) -> Result<bool> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(format!("`{k}` must be a boolean"))),
    }
}

/// A numeric option within its [`LIMITS`] range, or `default` when absent.
fn get_int(m: &Map<String, Value>, k: &str, default: u64) -> Result<u64> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => ranged(k, v),
    }
}

fn get_str<'a>(m: &'a Map<String, Value>, k: &str) -> Result<Option<&'a str>> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(invalid(format!("`{k}` must be a string"))),
    }
}

impl ReplicationOptions {
    /// Parses options from the fields of a replication document over CouchDB's defaults.
    pub fn from_json(m: &Map<String, Value>) -> Result<Self> {
        Self::from_json_with(m, &Self::default())
    }

    /// Parses options from the fields of a replication document (unknown fields are ignored,
    /// as CouchDB ignores `_id`, `_rev`, `owner`, `_replication_*` and user fields); options
    /// the document does not set come from `base`, the node's per-job defaults.
    pub fn from_json_with(m: &Map<String, Value>, base: &ReplicationOptions) -> Result<Self> {
        let d = base;
        let filter = parse_filter(m)?;
        let (source_proxy, target_proxy) = parse_proxies(m, &d.proxy_protocols)?;
        let tcp_nodelay = match m.get("socket_options") {
            None | Some(Value::Null) => d.tcp_nodelay,
            Some(so) => socket_nodelay(so)?.unwrap_or(false),
        };
        let request_timeout = match m.get("request_timeout") {
            None | Some(Value::Null) => d.request_timeout,
            Some(v) => infinity_or(v, "request_timeout")?.map(Duration::from_millis),
        };
        let max_document_id_length = match m.get("max_document_id_length") {
            None | Some(Value::Null) => d.max_document_id_length,
            Some(v) => infinity_or(v, "max_document_id_length")?.map(|n| n as usize),
        };
        let create_target_params = match m.get("create_target_params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(o)) => o.clone(),
            Some(_) => return Err(invalid("`create_target_params` must be an object")),
        };
        let since_seq = match m.get("since_seq") {
            None | Some(Value::Null) => None,
            Some(v @ (Value::String(_) | Value::Number(_) | Value::Array(_))) => Some(v.clone()),
            Some(_) => return Err(invalid("`since_seq` must be a sequence (string or number)")),
        };
        let ms = |k: &str, def: Duration| -> Result<Duration> {
            Ok(Duration::from_millis(get_int(
                m,
                k,
                def.as_millis() as u64,
            )?))
        };
        let count = |k: &str, def: usize| -> Result<usize> {
            // Within LIMITS, so the conversion cannot truncate.
            Ok(get_int(m, k, def as u64)? as usize)
        };
        Ok(Self {
            continuous: get_bool(m, "continuous", d.continuous)?,
            create_target: get_bool(m, "create_target", d.create_target)?,
            create_target_params,
            filter,
            since_seq,
            winning_revs_only: get_bool(m, "winning_revs_only", false)?,
            worker_processes: count("worker_processes", d.worker_processes)?,
            worker_batch_size: count("worker_batch_size", d.worker_batch_size)?,
            http_connections: count("http_connections", d.http_connections)?,
            connection_timeout: ms("connection_timeout", d.connection_timeout)?,
            retries_per_request: get_int(
                m,
                "retries_per_request",
                u64::from(d.retries_per_request),
            )? as u32,
            checkpoint_interval: ms("checkpoint_interval", d.checkpoint_interval)?,
            use_checkpoints: get_bool(m, "use_checkpoints", d.use_checkpoints)?,
            use_bulk_get: get_bool(m, "use_bulk_get", d.use_bulk_get)?,
            request_timeout,
            max_document_id_length,
            missing_doc_retry: ms("missing_doc_retry_msec", d.missing_doc_retry)?,
            source_proxy,
            target_proxy,
            tcp_nodelay,
            cancel: get_bool(m, "cancel", false)?,
            tls: d.tls.clone(),
            endpoint_protocols: d.endpoint_protocols.clone(),
            proxy_protocols: d.proxy_protocols.clone(),
            auth: d.auth,
            limits: d.limits,
        })
    }
}

/// The one filter of a document: `doc_ids`, a Mango `selector`, a named `filter` with its
/// `query_params`, or none; combinations are refused as CouchDB refuses them.
fn parse_filter(m: &Map<String, Value>) -> Result<Filter> {
    let doc_ids = match m.get("doc_ids") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => {
            let mut ids = Vec::with_capacity(a.len());
            for v in a {
                // Percent-escapes are decoded (and `+` read as a space), as CouchDB does.
                ids.push(unquote(
                    v.as_str()
                        .ok_or_else(|| invalid("`doc_ids` must be strings"))?,
                ));
            }
            ids.sort();
            ids.dedup();
            Some(ids)
        }
        Some(_) => return Err(invalid("`doc_ids` must be an array of strings")),
    };
    let selector = match m.get("selector") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => {
            crate::replication::id::selector::normalize(v).map_err(|e| invalid(e.to_string()))?;
            Some(v.clone())
        }
        Some(_) => return Err(invalid("`selector` must be a JSON object")),
    };
    let filter_name = get_str(m, "filter")?.filter(|s| !s.is_empty());
    let query_params = match m.get("query_params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(q)) => q.clone(),
        Some(_) => return Err(invalid("`query_params` must be an object")),
    };
    match (doc_ids, selector, filter_name) {
        (Some(_), Some(_), _) | (_, Some(_), Some(_)) => Err(invalid(
            "`selector` cannot be combined with `doc_ids` or `filter`",
        )),
        (Some(_), None, Some(_)) => Err(invalid("`doc_ids` cannot be combined with `filter`")),
        (Some(ids), None, None) => Ok(Filter::DocIds(ids)),
        (None, Some(s), None) => Ok(Filter::Selector(s)),
        (None, None, Some(name)) => {
            if !name.starts_with('_') && !name.contains('/') {
                return Err(invalid(
                    "`filter` must be `ddoc/name` or a built-in `_name`",
                ));
            }
            Ok(Filter::Named {
                name: name.to_owned(),
                query_params,
            })
        }
        (None, None, None) => Ok(Filter::None),
    }
}

/// The source and target proxies (`proxy` for both, or one each), each checked against the
/// allowed proxy protocols.
fn parse_proxies(
    m: &Map<String, Value>,
    protocols: &[String],
) -> Result<(Option<String>, Option<String>)> {
    if m.contains_key("proxy") && (m.contains_key("source_proxy") || m.contains_key("target_proxy"))
    {
        return Err(invalid(
            "`proxy` cannot be combined with `source_proxy`/`target_proxy`",
        ));
    }
    let proxy = get_str(m, "proxy")?.map(str::to_owned);
    let check_proxy = |p: Option<&str>| -> Result<Option<String>> {
        match p {
            None | Some("") => Ok(None),
            Some(p) => {
                let scheme = p.split_once("://").map_or("", |(s, _)| s);
                if protocols.iter().any(|a| a == scheme) {
                    Ok(Some(p.to_owned()))
                } else {
                    Err(invalid(format!("proxy must be {}", protocols.join(", "))))
                }
            }
        }
    };
    let source = check_proxy(get_str(m, "source_proxy")?.or(proxy.as_deref()))?;
    let target = check_proxy(get_str(m, "target_proxy")?.or(proxy.as_deref()))?;
    Ok((source, target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_match_couchdb() {
        let o = ReplicationOptions::from_json(&Map::new()).unwrap();
        assert_eq!(o.worker_processes, 4);
        assert_eq!(o.worker_batch_size, 500);
        assert_eq!(o.http_connections, 20);
        assert_eq!(o.connection_timeout, Duration::from_secs(30));
        assert_eq!(o.retries_per_request, 5);
        assert_eq!(o.checkpoint_interval, Duration::from_secs(30));
        assert!(o.use_checkpoints && o.use_bulk_get);
    }

    #[test]
    fn parses_a_replicator_doc() {
        let doc = json!({"_id": "r", "source": "http://127.0.0.1:1/a", "target": {"url": "http://127.0.0.1:2/b"},
            "continuous": true, "doc_ids": ["b", "a", "b"], "worker_processes": "2"});
        let s = ReplicationSpec::from_json(&doc).unwrap();
        assert!(s.options.continuous);
        assert_eq!(
            s.options.filter,
            Filter::DocIds(vec!["a".into(), "b".into()])
        );
        assert_eq!(s.options.worker_processes, 2);
    }

    #[test]
    fn doc_ids_are_unquoted_as_couchdb_does() {
        // Known answers of CouchDB 3.4.3's couch_httpd:unquote/1.
        let got: Vec<String> = ["a+b", "a%2Fb", "a%zz", "%C3%A9", "a%2"]
            .iter()
            .map(|s| unquote(s))
            .collect();
        assert_eq!(got, ["a b", "a/b", "a%zz", "é", "a%2"]);
    }

    #[test]
    fn rejects_bad_values_clearly() {
        let bad = |v: Value| {
            ReplicationOptions::from_json(v.as_object().unwrap())
                .unwrap_err()
                .to_string()
        };
        assert!(bad(json!({"worker_processes": 0})).contains("worker_processes"));
        assert!(bad(json!({"continuous": "yes"})).contains("continuous"));
        assert!(bad(json!({"selector": {}, "doc_ids": ["a"]})).contains("selector"));
        assert!(bad(json!({"filter": "nofilter"})).contains("ddoc/name"));
        assert!(bad(json!({"socket_options": {"evil": 1}})).contains("evil"));
        assert!(bad(json!({"proxy": "http://p", "source_proxy": "http://q"})).contains("proxy"));
        assert!(ReplicationSpec::from_json(&json!({"source": "http://h/a"})).is_err());
    }

    #[test]
    fn numbers_out_of_range_are_refused_by_name() {
        for (name, lo, hi) in super::super::values::LIMITS {
            if matches!(
                *name,
                "ssl_certificate_max_depth" | "session_refresh_interval_sec"
            ) {
                continue; // node configuration only
            }
            let m = |v: Value| json!({ *name: v }).as_object().unwrap().clone();
            assert!(
                ReplicationOptions::from_json(&m(json!(*hi))).is_ok(),
                "{name}"
            );
            assert!(ReplicationOptions::from_json(&m(json!(lo.to_string()))).is_ok());
            assert!(
                ReplicationOptions::from_json(&m(json!(hi + 1))).is_err(),
                "{name}"
            );
        }
        let e = ReplicationOptions::from_json(
            json!({"worker_processes": 10_000_000}).as_object().unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`worker_processes` must be an integer from 1 to 256"),
            "{e}"
        );
        let o = ReplicationOptions::from_json(
            json!({"request_timeout": "infinity", "max_document_id_length": 100})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            (o.request_timeout, o.max_document_id_length),
            (None, Some(100))
        );
    }

    #[test]
    fn node_protocol_lists_are_enforced() {
        let base = ReplicationOptions {
            endpoint_protocols: vec!["https".into()],
            proxy_protocols: vec!["http".into()],
            ..ReplicationOptions::default()
        };
        let doc = json!({"source": "http://127.0.0.1:1/a", "target": "https://h/b"});
        let e = ReplicationSpec::from_json_with(&doc, &base)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`source` uses http") && e.contains("valid_endpoint_protocols"),
            "{e}"
        );
        let doc = json!({"source": "https://h/a", "target": "https://h/b",
            "proxy": "socks5://127.0.0.1:1"});
        let e = ReplicationSpec::from_json_with(&doc, &base)
            .unwrap_err()
            .to_string();
        assert!(e.contains("proxy must be http"), "{e}");
        assert!(ReplicationSpec::from_json(&doc).is_ok());
    }

    #[test]
    fn node_defaults_fill_what_the_document_leaves_out() {
        let base = ReplicationOptions {
            worker_processes: 8,
            use_bulk_get: false,
            checkpoint_interval: Duration::from_secs(5),
            tcp_nodelay: true,
            request_timeout: Some(Duration::from_secs(9)),
            ..ReplicationOptions::default()
        };
        let o = ReplicationOptions::from_json_with(
            json!({"worker_processes": 2}).as_object().unwrap(),
            &base,
        )
        .unwrap();
        assert_eq!(o.worker_processes, 2);
        assert!(!o.use_bulk_get && o.tcp_nodelay);
        assert_eq!(o.checkpoint_interval, Duration::from_secs(5));
        assert_eq!(o.request_timeout, Some(Duration::from_secs(9)));
    }
}
