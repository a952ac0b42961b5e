//! The typed record of one `rep_jobs` job: what the replicator keeps in couch_jobs' job data
//! (CouchDB 4.x's `couch_replicator_jobs` keys). This module is the only place that turns the
//! stored JSON map into a struct and back; everything else reads and writes fields.
//!
//! It owns the replicator state ([`RepState`]), the bounded history ([`HistoryEvent`] with a
//! [`HistoryKind`]), the error count, the last stats ([`ReplicationStats`]) and the typed error
//! that made a job crash or fail ([`JobError`]), which is how errors cross from a job actor to
//! the HTTP API without being recognised by their text.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::jobs::{JobData, JobsError};
use crate::replication::error::ReasonTag;
use crate::replication::{RepId, ReplicationError, ReplicationStats};
use crate::replicator::job::id::JobId;
use crate::replicator::node::name::NodeName;

/// A replicator job state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RepState {
    /// Waiting to be accepted.
    #[default]
    Pending,
    /// Accepted by a job actor.
    Running,
    /// Crashed; waiting for its backoff to expire.
    Crashing,
    /// A one-shot replication that reached the end of the source feed.
    Completed,
    /// Will not be retried (bad document, duplicate of a persistent job, transient error).
    Failed,
    /// Held by an operator (`_pause`): keeps its checkpoint and its replication id, runs on
    /// no node until resumed.
    Paused,
}

impl RepState {
    /// Every state, in the order operators read them (`/metrics`, the status page).
    pub const ALL: [RepState; 6] = [
        RepState::Pending,
        RepState::Running,
        RepState::Crashing,
        RepState::Completed,
        RepState::Failed,
        RepState::Paused,
    ];

    /// The state name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            RepState::Pending => "pending",
            RepState::Running => "running",
            RepState::Crashing => "crashing",
            RepState::Completed => "completed",
            RepState::Failed => "failed",
            RepState::Paused => "paused",
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
            "paused" => RepState::Paused,
            _ => return None,
        })
    }

    /// Completed or failed.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, RepState::Completed | RepState::Failed)
    }

    /// Pending, running or paused: the job holds its replication id against duplicates (a
    /// paused job comes back to the id it had).
    pub(crate) fn is_active(self) -> bool {
        matches!(
            self,
            RepState::Pending | RepState::Running | RepState::Paused
        )
    }
}

/// What happened to a job at one point of its history (CouchDB's event types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HistoryKind {
    /// The job was created.
    Added,
    /// A job actor started it.
    Started,
    /// It was stopped (rotation, shutdown).
    Stopped,
    /// It was waiting to run again: written by earlier versions after `crashed` and `stopped`;
    /// no longer recorded and never shown (CouchDB has no such event).
    Pending,
    /// It crashed (the event carries the reason).
    Crashed,
    /// An operator paused it (ours: CouchDB has no pause).
    Paused,
    /// An operator resumed it (ours).
    Resumed,
}

impl HistoryKind {
    /// The event name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Added => "added",
            HistoryKind::Started => "started",
            HistoryKind::Stopped => "stopped",
            HistoryKind::Pending => "pending",
            HistoryKind::Crashed => "crashed",
            HistoryKind::Paused => "paused",
            HistoryKind::Resumed => "resumed",
        }
    }
}

/// One history event of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub kind: HistoryKind,
    /// UNIX seconds.
    pub timestamp: i64,
    /// Why (for `crashed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Why a job crashed or failed. Stored in the record, read by the HTTP API and the document
/// writer; its text is CouchDB's reason and never holds a password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobError {
    /// The replication engine failed (`tag` is CouchDB's short reason: `db_not_found`,
    /// `max_backoff`, ...; `message` the full text).
    #[error("{message}")]
    Replication {
        /// CouchDB's reason tag.
        tag: ReasonTag,
        /// The error text (credentials already redacted by the engine).
        message: String,
    },
    /// Another pending/running job (transient, or a persistent one for a transient job) owns
    /// the replication id: retried after a backoff.
    #[error("Duplicate job running: {other}")]
    DuplicateJob {
        /// The job id of the owner.
        other: JobId,
    },
    /// Another document's pending/running job owns the replication id: this document fails.
    #[error(
        "Replication `{rep_id}` specified by document `{doc_id}` already started, triggered by \
         document `{other_doc}` from db `{db}`"
    )]
    DuplicateDocument {
        /// The replication id.
        rep_id: RepId,
        /// This document.
        doc_id: String,
        /// The document of the job that owns it.
        other_doc: String,
        /// The `_replicator` database of that document.
        db: String,
    },
    /// The document or request does not describe a valid replication.
    #[error("{reason}")]
    InvalidDocument {
        /// CouchDB's reason text.
        reason: String,
    },
    /// The job actor failed outside the replication (a panic, an actor it needs was down).
    #[error("{reason}")]
    Internal {
        /// What happened.
        reason: String,
    },
}

