//! The replicator's job data inside couch_jobs (CouchDB 4.x's couch_replicator_jobs.erl job data, RFC 016) and the replicator
//! states mapped onto couch_jobs states (CouchDB 4.x's couch_replicator_httpd.erl): `pending`/`crashing` are couch_jobs `pending`,
//! `running` is `running`, `completed`/`failed` are `finished`.
//!
//! Owns the JSON keys of a `rep_jobs` job, job-id computation (persistent `db|doc_id`,
//! transient MD5 over the normalized request without credentials), the history list bounded
//! by `max_history`, and [`JobView`], the read-only view handed to the HTTP API.

use md5::{Digest, Md5};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::jobs::{JobData, JobState};
use crate::replication::{Filter, ReplicationOptions, ReplicationSpec};

use super::error::{ReplicatorError, ReplicatorResult};

/// The couch_jobs type of replication jobs.
pub const REP_JOBS: &str = "rep_jobs";

/// A replicator job state (CouchDB 4.x's couch_replicator_jobs.erl job data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RepState {
    /// Waiting to be accepted.
    Pending,
    /// Accepted by a job actor.
    Running,
    /// Crashed; waiting for its backoff to expire.
    Crashing,
    /// A one-shot replication that reached the end of the source feed.
    Completed,
    /// Will not be retried (bad document, duplicate of a persistent job, transient error).
    Failed,
}

impl RepState {
    /// The state name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            RepState::Pending => "pending",
            RepState::Running => "running",
            RepState::Crashing => "crashing",
            RepState::Completed => "completed",
            RepState::Failed => "failed",
        }
    }

    /// Parses a state name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => RepState::Pending,
            "running" => RepState::Running,
            "crashing" => RepState::Crashing,
            "completed" => RepState::Completed,
            "failed" => RepState::Failed,
            _ => return None,
        })
    }

    /// The couch_jobs state a job in this replicator state is in.
    pub fn jobs_state(self) -> JobState {
        match self {
            RepState::Pending | RepState::Crashing => JobState::Pending,
            RepState::Running => JobState::Running,
            RepState::Completed | RepState::Failed => JobState::Finished,
        }
    }

    /// Completed or failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, RepState::Completed | RepState::Failed)
    }
}

/// Who created a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobKind {
    /// From a `_replicator` document: the job id is `db|doc_id`.
    Persistent {
        /// The `_replicator` database (a name or URL).
        db_name: String,
        /// The document id.
        doc_id: String,
    },
    /// From `POST /_replicate` (or an embedding host): removed some time after it finishes.
    Transient {
        /// The user that asked (for authorization and fair attribution).
        user: Option<String>,
    },
}

/// The job id of a persistent job.
pub fn persistent_job_id(db_name: &str, doc_id: &str) -> String {
    format!("{db_name}|{doc_id}")
}

/// The job id of a transient job: MD5 over everything that makes it a different replication,
/// without credentials and without network access (CouchDB 4.x's couch_replicator_jobs.erl).
pub fn transient_job_id(spec: &ReplicationSpec, user: Option<&str>) -> String {
    let o = &spec.options;
    let normalized = json!([
        spec.source.url(),
        spec.target.url(),
        user,
        o.continuous,
        o.create_target,
        filter_json(&o.filter),
        o.winning_revs_only,
    ]);
    hex::encode(Md5::digest(normalized.to_string().as_bytes()))
}

/// The filter as stable JSON (job ids are persisted: no `Debug` text in them).
fn filter_json(f: &Filter) -> Value {
    match f {
        Filter::None => Value::Null,
        Filter::DocIds(ids) => json!({ "doc_ids": ids }),
        Filter::Selector(sel) => json!({ "selector": sel }),
        Filter::Named { name, query_params } => {
            json!({ "filter": name, "query_params": query_params })
        }
    }
}

/// The request fields that are not replication options and must not be stored as such.
const NOT_REP_FIELDS: [&str; 3] = ["_id", "_rev", "cancel"];

