//! Writing a final state back into a `_replicator` document, as CouchDB writes it:
//! `_replication_state` (`completed` or `failed`), `_replication_state_time`, and either
//! `_replication_stats` (CouchDB's nine counters and `start_time`, [`DocStats`]) or
//! `_replication_state_reason`; `owner` is stamped when missing. Conflicts are retried; a
//! document that is gone or already final is left alone. A document with `"verify": true`
//! (or `{"deep": true}`) gets the target's verification report as `_replication_stats.verify`.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Map, Value, json};

use crate::backoff::Backoff;
use crate::replication::endpoint::database::encode_doc_id;
use crate::replication::http::client::{HttpClient, Req};
use crate::replication::pipeline::stats::CouchStats;
use crate::replication::{ReplicationError, ReplicationStats};

use crate::replicator::job::view::iso8601;
use crate::replicator::server_job::spec::{ALL_DBS_FIELD, ServerJobView, ServerState};

/// The `_replication_stats` CouchDB writes into a completed document: its counters and the
/// job's start.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DocStats {
    /// The counters.
    #[serde(flatten)]
    pub counters: CouchStats,
    /// ISO 8601 start of the job.
    pub start_time: String,
    /// Ours: the target's verification report when the document asked for `"verify"`
    /// (inside `_replication_stats` because CouchDB refuses other `_`-prefixed members).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<Value>,
}

impl DocStats {
    /// The stats of a finished job that started at `start_time` (UNIX seconds).
    pub fn new(s: &ReplicationStats, start_time: i64) -> Self {
        Self {
            counters: CouchStats::from(s),
            start_time: iso8601(start_time),
            verify: None,
        }
    }
}

/// A terminal state to write to a document.
#[derive(Debug, Clone, PartialEq)]
pub enum Terminal {
    /// `completed` with these stats.
    Completed(DocStats),
    /// `failed` with this reason.
    Failed(String),
}

/// How often a conflicting write is retried.
const WRITE_ATTEMPTS: u32 = 6;

/// Writes a terminal state to `doc_id`, re-reading and retrying on conflict. Returns `false`
/// when the document no longer exists or already carries a terminal state.
pub async fn write_state(
    client: &HttpClient,
    doc_id: &str,
    state: Terminal,
) -> Result<bool, ReplicationError> {
    write_state_if(client, doc_id, state, |_| true).await
}

pub(crate) async fn write_state_if(
    client: &HttpClient,
    doc_id: &str,
    state: Terminal,
    still_same: impl Fn(&Map<String, Value>) -> bool,
) -> Result<bool, ReplicationError> {
    let path = encode_doc_id(doc_id);
    // Writers racing on one document retry at random moments, 100 ms doubling to 6.4 s.
    let mut conflicts =
        Backoff::new(Duration::from_millis(100), Duration::from_millis(6400)).full_jitter();
    for _ in 0..WRITE_ATTEMPTS {
        let r = client.send(&Req::get(path.clone())).await?;
        if r.status == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        let mut doc: Map<String, Value> = r.json("replication document")?;
        let current = doc.get("_replication_state").and_then(Value::as_str);
        if matches!(current, Some("completed" | "failed")) || !still_same(&doc) {
            return Ok(false);
        }
        doc.insert(
            "_replication_state_time".into(),
            json!(iso8601(
                crate::replication::pipeline::stats::unix_now() as i64
            )),
        );
        stamp_owner(&mut doc, client);
        match &state {
            Terminal::Completed(stats) => {
                doc.insert("_replication_state".into(), json!("completed"));
                doc.insert("_replication_stats".into(), json!(stats));
                doc.remove("_replication_state_reason");
            }
            Terminal::Failed(reason) => {
                doc.insert("_replication_state".into(), json!("failed"));
                doc.insert("_replication_state_reason".into(), json!(reason));
            }
        }
        let body = serde_json::to_vec(&doc)
            .map_err(|e| ReplicationError::BadResponse(format!("cannot encode document: {e}")))?;
        let w = client
            .send(&Req::json(Method::PUT, path.clone(), body))
            .await?;
        match w.status {
            s if s.is_success() => return Ok(true),
            StatusCode::CONFLICT => {
                conflicts.wait().await;
            }
            // A validation function refused the write: log and give up, as CouchDB does.
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => return Ok(false),
            s => {
                return Err(ReplicationError::BadResponse(format!(
                    "{}: writing the state of `{doc_id}` answered {s}",
                    client.endpoint()
                )));
            }
        }
    }
    Err(ReplicationError::BadResponse(format!(
        "{}: `{doc_id}` kept conflicting while writing its state",
        client.endpoint()
    )))
}

/// Writes a finished whole-server job's state into the `_replicator` document that asked for
/// it: `completed` with the documents counted over every database (its per-database
/// progress stays in `_scheduler/all_dbs`), or `failed` with the reason. True when done
/// (written, or nothing to write: the document is gone, already terminal, or no longer asks
/// for a whole-server copy).
pub(crate) async fn write_server_state(
    client: &HttpClient,
    doc_id: &str,
    v: &ServerJobView,
) -> Result<bool, ReplicationError> {
    let state = match v.state {
        ServerState::Completed => {
            let totals = ReplicationStats {
                docs_read: v.dbs.values().map(|d| d.docs_read).sum(),
                docs_written: v.docs_written,
                doc_write_failures: v.dbs.values().map(|d| d.doc_write_failures).sum(),
                ..ReplicationStats::default()
            };
            Terminal::Completed(DocStats::new(&totals, v.start_time))
        }
        ServerState::Failed => Terminal::Failed(v.error.clone().unwrap_or_default()),
        _ => return Ok(true),
    };
    let still_server = |doc: &Map<String, Value>| doc.get(ALL_DBS_FIELD) == Some(&json!(true));
    write_state_if(client, doc_id, state, still_server)
        .await
        .map(|_| true)
}

/// CouchDB stamps `owner` (the writer's name) on every `_replicator` document; we cannot
/// see who wrote it, so a document without one gets its `user_ctx` name, else the user this
/// node writes as.
fn stamp_owner(doc: &mut Map<String, Value>, client: &HttpClient) {
    if doc.get("owner").is_some_and(Value::is_string) {
        return;
    }
    let name = doc
        .get("user_ctx")
        .and_then(|u| u.get("name"))
        .and_then(Value::as_str)
        .or_else(|| client.endpoint().user())
        .map(str::to_owned);
    if let Some(name) = name {
        doc.insert("owner".into(), json!(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_stats_are_couchdbs_counters_then_the_start_time() {
        let s = ReplicationStats {
            docs_read: 2,
            checkpointed_source_seq: json!(5),
            ..ReplicationStats::default()
        };
        let v = json!(DocStats::new(&s, 0));
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.first(), Some(&"revisions_checked"));
        assert_eq!(keys.last(), Some(&"start_time"));
        assert_eq!(keys.len(), 10);
        assert_eq!(v["docs_read"], 2);
        assert_eq!(v["checkpointed_source_seq"], "5");
        assert_eq!(v["start_time"], "1970-01-01T00:00:00Z");
        let back: DocStats = serde_json::from_value(v).unwrap();
        assert_eq!(back, DocStats::new(&s, 0));
    }
}
