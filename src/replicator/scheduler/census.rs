//! The cluster's jobs counted ([`Census`]), kept for `/metrics` and `_stats` so that a scrape
//! reads nothing from the store: a scrape is unauthenticated and may come often, and with
//! 10,000 jobs a count read every one. The clustering actor runs [`spawn`]'s task (on every
//! kind of node), which takes a census every `period` and soon after a poke
//! ([`CensusBoard::poke`]: the job server's messages, a job added through the handle), at
//! most once per [`MIN_GAP`]; a scrape shows the last one and its age.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::jobs::{Jobs, JobsResult};
use crate::replication::pipeline::stats::{seq_number, unix_now};
use crate::replicator::job::id::JobId;
use crate::replicator::job::view::{REP_JOBS, RepState};
use crate::replicator::node::name::NodeName;
use crate::telemetry::job_gauges::JobSample;

/// The least time between two censuses, however often poked.
pub const MIN_GAP: Duration = Duration::from_secs(2);

/// Counted at most this many pending jobs per type (the count scans the pending index).
const QUEUE_COUNT_LIMIT: usize = 1_000_000;

/// The states a census counts, in the order `/metrics` shows them.
pub const STATES: [RepState; 6] = RepState::ALL;

/// couch_jobs' queue of one job type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDepth {
    /// The job type.
    pub job_type: String,
    /// Pending jobs, backed-off ones included.
    pub pending: usize,
    /// Pending jobs whose scheduled time has come.
    pub due: usize,
}

/// One count of the cluster's replication jobs and of this node's running ones.
#[derive(Debug, Clone, Default)]
pub struct Census {
    /// Jobs per state, in [`STATES`]' order.
    pub by_state: [u64; STATES.len()],
    /// Every job.
    pub total: u64,
    /// This node's running jobs.
    pub mine: Vec<JobSample<JobId>>,
    /// couch_jobs' queue depth of every job type.
    pub queues: Vec<QueueDepth>,
    /// When it was taken (`None`: not yet).
    pub taken: Option<Instant>,
}

impl Census {
    /// Jobs in `state`.
    pub fn count(&self, state: RepState) -> u64 {
        STATES
            .iter()
            .position(|s| *s == state)
            .map_or(0, |i| self.by_state[i])
    }
}

/// The last census and the pokes that ask for the next.
#[derive(Debug, Default)]
pub struct CensusBoard {
    last: Mutex<Arc<Census>>,
    poked: Notify,
}

impl CensusBoard {
    /// The last census taken.
    pub fn last(&self) -> Arc<Census> {
        match self.last.lock() {
            Ok(g) => g.clone(),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    /// Something changed: take a census soon.
    pub fn poke(&self) {
        self.poked.notify_one();
    }

    fn set(&self, c: Census) {
        let c = Arc::new(c);
        match self.last.lock() {
            Ok(mut g) => *g = c,
            Err(p) => *p.into_inner() = c,
        }
    }
}

/// Takes a census every `period` and after each poke (at most one per [`MIN_GAP`]).
pub fn spawn(
    board: Arc<CensusBoard>,
    jobs: Jobs,
    node: NodeName,
    period: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match take(&jobs, &node).await {
                Ok(c) => board.set(c),
                Err(e) => tracing::debug!(error = %e, "census failed"),
            }
            tokio::time::sleep(MIN_GAP).await;
            let _ =
                tokio::time::timeout(period.saturating_sub(MIN_GAP), board.poked.notified()).await;
        }
    })
}

/// The fields of a job's record a census reads; the rest of the record (the replication
/// document, its history, checkpoint history) is skipped while decoding, not built. With
/// 3,000 jobs, decoding whole records was a third of a cluster node's CPU under rotation.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CensusRow {
    state: RepState,
    node: Option<NodeName>,
    rep_stats: Option<CensusStats>,
}

/// The stats a sample shows (named as in [`ReplicationStats`](crate::ReplicationStats)).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CensusStats {
    changes_pending: Option<u64>,
    behind_since: Option<u64>,
    through_seq: Value,
    checkpointed_source_seq: Value,
    docs_written: u64,
}