/// Builds the data of a new job in state `pending`. `rep` is the validated replication
/// document or request body (kept with credentials, which are only ever shown masked).
pub fn new_job_data(kind: &JobKind, rep: &Value, spec: &ReplicationSpec, now: i64) -> JobData {
    let mut rep_obj = rep.as_object().cloned().unwrap_or_default();
    rep_obj.retain(|k, _| !NOT_REP_FIELDS.contains(&k.as_str()) && !k.starts_with("_replication"));
    let (db_name, doc_id, user) = match kind {
        JobKind::Persistent { db_name, doc_id } => (json!(db_name), json!(doc_id), Value::Null),
        JobKind::Transient { user } => (Value::Null, Value::Null, json!(user)),
    };
    let mut d = Map::new();
    d.insert("rep".into(), Value::Object(rep_obj));
    d.insert("rep_id".into(), Value::Null);
    d.insert("base_id".into(), Value::Null);
    d.insert("db_name".into(), db_name);
    d.insert("doc_id".into(), doc_id);
    d.insert("rep_user".into(), user);
    d.insert("source".into(), json!(spec.source.to_string()));
    d.insert("target".into(), json!(spec.target.to_string()));
    d.insert("continuous".into(), json!(spec.options.continuous));
    d.insert("error_count".into(), json!(0));
    d.insert("rep_stats".into(), json!({}));
    d.insert("state".into(), json!(RepState::Pending.as_str()));
    d.insert("state_info".into(), Value::Null);
    d.insert("last_updated".into(), json!(now));
    d.insert("last_start".into(), Value::Null);
    d.insert("last_error".into(), Value::Null);
    d.insert("node".into(), Value::Null);
    d.insert("pid".into(), Value::Null);
    d.insert("job_history".into(), json!([]));
    d.insert("checkpoint_history".into(), json!([]));
    d.insert("active_task_info".into(), Value::Null);
    d.insert("start_time".into(), json!(now));
    push_history(&mut d, "added", now, None, usize::MAX);
    d
}

/// Parses and validates a replication document / request body over the node's per-job
/// defaults.
pub fn parse_rep(rep: &Value, defaults: &ReplicationOptions) -> ReplicatorResult<ReplicationSpec> {
    ReplicationSpec::from_json_with(rep, defaults)
        .map_err(|e| ReplicatorError::BadRequest(e.to_string()))
}

/// Prepends a history event (newest first), keeping at most `max_history` events.
pub fn push_history(
    d: &mut JobData,
    kind: &str,
    now: i64,
    reason: Option<&str>,
    max_history: usize,
) {
    let mut ev = Map::new();
    ev.insert("type".into(), json!(kind));
    ev.insert("timestamp".into(), json!(now));
    if let Some(r) = reason {
        ev.insert("reason".into(), json!(r));
    }
    let mut hist = match d.remove("job_history") {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    hist.insert(0, Value::Object(ev));
    hist.truncate(max_history.max(1));
    d.insert("job_history".into(), Value::Array(hist));
}

/// Sets the replicator state and `last_updated`.
pub fn set_state(d: &mut JobData, state: RepState, info: Option<Value>, now: i64) {
    d.insert("state".into(), json!(state.as_str()));
    d.insert("state_info".into(), info.unwrap_or(Value::Null));
    d.insert("last_updated".into(), json!(now));
}

/// The replicator state stored in `d` (pending when missing or unknown).
pub fn state_of(d: &JobData) -> RepState {
    d.get("state")
        .and_then(Value::as_str)
        .and_then(RepState::parse)
        .unwrap_or(RepState::Pending)
}

/// A string field, if set.
pub fn str_field<'a>(d: &'a JobData, k: &str) -> Option<&'a str> {
    d.get(k).and_then(Value::as_str)
}

/// An integer field, or 0.
pub fn int_field(d: &JobData, k: &str) -> i64 {
    d.get(k).and_then(Value::as_i64).unwrap_or(0)
}

