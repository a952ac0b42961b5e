//! The status page's data: one typed snapshot (`status.json`) of the job counts, the couch_jobs
//! queue, the cluster's nodes, this node's documents-written counter (the page turns its
//! samples into docs/s), and one filtered page of jobs. Filtering and paging happen here, so
//! a browser never receives 10,000 rows.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use serde::{Deserialize, Serialize};

use crate::http::AppState;
use crate::http::error::{HttpError, HttpResult};
use crate::replication::pipeline::stats::unix_now;
use crate::replication::{RepId, ReplicationStats};
use crate::replicator::scheduler::census;
use crate::replicator::{JobId, JobView, NodeName, RepState};

/// Rows per page unless asked otherwise, and the most a page may hold.
pub const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 500;
/// A node whose heartbeat is older than this is shown as down.
const ALIVE_MS: i64 = 60_000;

/// `?skip=&limit=&state=&q=`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PageQuery {
    /// Rows to skip.
    pub skip: Option<usize>,
    /// Rows to return (at most 500).
    pub limit: Option<usize>,
    /// Only jobs in this state (`pending`, `running`, ...); empty = all.
    pub state: Option<String>,
    /// Only jobs whose id, replication id, source or target contains this text.
    pub q: Option<String>,
    /// `lag`: the jobs furthest behind their source first (else the store's order).
    pub sort: Option<String>,
}

/// Jobs per state.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Waiting for their turn (including backed-off ones).
    pub pending: usize,
    /// Running on some node.
    pub running: usize,
    /// Waiting out a backoff after an error.
    pub crashing: usize,
    /// Held by an operator.
    pub paused: usize,
    /// Finished successfully (one-shot replications).
    pub completed: usize,
    /// Failed for good (invalid, or refused).
    pub failed: usize,
    /// All jobs.
    pub total: usize,
}

/// couch_jobs' queue of one job type.
#[derive(Debug, Clone, Serialize)]
pub struct Queue {
    /// The couch_jobs type (`rep_jobs`, steps types).
    pub job_type: String,
    /// Pending, including backed-off jobs.
    pub pending: usize,
    /// Pending and due now.
    pub due: usize,
}

/// One node of the cluster.
#[derive(Debug, Clone, Serialize)]
pub struct NodeRow {
    /// The node name.
    pub name: NodeName,
    /// Milliseconds since its last heartbeat.
    pub age_ms: i64,
    /// Its heartbeat is recent enough to count it as up.
    pub alive: bool,
    /// Whether it is the node serving this page.
    pub this_node: bool,
}

/// One job row.
#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    /// The couch_jobs job id.
    pub job_id: JobId,
    /// The replication id, once computed.
    pub rep_id: Option<RepId>,
    /// The source URL, without credentials.
    pub source: Option<String>,
    /// The target URL, without credentials.
    pub target: Option<String>,
    /// The replicator state (`pending`, `running`, ...).
    pub state: &'static str,
    /// The node running it.
    pub node: Option<NodeName>,
    /// Continuous replication.
    pub continuous: bool,
    /// Documents written by its current run.
    pub docs_written: u64,
    /// Changes on the source not yet processed, when known.
    pub changes_pending: Option<u64>,
    /// Seconds a running job has been behind its source (0 when caught up).
    pub lag_seconds: Option<u64>,
    /// Consecutive errors (reset when it runs healthily).
    pub error_count: u64,
    /// Why it is crashing or failed.
    pub reason: Option<String>,
    /// Seconds until a crashing job may run again.
    pub retry_in_s: Option<i64>,
}

/// One page of the filtered jobs.
#[derive(Debug, Clone, Serialize)]
pub struct JobPage {
    /// Jobs matching the filter.
    pub matching: usize,
    /// Rows skipped before this page.
    pub skip: usize,
    /// The most rows this page may hold.
    pub limit: usize,
    /// The rows.
    pub rows: Vec<JobRow>,
}

/// The whole snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The node serving the page.
    pub node: NodeName,
    /// Its clock when the snapshot was taken (ms since the epoch).
    pub now_ms: i64,
    /// This node's documents-written counter (the page derives docs/s from samples of it).
    pub docs_written_total: u64,
    /// Jobs per state.
    pub counts: Counts,
    /// couch_jobs queues per type.
    pub queues: Vec<Queue>,
    /// The cluster's nodes.
    pub nodes: Vec<NodeRow>,
    /// The requested page of jobs.
    pub jobs: JobPage,
}

