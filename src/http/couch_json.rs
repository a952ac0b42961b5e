//! CouchDB 3.4.3's JSON shapes of a replication job, as typed structs built from a
//! [`JobView`]: a `_scheduler/jobs` entry, a `_scheduler/docs` entry and an `_active_tasks`
//! entry. Keys, their order and value types are what a real CouchDB 3.4.3 answers for the same
//! state (the shape tests compare them); URLs carry no credentials, as in CouchDB.

use crate::replication::pipeline::stats::{CouchStats, seq_text, unix_now};
use crate::replication::{RepId, ReplicationStats};
use crate::replicator::job::view::iso8601;
use crate::replicator::{HistoryKind, JobView, NodeName, RepState};
use serde::Serialize;

/// The stats object (`info` of a running or stopped job, of an active or completed
/// document): CouchDB's counters, then the sequences of a job that has run in this
/// scheduling (not of a completed document).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsInfo {
    /// The counters.
    #[serde(flatten)]
    pub counters: CouchStats,
    /// Latest source sequence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_seq: Option<String>,
    /// Sequence processed through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub through_seq: Option<String>,
    /// Ours (CouchDB has none): seconds the running job has been behind its source feed, 0
    /// while caught up (`ReplicationStats::lag_seconds`, by this node's clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<u64>,
}

impl StatsInfo {
    /// The stats of a scheduled job (with its sequences) or of a completed one (without).
    pub fn new(s: &ReplicationStats, with_seqs: bool) -> Self {
        Self {
            counters: CouchStats::from(s),
            source_seq: with_seqs.then(|| seq_text(&s.source_seq)),
            through_seq: with_seqs.then(|| seq_text(&s.through_seq)),
            lag_seconds: None,
        }
    }

    /// The `info` CouchDB shows for a job in `state`: the stats of a running job, and of a
    /// pending one that ran before (the scheduler stopped it to run another); none otherwise.
    fn of_scheduled(j: &JobView) -> Option<Self> {
        let running = j.state == RepState::Running;
        matches!(j.state, RepState::Running | RepState::Pending)
            .then_some(j.stats.as_ref())
            .flatten()
            .map(|s| Self {
                lag_seconds: running.then(|| s.lag_seconds(unix_now())),
                ..Self::new(s, true)
            })
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
    pub id: Option<RepId>,
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
    /// Stats while running or stopped (pending after a run), else null.
    pub info: Option<StatsInfo>,
    /// Newest first.
    pub history: Vec<HistoryJson>,
    /// The node it belongs to.
    pub node: NodeName,
    /// ISO 8601.
    pub start_time: String,
    /// `paused` for a job an operator holds (ours; absent otherwise, as in CouchDB's
    /// entries, which carry no state).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
}

impl SchedulerJob {
    /// The entry of `j`; `node` names this node when the job has not run anywhere yet.
    pub fn new(j: &JobView, node: &NodeName) -> Self {
        let running = j.state == RepState::Running;
        Self {
            database: j.database.clone(),
            id: j.rep_id.clone(),
            pid: j.pid.clone().filter(|_| running),
            source: j.source.clone(),
            target: j.target.clone(),
            user: j.user.clone(),
            doc_id: j.doc_id.clone(),
            info: StatsInfo::of_scheduled(j),
            history: j
                .history
                .iter()
                .filter(|h| h.kind != HistoryKind::Pending)
                .map(|h| HistoryJson {
                    timestamp: iso8601(h.timestamp),
                    kind: h.kind,
                    reason: h.reason.clone(),
                })
                .collect(),
            node: j.node.clone().unwrap_or_else(|| node.clone()),
            start_time: iso8601(j.start_time),
            state: (j.state == RepState::Paused).then_some(RepState::Paused.as_str()),
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
    pub id: Option<RepId>,
    /// The node the job belongs to.
    pub node: NodeName,
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
    pub id: Option<RepId>,
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
    pub fn new(j: &JobView, node: &NodeName) -> Self {
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
                        let none = ReplicationStats::default();
                        DocInfo::Stats(StatsInfo::new(j.stats.as_ref().unwrap_or(&none), false))
                    },
                    start_time: iso8601(j.start_time),
                    last_updated: iso8601(j.last_updated),
                })
            }
            state => Self::Active(ActiveDoc {
                database: j.database.clone(),
                doc_id: j.doc_id.clone(),
                id: j.rep_id.clone(),
                node: j.node.clone().unwrap_or_else(|| node.clone()),
                source: j.source.clone(),
                target: j.target.clone(),
                state,
                info: match state {
                    RepState::Crashing => Some(error_info(j)),
                    _ => StatsInfo::of_scheduled(j).map(DocInfo::Stats),
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
    pub node: NodeName,
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
    pub replication_id: RepId,
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
    pub fn new(j: &JobView, node: &NodeName) -> Option<Self> {
        let s = j.stats.as_ref().filter(|_| j.state == RepState::Running)?;
        Some(Self {
            node: j.node.clone().unwrap_or_else(|| node.clone()),
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::replicator::job::record::RepJobRecord;

    fn view(state: RepState, stats: Option<ReplicationStats>) -> JobView {
        let mut r = RepJobRecord {
            rep_stats: stats,
            ..RepJobRecord::default()
        };
        r.origin.db_name = Some("_replicator".into());
        r.origin.doc_id = Some("d".into());
        r.state = state;
        JobView::from_record(&"_replicator|d".into(), &r)
    }

    fn ran() -> ReplicationStats {
        ReplicationStats {
            docs_written: 3,
            source_seq: json!("3-x"),
            through_seq: json!(3),
            ..ReplicationStats::default()
        }
    }

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn a_pending_job_shows_the_stats_of_its_last_run_as_couchdb_does() {
        for state in [RepState::Running, RepState::Pending] {
            let job = json!(SchedulerJob::new(&view(state, Some(ran())), &"n".into()));
            assert_eq!(job["info"]["docs_written"], 3, "{state:?}");
            assert_eq!(job["info"]["source_seq"], "3-x");
            assert_eq!(job["info"]["through_seq"], "3");
            let doc = json!(SchedulerDoc::new(&view(state, Some(ran())), &"n".into()));
            assert_eq!(doc["info"], job["info"], "{state:?}");
        }
        // Never ran: null, as a crashing job's `_scheduler/jobs` info.
        for state in [RepState::Pending, RepState::Crashing] {
            let job = json!(SchedulerJob::new(&view(state, None), &"n".into()));
            assert_eq!(job["info"], Value::Null, "{state:?}");
        }
        let crashing = json!(SchedulerJob::new(
            &view(RepState::Crashing, Some(ran())),
            &"n".into()
        ));
        assert_eq!(crashing["info"], Value::Null);
        assert_eq!(
            json!(SchedulerDoc::new(
                &view(RepState::Pending, None),
                &"n".into()
            ))["info"],
            Value::Null
        );
    }

    #[test]
    fn stats_keep_couchdbs_key_order() {
        let counters = [
            "revisions_checked",
            "missing_revisions_found",
            "docs_read",
            "docs_written",
            "changes_pending",
            "doc_write_failures",
            "bulk_get_docs",
            "bulk_get_attempts",
            "checkpointed_source_seq",
        ];
        let running = json!(StatsInfo::new(&ran(), true));
        let mut with_seqs = counters.to_vec();
        with_seqs.extend(["source_seq", "through_seq"]);
        assert_eq!(keys(&running), with_seqs);
        let done = json!(SchedulerDoc::new(
            &view(RepState::Completed, Some(ran())),
            &"n".into()
        ));
        assert_eq!(keys(&done["info"]), counters);
    }
}