/// Whether the job came from `POST /_replicate`.
pub fn is_transient(d: &JobData) -> bool {
    d.get("db_name").is_none_or(Value::is_null)
}

/// ISO 8601 (UTC, seconds) of a UNIX time.
pub fn iso8601(secs: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// One history event of a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryEvent {
    /// `added`, `started`, `stopped`, `pending` or `crashed`.
    #[serde(rename = "type")]
    pub kind: String,
    /// UNIX seconds.
    pub timestamp: i64,
    /// Why (for `crashed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A read-only view of one replication job, with every field `_scheduler/jobs`,
/// `_scheduler/docs` and `_active_tasks` need. Sources and targets are password-masked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    /// The couch_jobs id (`db|doc_id`, or an MD5 for transient jobs).
    pub job_id: String,
    /// The replication id (`base+ext`), known once a job actor computed it.
    pub rep_id: Option<String>,
    /// The `_replicator` database (persistent jobs).
    pub database: Option<String>,
    /// The `_replicator` document id (persistent jobs).
    pub doc_id: Option<String>,
    /// The user that created a transient job.
    pub user: Option<String>,
    /// Source URL, password masked.
    pub source: Option<String>,
    /// Target URL, password masked.
    pub target: Option<String>,
    /// Replicator state.
    pub state: RepState,
    /// Reason of `crashing`/`failed`, or null.
    pub state_info: Value,
    /// Latest stats (`rep_stats`).
    pub info: Value,
    /// Consecutive errors.
    pub error_count: u64,
    /// Newest first.
    pub history: Vec<HistoryEvent>,
    /// UNIX seconds the job was created.
    pub start_time: i64,
    /// UNIX seconds of the last state change or stats update.
    pub last_updated: i64,
    /// The node running it (while running).
    pub node: Option<String>,
    /// The actor id running it (while running).
    pub pid: Option<String>,
    /// Continuous replication.
    pub continuous: bool,
    /// What `_active_tasks` shows while running.
    pub active_task: Option<Value>,
    /// Checkpoint history of a completed one-shot job (what `POST /_replicate` returns).
    pub checkpoint_history: Value,
    /// UNIX seconds a crashed job becomes eligible again (end of its backoff).
    pub retry_at: Option<i64>,
}

/// The node whose job actor last stamped the job (`None` before a first run).
pub fn running_node(d: &JobData) -> Option<&str> {
    d.get("node").and_then(Value::as_str)
}