fn state_named(s: &str) -> HttpResult<Option<RepState>> {
    let all = RepState::ALL;
    if s.is_empty() {
        return Ok(None);
    }
    all.into_iter()
        .find(|st| st.as_str() == s)
        .map(Some)
        .ok_or_else(|| HttpError::bad_request(format!("unknown state `{s}`")))
}

fn matches(j: &JobView, state: Option<RepState>, q: &str) -> bool {
    if state.is_some_and(|s| s != j.state) {
        return false;
    }
    if q.is_empty() {
        return true;
    }
    let has = |v: Option<&str>| v.is_some_and(|v| v.contains(q));
    j.job_id.as_str().contains(q)
        || has(j.rep_id.as_ref().map(RepId::full).as_deref())
        || has(Some(&j.source))
        || has(Some(&j.target))
}

fn reason_of(j: &JobView) -> Option<String> {
    match (j.state, &j.state_info) {
        (RepState::Crashing | RepState::Failed, Some(e)) => Some(e.to_string()),
        _ => None,
    }
}

/// A running job's lag in seconds (by this node's clock, as `_scheduler/jobs` shows it).
fn lag_of(j: &JobView) -> Option<u64> {
    let lag = |s: &ReplicationStats| s.lag_seconds(unix_now());
    (j.state == RepState::Running).then(|| j.stats.as_ref().map_or(0, lag))
}

fn row(j: &JobView, now_s: i64) -> JobRow {
    let n = j.stats.clone().unwrap_or_default();
    JobRow {
        job_id: j.job_id.clone(),
        rep_id: j.rep_id.clone(),
        source: Some(j.source.clone()),
        target: Some(j.target.clone()),
        state: j.state.as_str(),
        node: j.node.clone(),
        continuous: j.continuous,
        docs_written: n.docs_written,
        changes_pending: n.changes_pending,
        lag_seconds: lag_of(j),
        error_count: u64::from(j.error_count),
        reason: reason_of(j),
        retry_in_s: match (j.state, j.retry_at) {
            (RepState::Crashing, Some(at)) => Some((at - now_s).max(0)),
            _ => None,
        },
    }
}

fn counts(jobs: &[JobView]) -> Counts {
    let n = |s: RepState| jobs.iter().filter(|j| j.state == s).count();
    Counts {
        pending: n(RepState::Pending),
        running: n(RepState::Running),
        crashing: n(RepState::Crashing),
        completed: n(RepState::Completed),
        failed: n(RepState::Failed),
        paused: n(RepState::Paused),
        total: jobs.len(),
    }
}

/// couch_jobs' queue depth of every job type, read now.
pub async fn queues(st: &AppState) -> Vec<Queue> {
    census::queue_depths(st.replicator().jobs())
        .await
        .into_iter()
        .map(|q| Queue {
            job_type: q.job_type,
            pending: q.pending,
            due: q.due,
        })
        .collect()
}

/// Builds the snapshot for `q`.
pub async fn status(st: &AppState, q: &PageQuery) -> HttpResult<Status> {
    let rep = st.replicator();
    let state = state_named(q.state.as_deref().unwrap_or(""))?;
    let text = q.q.as_deref().unwrap_or("").trim();
    let skip = q.skip.unwrap_or(0);
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let jobs = st.status_jobs().jobs(rep).await?;
    let now_ms = rep.jobs().clock().now_ms();
    let now_s = now_ms / 1000;
    let mut matching: Vec<&JobView> = jobs.iter().filter(|j| matches(j, state, text)).collect();
    if q.sort.as_deref() == Some("lag") {
        // Furthest behind first; jobs that are not running (no lag) last.
        matching.sort_by_cached_key(|j| std::cmp::Reverse(lag_of(j)));
    }
    let rows = matching
        .iter()
        .skip(skip)
        .take(limit)
        .map(|j| row(j, now_s))
        .collect();
    let beats: HashMap<NodeName, i64> = rep
        .members()
        .await
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut nodes: Vec<NodeRow> = beats
        .iter()
        .map(|(name, beat)| NodeRow {
            name: name.clone(),
            age_ms: (now_ms - beat).max(0),
            alive: now_ms - beat < ALIVE_MS,
            this_node: name == rep.node(),
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Status {
        node: rep.node().clone(),
        now_ms,
        docs_written_total: rep.metrics().docs_written.load(Relaxed),
        counts: counts(&jobs),
        queues: queues(st).await,
        nodes,
        jobs: JobPage {
            matching: matching.len(),
            skip,
            limit,
            rows,
        },
    })
}
