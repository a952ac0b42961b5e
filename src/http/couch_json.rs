//! CouchDB 3.4.3's JSON shapes of a replication job, as typed structs built from a
//! [`JobView`]: a `_scheduler/jobs` entry, a `_scheduler/docs` entry and an `_active_tasks`
//! entry. Keys, their order and value types are what a real CouchDB 3.4.3 answers for the same
//! state (the shape tests compare them); URLs carry no credentials, as in CouchDB.

use serde::Serialize;
use serde_json::Value;

use crate::replication::ReplicationStats;
use crate::replicator::rep_job::iso8601;
use crate::replicator::{HistoryKind, JobView, RepState};

/// A sequence as CouchDB shows it in stats: strings as they are, anything else (a PouchDB's
/// integer, the starting `0`) as its JSON text.
fn seq_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The stats object (`info` of a running job, of a running or completed document).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsInfo {
    /// Revisions checked.
    pub revisions_checked: u64,
    /// Missing revisions found.
    pub missing_revisions_found: u64,
    /// Documents read.
    pub docs_read: u64,
    /// Documents written.
    pub docs_written: u64,
    /// Changes left, when known.
    pub changes_pending: Option<u64>,
    /// Write failures.
    pub doc_write_failures: u64,
    /// Revisions fetched with `_bulk_get`.
    pub bulk_get_docs: u64,
    /// Revisions asked for with `_bulk_get`.
    pub bulk_get_attempts: u64,
    /// Last checkpointed source sequence.
    pub checkpointed_source_seq: String,
    /// Latest source sequence (running jobs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_seq: Option<String>,
    /// Sequence processed through (running jobs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub through_seq: Option<String>,
}

impl StatsInfo {
    /// The stats of a running job (with its sequences) or of a finished one (without).
    pub fn new(s: &ReplicationStats, running: bool) -> Self {
        Self {
            revisions_checked: s.revisions_checked,
            missing_revisions_found: s.missing_revisions_found,
            docs_read: s.docs_read,
            docs_written: s.docs_written,
            changes_pending: s.changes_pending,
            doc_write_failures: s.doc_write_failures,
            bulk_get_docs: s.bulk_get_docs,
            bulk_get_attempts: s.bulk_get_attempts,
            checkpointed_source_seq: seq_text(&s.checkpointed_source_seq),
            source_seq: running.then(|| seq_text(&s.source_seq)),
            through_seq: running.then(|| seq_text(&s.through_seq)),
        }
    }
}

/// One history event of `_scheduler/jobs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryJson {
    /// ISO 8601.
    pub timestamp: String,
    /// The event.
    #[serde(rename = "type")]
    pub kind: HistoryKind,
    /// Why (crashes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An entry of `GET /_scheduler/jobs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchedulerJob {
    /// The `_replicator` database, null for transient jobs.
    pub database: Option<String>,
    /// The replication id.
    pub id: Option<String>,
    /// The process running it, null unless running.
    pub pid: Option<String>,
    /// Source URL.
    pub source: String,
    /// Target URL.
    pub target: String,
    /// The user of a transient job.
    pub user: Option<String>,
    /// The document id, null for transient jobs.
    pub doc_id: Option<String>,
    /// Stats while running, else null.
    pub info: Option<StatsInfo>,
    /// Newest first.
    pub history: Vec<HistoryJson>,
    /// The node it belongs to.
    pub node: String,
    /// ISO 8601.
    pub start_time: String,
}