impl JobError {
    /// CouchDB's short error tag for this error (the `error` of an HTTP reply).
    pub fn tag(&self) -> &str {
        match self {
            JobError::Replication { tag, .. } => tag.as_str(),
            JobError::DuplicateJob { .. } | JobError::DuplicateDocument { .. } => "duplicate_job",
            JobError::InvalidDocument { .. } => "bad_request",
            JobError::Internal { .. } => "replication_failed",
        }
    }

    /// The reason without its tag prefix (`db_not_found: could not open x` → `could not
    /// open x`), for replies that carry the tag separately.
    pub fn detail(&self) -> String {
        let text = self.to_string();
        match self {
            JobError::Replication { tag, .. } => text
                .strip_prefix(tag.as_str())
                .and_then(|r| r.strip_prefix(": "))
                .map_or_else(|| text.clone(), str::to_owned),
            _ => text,
        }
    }

    /// An error that a transient job retries (CouchDB fails other transient errors at once).
    pub(crate) fn transient_job_retries(&self) -> bool {
        matches!(
            self,
            JobError::DuplicateJob { .. }
                | JobError::Replication {
                    tag: ReasonTag::MaxBackoff,
                    ..
                }
        )
    }
}

impl From<&ReplicationError> for JobError {
    fn from(e: &ReplicationError) -> Self {
        JobError::Replication {
            tag: e.tag(),
            message: e.to_string(),
        }
    }
}

/// Who a job belongs to, and how it was created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOrigin {
    /// The `_replicator` database (persistent jobs).
    pub db_name: Option<String>,
    /// The `_replicator` document id (persistent jobs).
    pub doc_id: Option<String>,
    /// The user that created a transient job.
    pub rep_user: Option<String>,
    /// The `owner` of the document (who wrote it), as CouchDB stamps it.
    pub owner: Option<String>,
}

/// The data of one `rep_jobs` job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RepJobRecord {
    /// The replication document or request body, without `_id`, `_rev`, `cancel` and the
    /// `_replication_*` fields (credentials kept: the job needs them, no API shows them).
    pub rep: Map<String, Value>,
    /// The full replication id (`base+ext`), once a job actor computed it.
    pub rep_id: Option<RepId>,
    /// The base part of the replication id.
    pub base_id: Option<String>,
    /// Where the job came from.
    #[serde(flatten)]
    pub origin: JobOrigin,
    /// Source URL as CouchDB shows it (no credentials).
    pub source: String,
    /// Target URL as CouchDB shows it (no credentials).
    pub target: String,
    /// Continuous replication.
    pub continuous: bool,
    /// Consecutive crashes.
    pub error_count: u32,
    /// The latest stats of the replication.
    pub rep_stats: Option<ReplicationStats>,
    /// The state.
    pub state: RepState,
    /// Why the job is `crashing` or `failed`.
    pub state_info: Option<JobError>,
    /// UNIX seconds of the last state change or stats update.
    pub last_updated: i64,
    /// UNIX seconds the current or last run started.
    pub last_start: Option<i64>,
    /// The error of the last crash (kept while the job runs again, to start gentler after
    /// `max_backoff`); cleared when the job is healed.
    pub last_error: Option<JobError>,
    /// The node running it (while running).
    pub node: Option<NodeName>,
    /// The actor id running it (while running).
    pub pid: Option<String>,
    /// Newest first, at most `max_history` events.
    pub job_history: Vec<HistoryEvent>,
    /// The checkpoint history of a completed one-shot job (what `POST /_replicate` returns).
    pub checkpoint_history: Value,
    /// UNIX seconds the job was created.
    pub start_time: i64,
    /// UNIX seconds a crashed job becomes eligible again (end of its backoff).
    pub retry_at: Option<i64>,
}

impl RepJobRecord {
    /// Reads the record from couch_jobs' job data.
    pub fn from_data(d: &JobData) -> Result<Self, JobsError> {
        serde_json::from_value(Value::Object(d.clone()))
            .map_err(|e| JobsError::Encoding(format!("replication job data: {e}")))
    }

