//! How option values are read and bounded: the range of every numeric replication option
//! ([`LIMITS`]; a value outside it is refused with the option's name rather than spawning a
//! task storm or overflowing a buffer), CouchDB's `infinity`, and `socket_options` in
//! CouchDB's Erlang-term form or our JSON form.

use serde_json::Value;

use crate::replication::error::{ReplicationError, Result};

fn invalid(msg: impl Into<String>) -> ReplicationError {
    ReplicationError::InvalidOptions(msg.into())
}

/// Inclusive ranges of the numeric options, by their document (and `[replicator]`) names.
/// CouchDB itself has none; these are wide enough for any real deployment (CouchDB's advice
/// tops out far below them) and narrow enough that no value can exhaust the node.
pub const LIMITS: &[(&str, u64, u64)] = &[
    ("worker_processes", 1, 256),
    ("worker_batch_size", 1, 50_000),
    ("http_connections", 1, 1_000),
    ("connection_timeout", 1, 86_400_000),
    ("retries_per_request", 0, 1_000),
    ("checkpoint_interval", 100, 86_400_000),
    ("request_timeout", 1, 86_400_000),
    ("max_document_id_length", 1, 10_000_000),
    ("missing_doc_retry_msec", 0, 3_600_000),
    ("ssl_certificate_max_depth", 0, 100),
    ("session_refresh_interval_sec", 1, 31_536_000),
];

/// The range of a numeric option.
pub fn limit(name: &str) -> (u64, u64) {
    LIMITS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map_or((0, u64::MAX), |(_, lo, hi)| (*lo, *hi))
}

/// Checks one numeric value (a JSON number or, as CouchDB accepts, a numeric string) against
/// the option's range; the error names the option and the range.
pub fn ranged(k: &str, v: &Value) -> Result<u64> {
    let (lo, hi) = limit(k);
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(invalid(format!(
            "`{k}` must be an integer from {lo} to {hi}"
        ))),
    }
}

/// `infinity` (as CouchDB writes it) or a number within the option's range.
pub(crate) fn infinity_or(v: &Value, k: &str) -> Result<Option<u64>> {
    match v {
        Value::String(s) if s.trim() == "infinity" => Ok(None),
        v => ranged(k, v).map(Some),
    }
}

/// `nodelay` from `socket_options`: CouchDB's Erlang-term string
/// (`[{keepalive, true}, {nodelay, false}]`, options outside its valid list dropped, as
/// CouchDB does) or our JSON object form (unknown keys refused). `None` when not set.
pub(crate) fn socket_nodelay(v: &Value) -> Result<Option<bool>> {
    const VALID: [&str; 6] = [
        "buffer",
        "keepalive",
        "nodelay",
        "priority",
        "recbuf",
        "sndbuf",
    ];
    match v {
        Value::Object(o) => {
            let mut nodelay = None;
            for (k, v) in o {
                match k.as_str() {
                    "nodelay" => nodelay = Some(v.as_bool().unwrap_or(false)),
                    k if VALID.contains(&k) => {}
                    _ => return Err(invalid(format!("socket option `{k}` is not allowed"))),
                }
            }
            Ok(nodelay)
        }
        Value::String(s) => {
            let body = s.trim();
            let body = body
                .strip_prefix('[')
                .and_then(|b| b.strip_suffix(']'))
                .ok_or_else(|| {
                    invalid("`socket_options` must be a list such as [{nodelay, true}]")
                })?;
            let mut nodelay = None;
            for tuple in body.split('}') {
                let t = tuple.trim().trim_start_matches(',').trim();
                if t.is_empty() {
                    continue;
                }
                let (k, val) = t
                    .strip_prefix('{')
                    .and_then(|t| t.split_once(','))
                    .ok_or_else(|| {
                        invalid("`socket_options` must be a list such as [{nodelay, true}]")
                    })?;
                if k.trim() == "nodelay" {
                    nodelay = Some(val.trim() == "true");
                }
            }
            Ok(nodelay)
        }
        _ => Err(invalid("`socket_options` must be an object or a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_range_is_enforced_and_named() {
        for (name, lo, hi) in LIMITS {
            assert_eq!(ranged(name, &json!(*hi)).unwrap(), *hi);
            assert_eq!(ranged(name, &json!(lo.to_string())).unwrap(), *lo);
            for bad in [
                json!(hi + 1),
                json!(u64::MAX),
                json!(-1),
                json!(1.5),
                json!("x"),
            ] {
                let e = ranged(name, &bad).unwrap_err().to_string();
                assert!(e.contains(name) && e.contains(&hi.to_string()), "{e}");
            }
            if *lo > 0 {
                assert!(ranged(name, &json!(lo - 1)).is_err(), "{name}");
            }
        }
        assert_eq!(
            infinity_or(&json!("infinity"), "request_timeout").unwrap(),
            None
        );
    }

    #[test]
    fn socket_options_in_couchdb_term_form() {
        let nd = |s: &str| socket_nodelay(&json!(s));
        assert_eq!(
            nd("[{keepalive, true}, {nodelay, false}]").unwrap(),
            Some(false)
        );
        assert_eq!(nd("[{nodelay,true},{sndbuf,4096}]").unwrap(), Some(true));
        // Options outside CouchDB's list are dropped, as CouchDB does.
        assert_eq!(nd("[{reuseaddr, true}]").unwrap(), None);
        assert_eq!(nd("[]").unwrap(), None);
        assert!(
            nd("nodelay")
                .unwrap_err()
                .to_string()
                .contains("socket_options")
        );
        assert!(socket_nodelay(&json!(3)).is_err());
    }
}