impl SchedulerJob {
    /// The entry of `j`; `node` names this node when the job has not run anywhere yet.
    pub fn new(j: &JobView, node: &str) -> Self {
        let running = j.state == RepState::Running;
        Self {
            database: j.database.clone(),
            id: j.rep_id.clone(),
            pid: j.pid.clone().filter(|_| running),
            source: j.source.clone(),
            target: j.target.clone(),
            user: j.user.clone(),
            doc_id: j.doc_id.clone(),
            info: j
                .stats
                .as_ref()
                .filter(|_| running)
                .map(|s| StatsInfo::new(s, true)),
            history: j
                .history
                .iter()
                .map(|h| HistoryJson {
                    timestamp: iso8601(h.timestamp),
                    kind: h.kind,
                    reason: h.reason.clone(),
                })
                .collect(),
            node: j.node.clone().unwrap_or_else(|| node.to_owned()),
            start_time: iso8601(j.start_time),
        }
    }
}

/// `{"error": reason}`, the `info` of a crashing or failed document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorInfo {
    /// The reason text.
    pub error: String,
}

/// The `info` of a `_scheduler/docs` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum DocInfo {
    /// Running or completed: the stats.
    Stats(StatsInfo),
    /// Crashing or failed: the reason.
    Error(ErrorInfo),
}

/// An entry of `GET /_scheduler/docs` for a document whose job is scheduled (pending,
/// running, crashing).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActiveDoc {
    /// The `_replicator` database.
    pub database: Option<String>,
    /// The document id.
    pub doc_id: Option<String>,
    /// The replication id.
    pub id: Option<String>,
    /// The node the job belongs to.
    pub node: String,
    /// Source URL.
    pub source: String,
    /// Target URL.
    pub target: String,
    /// `pending`, `running` or `crashing`.
    pub state: RepState,
    /// Stats, the error, or null.
    pub info: Option<DocInfo>,
    /// Consecutive errors.
    pub error_count: u32,
    /// ISO 8601.
    pub last_updated: String,
    /// ISO 8601.
    pub start_time: String,
    /// Source proxy URL (never set by this replicator).
    pub source_proxy: Option<String>,
    /// Target proxy URL (never set by this replicator).
    pub target_proxy: Option<String>,
}

/// An entry of `GET /_scheduler/docs` for a `completed` or `failed` document (CouchDB
/// rebuilds these from the document: no node, no replication id, no proxies).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FinishedDoc {
    /// The `_replicator` database.
    pub database: Option<String>,
    /// The document id.
    pub doc_id: Option<String>,
    /// Always null, as in CouchDB.
    pub id: Option<String>,
    /// Source URL.
    pub source: String,
    /// Target URL.
    pub target: String,
    /// `completed` or `failed`.
    pub state: RepState,
    /// 0 when completed, 1 when failed.
    pub error_count: u32,
    /// The final stats, or the reason.
    pub info: DocInfo,
    /// ISO 8601.
    pub start_time: String,
    /// ISO 8601.
    pub last_updated: String,
}

/// An entry of `GET /_scheduler/docs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SchedulerDoc {
    /// Pending, running or crashing.
    Active(ActiveDoc),
    /// Completed or failed.
    Finished(FinishedDoc),
}

fn error_info(j: &JobView) -> DocInfo {
    DocInfo::Error(ErrorInfo {
        error: j
            .state_info
            .as_ref()
            .map_or_else(|| "unknown".to_owned(), ToString::to_string),
    })
}

impl SchedulerDoc {
    /// The entry of `j`; `node` names this node when the job has not run anywhere yet.
    pub fn new(j: &JobView, node: &str) -> Self {
        let stats = |running| j.stats.as_ref().map(|s| StatsInfo::new(s, running));
        match j.state {
            RepState::Completed | RepState::Failed => {
                let failed = j.state == RepState::Failed;
                Self::Finished(FinishedDoc {
                    database: j.database.clone(),
                    doc_id: j.doc_id.clone(),
                    id: None,
                    source: j.source.clone(),
                    target: j.target.clone(),
                    state: j.state,
                    error_count: u32::from(failed),
                    info: if failed {
                        error_info(j)
                    } else {
                        DocInfo::Stats(
                            stats(false).unwrap_or_else(|| {
                                StatsInfo::new(&ReplicationStats::default(), false)
                            }),
                        )
                    },
                    start_time: iso8601(j.start_time),
                    last_updated: iso8601(j.last_updated),
                })
            }
            state => Self::Active(ActiveDoc {
                database: j.database.clone(),
                doc_id: j.doc_id.clone(),
                id: j.rep_id.clone(),
                node: j.node.clone().unwrap_or_else(|| node.to_owned()),
                source: j.source.clone(),
                target: j.target.clone(),
                state,
                info: match state {
                    RepState::Crashing => Some(error_info(j)),
                    RepState::Running => stats(true).map(DocInfo::Stats),
                    _ => None,
                },
                error_count: j.error_count,
                last_updated: iso8601(j.last_updated),
                start_time: iso8601(j.start_time),
                source_proxy: None,
                target_proxy: None,
            }),
        }
    }
}