impl JobView {
    /// Builds the view from a job's id and data.
    pub fn from_data(job_id: &str, d: &JobData) -> Self {
        let s = |k: &str| str_field(d, k).map(str::to_owned);
        let history = d
            .get("job_history")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|e| HistoryEvent {
                        kind: e
                            .get("type")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        timestamp: e.get("timestamp").and_then(Value::as_i64).unwrap_or(0),
                        reason: e.get("reason").and_then(Value::as_str).map(str::to_owned),
                    })
                    .collect()
            })
            .unwrap_or_default();
        JobView {
            job_id: job_id.to_owned(),
            rep_id: s("rep_id"),
            database: s("db_name"),
            doc_id: s("doc_id"),
            user: s("rep_user"),
            source: s("source"),
            target: s("target"),
            state: state_of(d),
            state_info: d.get("state_info").cloned().unwrap_or(Value::Null),
            info: d.get("rep_stats").cloned().unwrap_or(Value::Null),
            error_count: int_field(d, "error_count").max(0) as u64,
            history,
            start_time: int_field(d, "start_time"),
            last_updated: int_field(d, "last_updated"),
            node: s("node"),
            pid: s("pid"),
            continuous: d
                .get("continuous")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            active_task: d.get("active_task_info").filter(|v| !v.is_null()).cloned(),
            checkpoint_history: d
                .get("checkpoint_history")
                .cloned()
                .unwrap_or_else(|| json!([])),
            retry_at: d.get("retry_at").and_then(Value::as_i64),
        }
    }

    /// Whether the job came from `POST /_replicate`.
    pub fn is_transient(&self) -> bool {
        self.database.is_none()
    }

    /// The job object of `GET /_scheduler/jobs` (CouchDB 4.x's couch_replicator_httpd.erl; timestamps ISO 8601).
    pub fn scheduler_json(&self) -> Value {
        let history: Vec<Value> = self
            .history
            .iter()
            .map(|h| {
                let mut e = json!({"timestamp": iso8601(h.timestamp), "type": h.kind});
                if let (Some(r), Some(m)) = (&h.reason, e.as_object_mut()) {
                    m.insert("reason".into(), json!(r));
                }
                e
            })
            .collect();
        let info = match self.state {
            RepState::Running | RepState::Pending => self.info.clone(),
            _ => self.state_info.clone(),
        };
        json!({
            "id": self.rep_id,
            "job_id": self.job_id,
            "database": self.database,
            "doc_id": self.doc_id,
            "source": self.source,
            "target": self.target,
            "state": self.state.as_str(),
            "info": info,
            "user": self.user,
            "history": history,
            "start_time": iso8601(self.start_time),
            "node": self.node,
            "pid": self.pid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(src: &str, tgt: &str) -> (Value, ReplicationSpec) {
        let rep = json!({"source": src, "target": tgt, "continuous": true});
        let s = parse_rep(&rep, &ReplicationOptions::default()).unwrap();
        (rep, s)
    }

    #[test]
    fn transient_ids_ignore_credentials_but_not_the_user() {
        let (_, a) = spec("http://u:p1@127.0.0.1:1/a", "http://127.0.0.1:1/b");
        let (_, b) = spec("http://u:p2@127.0.0.1:1/a", "http://127.0.0.1:1/b");
        let (_, c) = spec("http://u:p2@127.0.0.1:1/a", "http://127.0.0.1:1/c");
        assert_eq!(transient_job_id(&a, None), transient_job_id(&b, None));
        assert_ne!(transient_job_id(&a, None), transient_job_id(&c, None));
        assert_ne!(
            transient_job_id(&a, None),
            transient_job_id(&a, Some("bob"))
        );
    }

    #[test]
    fn transient_ids_are_built_from_stable_json() {
        let rep = json!({"source": "http://127.0.0.1:1/a", "target": "http://127.0.0.1:1/b",
            "doc_ids": ["x"]});
        let s = parse_rep(&rep, &ReplicationOptions::default()).unwrap();
        let text = r#"["http://127.0.0.1:1/a","http://127.0.0.1:1/b","bob",false,false,{"doc_ids":["x"]},false]"#;
        assert_eq!(
            transient_job_id(&s, Some("bob")),
            hex::encode(Md5::digest(text.as_bytes()))
        );
    }

    #[test]
    fn new_data_masks_and_history_is_bounded() {
        let (rep, s) = spec("http://u:secret@127.0.0.1:1/a", "http://127.0.0.1:1/b");
        let kind = JobKind::Persistent {
            db_name: "_replicator".into(),
            doc_id: "d".into(),
        };
        let mut d = new_job_data(&kind, &rep, &s, 100);
        let v = JobView::from_data("_replicator|d", &d);
        assert_eq!(v.state, RepState::Pending);
        assert!(!v.source.as_deref().unwrap().contains("secret"));
        assert!(!v.scheduler_json().to_string().contains("secret"));
        for t in 0..20 {
            push_history(&mut d, "started", 200 + t, None, 10);
        }
        let v = JobView::from_data("x", &d);
        assert_eq!(v.history.len(), 10);
        assert_eq!(v.history[0].timestamp, 219);
        assert_eq!(RepState::Crashing.jobs_state(), JobState::Pending);
        assert_eq!(RepState::Failed.jobs_state(), JobState::Finished);
    }
}
