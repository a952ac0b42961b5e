//! Replication jobs as the rest of the node sees them: the record of a new job (its fields are owned by `super::record`), and [`JobView`], the read-only
//! view handed to the HTTP API and the `_replicator` writer.

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::jobs::{JobData, JobsError};
use crate::replication::id::rep_id::replication_id_offline;
use crate::replication::{RepId, ReplicationOptions, ReplicationSpec, ReplicationStats};

use super::id::JobId;
pub use super::record::{HistoryEvent, HistoryKind, JobError, JobOrigin, RepJobRecord, RepState};
use crate::replicator::error::{ReplicatorError, ReplicatorResult};
use crate::replicator::node::name::NodeName;

/// The couch_jobs type of replication jobs.
pub const REP_JOBS: &str = "rep_jobs";

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

/// The request fields that are not replication options and must not be stored as such
/// (`owner` is kept apart: CouchDB stamps it on write, which must not look like an edit).
const NOT_REP_FIELDS: [&str; 4] = ["_id", "_rev", "cancel", "owner"];

/// The replication part of a document or request body: what decides whether an edited
/// document still asks for the same replication.
pub(crate) fn rep_fields(rep: &Map<String, Value>) -> Map<String, Value> {
    let mut rep = rep.clone();
    rep.retain(|k, _| !NOT_REP_FIELDS.contains(&k.as_str()) && !k.starts_with("_replication"));
    rep
}

/// Builds the record of a new job in state `pending`. `rep` is the validated replication
/// document or request body (kept with credentials, which no API shows).
pub fn new_record(
    kind: &JobKind,
    rep: &Value,
    spec: &ReplicationSpec,
    server_uuid: &str,
    now: i64,
) -> RepJobRecord {
    let doc = rep.as_object().cloned().unwrap_or_default();
    let owner = doc.get("owner").and_then(Value::as_str).map(str::to_owned);
    let origin = match kind {
        JobKind::Persistent { db_name, doc_id } => JobOrigin {
            db_name: Some(db_name.clone()),
            doc_id: Some(doc_id.clone()),
            rep_user: None,
            owner,
        },
        JobKind::Transient { user } => JobOrigin {
            rep_user: user.clone(),
            ..JobOrigin::default()
        },
    };
    let mut r = RepJobRecord {
        rep: rep_fields(&doc),
        origin,
        source: spec.source.couch_url(),
        target: spec.target.couch_url(),
        continuous: spec.options.continuous,
        last_updated: now,
        checkpoint_history: json!([]),
        start_time: now,
        ..RepJobRecord::default()
    };
    // CouchDB shows the replication id of a job that has not run yet; the job recomputes it
    // when it starts (then also for design-document filters, whose code it fetches).
    if let Some(id) = replication_id_offline(server_uuid, spec) {
        r.base_id = Some(id.base.clone());
        r.rep_id = Some(id);
    }
    r.push_history(HistoryKind::Added, now, None, usize::MAX);
    r
}

/// Parses and validates a replication document / request body over the node's per-job
/// defaults.
pub fn parse_rep(rep: &Value, defaults: &ReplicationOptions) -> ReplicatorResult<ReplicationSpec> {
    ReplicationSpec::from_json_with(rep, defaults).map_err(ReplicatorError::Replication)
}

/// ISO 8601 (UTC, seconds) of a UNIX time.
pub(crate) fn iso8601(secs: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A read-only view of one replication job, with every field `_scheduler/jobs`,
/// `_scheduler/docs`, `_active_tasks` and the `_replicator` writer need. URLs carry no
/// credentials.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    /// The couch_jobs id (`db|doc_id`, or an MD5 for transient jobs).
    pub job_id: JobId,
    /// The replication id (`base+ext`), known once a job actor computed it.
    pub rep_id: Option<RepId>,
    /// The `_replicator` database (persistent jobs).
    pub database: Option<String>,
    /// The `_replicator` document id (persistent jobs).
    pub doc_id: Option<String>,
    /// The user that created a transient job.
    pub user: Option<String>,
    /// The `owner` of the document.
    pub owner: Option<String>,
    /// Source URL without credentials.
    pub source: String,
    /// Target URL without credentials.
    pub target: String,
    /// Replicator state.
    pub state: RepState,
    /// Why the job is `crashing`/`failed`.
    pub state_info: Option<JobError>,
    /// Latest stats of the replication.
    pub stats: Option<ReplicationStats>,
    /// Consecutive errors.
    pub error_count: u32,
    /// Newest first.
    pub history: Vec<HistoryEvent>,
    /// UNIX seconds the job was created.
    pub start_time: i64,
    /// UNIX seconds of the last state change or stats update.
    pub last_updated: i64,
    /// UNIX seconds the current or last run started.
    pub last_start: Option<i64>,
    /// The node running it (while running).
    pub node: Option<NodeName>,
    /// The actor id running it (while running).
    pub pid: Option<String>,
    /// Continuous replication.
    pub continuous: bool,
    /// Checkpoint history of a completed one-shot job (what `POST /_replicate` returns).
    pub checkpoint_history: Value,
    /// UNIX seconds a crashed job becomes eligible again (end of its backoff).
    pub retry_at: Option<i64>,
}

/// The node whose job actor last stamped the job (`None` before a first run).
pub(crate) fn running_node(d: &JobData) -> Option<&str> {
    d.get("node").and_then(Value::as_str)
}

impl JobView {
    /// Builds the view from a job's id and record.
    pub(crate) fn from_record(job_id: &JobId, r: &RepJobRecord) -> Self {
        JobView {
            job_id: job_id.clone(),
            rep_id: r.rep_id.clone(),
            database: r.origin.db_name.clone(),
            doc_id: r.origin.doc_id.clone(),
            user: r.origin.rep_user.clone(),
            owner: r.origin.owner.clone(),
            source: r.source.clone(),
            target: r.target.clone(),
            state: r.state,
            state_info: r.state_info.clone(),
            stats: r.rep_stats.clone(),
            error_count: r.error_count,
            history: r.job_history.clone(),
            start_time: r.start_time,
            last_updated: r.last_updated,
            last_start: r.last_start,
            node: r.node.clone(),
            pid: r.pid.clone(),
            continuous: r.continuous,
            checkpoint_history: r.checkpoint_history.clone(),
            retry_at: r.retry_at,
        }
    }

    /// Builds the view from a job's id and couch_jobs data.
    pub fn from_data(job_id: &JobId, d: &JobData) -> Result<Self, JobsError> {
        Ok(Self::from_record(job_id, &RepJobRecord::from_data(d)?))
    }

    /// Whether the job came from `POST /_replicate`.
    pub fn is_transient(&self) -> bool {
        self.database.is_none()
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
    fn new_records_hold_no_credentials_in_urls() {
        let (mut rep, s) = spec("http://u:secret@127.0.0.1:1/a", "http://127.0.0.1:1/b");
        rep["owner"] = json!("bob");
        let kind = JobKind::Persistent {
            db_name: "_replicator".into(),
            doc_id: "d".into(),
        };
        let r = new_record(&kind, &rep, &s, "uuid", 100);
        let v = JobView::from_data(&"_replicator|d".into(), &r.to_data()).unwrap();
        assert_eq!(v.state, RepState::Pending);
        assert_eq!(v.source, "http://127.0.0.1:1/a/");
        assert_eq!(v.owner.as_deref(), Some("bob"));
        assert!(!r.rep.contains_key("owner"));
        assert_eq!(v.history[0].kind, HistoryKind::Added);
    }
}