/// An entry of `GET /_active_tasks` for a running replication.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActiveTask {
    /// The node running it.
    pub node: String,
    /// The process running it.
    pub pid: Option<String>,
    /// CouchDB's process status; a job actor waiting for messages is `waiting`.
    pub process_status: &'static str,
    /// Revisions asked for with `_bulk_get`.
    pub bulk_get_attempts: u64,
    /// Revisions fetched with `_bulk_get`.
    pub bulk_get_docs: u64,
    /// Changes left, when known.
    pub changes_pending: Option<u64>,
    /// Milliseconds.
    pub checkpoint_interval: u64,
    /// Last checkpointed source sequence.
    pub checkpointed_source_seq: String,
    /// Continuous replication.
    pub continuous: bool,
    /// The `_replicator` database, null for transient jobs.
    pub database: Option<String>,
    /// The document id, null for transient jobs.
    pub doc_id: Option<String>,
    /// Write failures.
    pub doc_write_failures: u64,
    /// Documents read.
    pub docs_read: u64,
    /// Documents written.
    pub docs_written: u64,
    /// Missing revisions found.
    pub missing_revisions_found: u64,
    /// The replication id.
    pub replication_id: String,
    /// Revisions checked.
    pub revisions_checked: u64,
    /// Source URL.
    pub source: String,
    /// Latest source sequence.
    pub source_seq: String,
    /// UNIX seconds this run started.
    pub started_on: u64,
    /// Target URL.
    pub target: String,
    /// Sequence processed through.
    pub through_seq: String,
    /// Always `replication`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// UNIX seconds of the stats.
    pub updated_on: u64,
    /// The user of a transient job.
    pub user: Option<String>,
}

impl ActiveTask {
    /// The task of a running job, if it has reported stats.
    pub fn new(j: &JobView, node: &str) -> Option<Self> {
        let s = j.stats.as_ref().filter(|_| j.state == RepState::Running)?;
        Some(Self {
            node: j.node.clone().unwrap_or_else(|| node.to_owned()),
            pid: j.pid.clone(),
            process_status: "waiting",
            bulk_get_attempts: s.bulk_get_attempts,
            bulk_get_docs: s.bulk_get_docs,
            changes_pending: s.changes_pending,
            checkpoint_interval: s.checkpoint_interval,
            checkpointed_source_seq: seq_text(&s.checkpointed_source_seq),
            continuous: j.continuous,
            database: j.database.clone(),
            doc_id: j.doc_id.clone(),
            doc_write_failures: s.doc_write_failures,
            docs_read: s.docs_read,
            docs_written: s.docs_written,
            missing_revisions_found: s.missing_revisions_found,
            replication_id: j.rep_id.clone().unwrap_or_default(),
            revisions_checked: s.revisions_checked,
            source: j.source.clone(),
            source_seq: seq_text(&s.source_seq),
            started_on: s.started_on,
            target: j.target.clone(),
            through_seq: seq_text(&s.through_seq),
            kind: "replication",
            updated_on: s.updated_on,
            user: j.user.clone(),
        })
    }
}
