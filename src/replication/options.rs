//! Per-replication options (digest D.9) with CouchDB's names and defaults, parsed from the JSON
//! a `_replicator` document or a `POST /_replicate` body carries, with clear validation errors.
//! [`ReplicationSpec`] bundles source, target and options.

use std::time::Duration;

use serde_json::{Map, Value};

use super::endpoint::Endpoint;
use super::error::{ReplicationError, Result};

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

    /// Parses a `_replicator` document or `POST /_replicate` body.
    pub fn from_json(doc: &Value) -> Result<Self> {
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
        Ok(Self {
            source,
            target,
            options: ReplicationOptions::from_json(m)?,
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

fn get_int(m: &Map<String, Value>, k: &str, default: u64, min: u64) -> Result<u64> {
    let v = match m.get(k) {
        None | Some(Value::Null) => return Ok(default),
        Some(Value::Number(n)) => n.as_u64(),
        // CouchDB's config values are strings; accept numeric strings too.
        Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
        Some(_) => None,
    };
    match v {
        Some(v) if v >= min => Ok(v),
        _ => Err(invalid(format!("`{k}` must be an integer >= {min}"))),
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
    /// Parses options from the fields of a replication document (unknown fields are ignored,
    /// as CouchDB ignores `_id`, `_rev`, `owner`, `_replication_*` and user fields).
    pub fn from_json(m: &Map<String, Value>) -> Result<Self> {
        let d = Self::default();
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
                super::selector::normalize(v).map_err(|e| invalid(e.to_string()))?;
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
        let filter = match (doc_ids, selector, filter_name) {
            (Some(_), Some(_), _) | (_, Some(_), Some(_)) => {
                return Err(invalid(
                    "`selector` cannot be combined with `doc_ids` or `filter`",
                ));
            }
            (Some(_), None, Some(_)) => {
                return Err(invalid("`doc_ids` cannot be combined with `filter`"));
            }
            (Some(ids), None, None) => Filter::DocIds(ids),
            (None, Some(s), None) => Filter::Selector(s),
            (None, None, Some(name)) => {
                if !name.starts_with('_') && !name.contains('/') {
                    return Err(invalid(
                        "`filter` must be `ddoc/name` or a built-in `_name`",
                    ));
                }
                Filter::Named {
                    name: name.to_owned(),
                    query_params,
                }
            }
            (None, None, None) => Filter::None,
        };
        if m.contains_key("proxy")
            && (m.contains_key("source_proxy") || m.contains_key("target_proxy"))
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
                    let ok = ["http://", "https://", "socks5://"]
                        .iter()
                        .any(|s| p.starts_with(s));
                    if ok {
                        Ok(Some(p.to_owned()))
                    } else {
                        Err(invalid("proxy must be http, https or socks5"))
                    }
                }
            }
        };
        let source_proxy = check_proxy(get_str(m, "source_proxy")?.or(proxy.as_deref()))?;
        let target_proxy = check_proxy(get_str(m, "target_proxy")?.or(proxy.as_deref()))?;
        let mut tcp_nodelay = d.tcp_nodelay;
        if let Some(so) = m.get("socket_options") {
            match so {
                Value::Object(o) => {
                    for (k, v) in o {
                        match k.as_str() {
                            "nodelay" => tcp_nodelay = v.as_bool().unwrap_or(false),
                            "keepalive" | "buffer" | "priority" | "recbuf" | "sndbuf" => {}
                            _ => {
                                return Err(invalid(format!("socket option `{k}` is not allowed")));
                            }
                        }
                    }
                }
                Value::Null => {}
                _ => return Err(invalid("`socket_options` must be an object")),
            }
        }
        let request_timeout = match m.get("request_timeout") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "infinity" => None,
            Some(_) => Some(Duration::from_millis(get_int(m, "request_timeout", 0, 1)?)),
        };
        let max_document_id_length = match m.get("max_document_id_length") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "infinity" => None,
            Some(_) => Some(get_int(m, "max_document_id_length", 0, 1)? as usize),
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
        let ms = |k: &str, def: Duration, min: u64| -> Result<Duration> {
            Ok(Duration::from_millis(get_int(
                m,
                k,
                def.as_millis() as u64,
                min,
            )?))
        };
        Ok(Self {
            continuous: get_bool(m, "continuous", d.continuous)?,
            create_target: get_bool(m, "create_target", d.create_target)?,
            create_target_params,
            filter,
            since_seq,
            winning_revs_only: get_bool(m, "winning_revs_only", false)?,
            worker_processes: get_int(m, "worker_processes", 4, 1)? as usize,
            worker_batch_size: get_int(m, "worker_batch_size", 500, 1)? as usize,
            http_connections: get_int(m, "http_connections", 20, 1)? as usize,
            connection_timeout: ms("connection_timeout", d.connection_timeout, 1)?,
            retries_per_request: get_int(m, "retries_per_request", 5, 0)? as u32,
            checkpoint_interval: ms("checkpoint_interval", d.checkpoint_interval, 1)?,
            use_checkpoints: get_bool(m, "use_checkpoints", true)?,
            use_bulk_get: get_bool(m, "use_bulk_get", true)?,
            request_timeout,
            max_document_id_length,
            missing_doc_retry: ms("missing_doc_retry_msec", d.missing_doc_retry, 0)?,
            source_proxy,
            target_proxy,
            tcp_nodelay,
            cancel: get_bool(m, "cancel", false)?,
        })
    }
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
}