/// Counts the cluster's jobs and samples this node's running ones (reads every job).
pub async fn take(jobs: &Jobs, node: &NodeName) -> JobsResult<Census> {
    // The pipeline stamps `behind_since` by this machine's clock; this node's jobs only.
    let now = unix_now();
    let mut c = jobs
        .fold_jobs_as::<CensusRow, _, _>(REP_JOBS, Census::default(), |mut c, j| {
            let Some(row) = j.data else {
                return c;
            };
            c.total += 1;
            if let Some(i) = STATES.iter().position(|s| *s == row.state) {
                c.by_state[i] += 1;
            }
            if row.state == RepState::Running && row.node.as_ref() == Some(node) {
                let stats = row.rep_stats.unwrap_or_default();
                c.mine.push(sample(JobId::from(&j.id), stats, now));
            }
            c
        })
        .await?;
    c.queues = queue_depths(jobs).await;
    c.taken = Some(Instant::now());
    Ok(c)
}

/// couch_jobs' queue depth of every job type (reads the pending index).
pub async fn queue_depths(jobs: &Jobs) -> Vec<QueueDepth> {
    let Ok(types) = jobs.get_types().await else {
        return Vec::new();
    };
    let now = jobs.clock().now_secs();
    let mut out = Vec::new();
    for ty in types {
        let all = jobs.pending_count(&ty, None, Some(QUEUE_COUNT_LIMIT)).await;
        let due = jobs
            .pending_count(&ty, Some(now), Some(QUEUE_COUNT_LIMIT))
            .await;
        if let (Ok(pending), Ok(due)) = (all, due) {
            out.push(QueueDepth {
                job_type: ty,
                pending,
                due,
            });
        }
    }
    out
}

fn sample(job_id: JobId, n: CensusStats, now: u64) -> JobSample<JobId> {
    let lag = match (
        seq_number(&n.through_seq),
        seq_number(&n.checkpointed_source_seq),
    ) {
        (Some(t), Some(c)) => Some(t.saturating_sub(c)),
        _ => None,
    };
    JobSample {
        job_id,
        changes_pending: n.changes_pending,
        checkpoint_lag: lag,
        lag_seconds: Some(n.behind_since.map_or(0, |t| now.saturating_sub(t))),
        docs_written: n.docs_written,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_census_row_reads_what_a_record_wrote() {
        use crate::replicator::job::record::RepJobRecord;
        let record = RepJobRecord {
            state: RepState::Running,
            node: Some(NodeName::from("n1@127.0.0.1")),
            rep_stats: Some(crate::ReplicationStats {
                through_seq: json!("12-g1AAAA"),
                checkpointed_source_seq: json!(9),
                docs_written: 7,
                changes_pending: Some(3),
                behind_since: Some(1_000),
                ..Default::default()
            }),
            job_history: vec![],
            checkpoint_history: json!([{"session_id": "s"}]),
            ..Default::default()
        };
        let bytes = serde_json::to_vec(&record.to_data()).unwrap();
        let row: CensusRow = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(row.state, RepState::Running);
        assert_eq!(row.node, record.node);
        let s = sample(JobId::from("j"), row.rep_stats.unwrap(), 1_042);
        assert_eq!(
            (
                s.changes_pending,
                s.checkpoint_lag,
                s.lag_seconds,
                s.docs_written
            ),
            (Some(3), Some(3), Some(42), 7)
        );
        // A pending record that never ran: no node, no stats.
        let bytes = serde_json::to_vec(&RepJobRecord::default().to_data()).unwrap();
        let row: CensusRow = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            (row.state, row.node, row.rep_stats.is_none()),
            (RepState::default(), None, true)
        );
    }

    #[test]
    fn sequences_are_numbers_or_couchdb_strings() {
        assert_eq!(seq_number(&json!(42)), Some(42));
        assert_eq!(seq_number(&json!("17-g1AAAA")), Some(17));
        assert_eq!(seq_number(&json!("opaque")), None);
        assert_eq!(seq_number(&Value::Null), None);
    }
}