    /// The job data couch_jobs stores.
    pub(crate) fn to_data(&self) -> JobData {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            // A struct of plain fields always serializes to an object.
            _ => Map::new(),
        }
    }

    /// Whether the job came from `POST /_replicate`.
    pub fn is_transient(&self) -> bool {
        self.origin.db_name.is_none()
    }

    /// Prepends a history event (newest first), keeping at most `max_history` events.
    pub(crate) fn push_history(
        &mut self,
        kind: HistoryKind,
        now: i64,
        reason: Option<String>,
        max_history: usize,
    ) {
        self.job_history.insert(
            0,
            HistoryEvent {
                kind,
                timestamp: now,
                reason,
            },
        );
        self.job_history.truncate(max_history.max(1));
    }

    /// Sets the state, its reason and `last_updated`.
    pub(crate) fn set_state(&mut self, state: RepState, info: Option<JobError>, now: i64) {
        self.state = state;
        self.state_info = info;
        self.last_updated = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_job_data() {
        let mut r = RepJobRecord {
            source: "http://h/a/".into(),
            origin: JobOrigin {
                db_name: Some("_replicator".into()),
                doc_id: Some("d".into()),
                owner: Some("bob".into()),
                rep_user: None,
            },
            rep_stats: Some(ReplicationStats {
                docs_read: 3,
                ..Default::default()
            }),
            ..Default::default()
        };
        r.push_history(HistoryKind::Added, 1, None, 10);
        r.push_history(HistoryKind::Crashed, 2, Some("boom".into()), 10);
        r.set_state(
            RepState::Crashing,
            Some(JobError::DuplicateJob { other: "x".into() }),
            2,
        );
        let d = r.to_data();
        assert_eq!(d["db_name"], "_replicator");
        assert_eq!(d["state"], "crashing");
        assert_eq!(d["job_history"][0]["type"], "crashed");
        assert_eq!(RepJobRecord::from_data(&d).unwrap(), r);
        for t in 0..20 {
            r.push_history(HistoryKind::Started, 10 + t, None, 10);
        }
        assert_eq!(r.job_history.len(), 10);
        assert_eq!(r.job_history[0].timestamp, 29);
    }

    /// Records written while ids were plain strings read into the typed ids and are
    /// written back with the same text.
    #[test]
    fn records_stored_before_typed_ids_still_read() {
        let old = serde_json::json!({
            "rep": {"source": "http://h/a", "target": "http://h/b", "continuous": true},
            "rep_id": "0123abcd+continuous",
            "base_id": "0123abcd",
            "db_name": "_replicator",
            "doc_id": "d",
            "node": "n1@127.0.0.1",
            "state": "failed",
            "state_info": {"kind": "duplicate_document", "rep_id": "0123abcd+continuous",
                "doc_id": "d", "other_doc": "e", "db": "_replicator"},
            "last_error": {"kind": "duplicate_job", "other": "_replicator|e"},
        });
        let Value::Object(old) = old else { panic!() };
        let r = RepJobRecord::from_data(&old).unwrap();
        let rep_id = r.rep_id.clone().unwrap();
        assert_eq!(
            (rep_id.base.as_str(), rep_id.ext.as_str()),
            ("0123abcd", "+continuous")
        );
        assert_eq!(r.node.as_ref().unwrap(), "n1@127.0.0.1");
        assert!(matches!(
            &r.last_error,
            Some(JobError::DuplicateJob { other }) if other == "_replicator|e"
        ));
        let new = r.to_data();
        for key in [
            "rep_id",
            "base_id",
            "node",
            "state_info",
            "last_error",
            "rep",
        ] {
            assert_eq!(new[key], old[key], "{key}");
        }
        assert_eq!(RepJobRecord::from_data(&new).unwrap(), r);
    }

    #[test]
    fn errors_keep_their_kind_and_couchdb_text() {
        let e = JobError::from(&ReplicationError::DbNotFound("http://h/a".into()));
        assert_eq!(e.tag(), "db_not_found");
        assert_eq!(e.detail(), "could not open http://h/a");
        assert!(!e.transient_job_retries());
        let d = JobError::DuplicateJob { other: "j".into() };
        assert!(d.transient_job_retries());
        assert_eq!(d.to_string(), "Duplicate job running: j");
        let bad = serde_json::json!({"state": "nonsense"});
        let Value::Object(m) = bad else { panic!() };
        assert!(RepJobRecord::from_data(&m).is_err());
    }
}
