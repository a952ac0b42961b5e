//! A job actor's messages, start arguments and state, shared by the actor's handlers
//! ([`super`]) and the ends of its runs ([`super::ending`]).

use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use supervisors::Observable;

use super::super::id::JobId;
use super::super::lease::Lease;
use super::super::record::{JobError, RepJobRecord};
use super::super::runner::Runner;
use crate::jobs::Job;
use crate::replication::{RepId, ReplicationError, ReplicationStats};
use crate::replicator::node::context::NodeCtx;

/// How long a stopping job waits for its final checkpoint (CouchDB gives 5 s in total).
pub(super) const STOP_CHECKPOINT_BUDGET: Duration = Duration::from_millis(4500);

/// Messages of a job actor.
#[derive(Debug)]
pub enum JobMsg {
    /// Begin (sent by `init`).
    Start,
    /// Stats / keep-alive timer.
    Tick,
    /// Update the record now even if nothing changed: a cancel asks, so that the actor of a
    /// removed job learns it lost its lock at once instead of at its next keep-alive.
    CheckLock,
    /// The replication ended.
    Done(Box<Result<ReplicationStats, ReplicationError>>),
    /// A snapshot of the job.
    Observe(RpcReplyPort<JobObservation>),
    /// Trimmed by the job server: stop, and go back to pending this much later.
    Rotate(Duration),
    /// The job's lease ran out (`job/lease.rs`): the replication was aborted.
    LeaseLost,
}

/// What [`JobMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobObservation {
    /// The couch_jobs id.
    pub job_id: JobId,
    /// The replication id, once computed.
    pub rep_id: Option<RepId>,
    /// Continuous replication.
    pub continuous: bool,
    /// The replication is running (started, not yet ended or stopping).
    pub running: bool,
    /// When the current run started (seconds, the node's clock).
    pub last_start: Option<i64>,
    /// The replication's latest progress, while it runs.
    pub stats: Option<ReplicationStats>,
    /// The error that ended the run.
    pub error: Option<JobError>,
}

impl Observable for JobMsg {
    type Observation = JobObservation;
    fn observe(reply: RpcReplyPort<JobObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// Start arguments: the accepted job and its record.
pub struct JobArgs {
    /// The node.
    pub ctx: NodeCtx,
    /// The couch_jobs job (holds the lock).
    pub job: Job,
    /// Its record at accept time.
    pub record: RepJobRecord,
}

/// One job actor's state.
pub struct JobActorState {
    pub(super) ctx: NodeCtx,
    pub(super) job: Job,
    /// `job`'s id, typed.
    pub(super) job_id: JobId,
    pub(super) record: RepJobRecord,
    pub(super) rep_id: Option<RepId>,
    pub(super) last_start: Option<i64>,
    pub(super) runner: Option<Runner>,
    /// The job needs no terminate work (finished, failed, halted).
    pub(super) done: bool,
    /// The error that ended the run, kept typed for the terminate hook (the supervisor's
    /// exit reason only carries its text).
    pub(super) error: Option<JobError>,
    /// The lease ran out and the replication was aborted: the store was not reached in time,
    /// so the terminate hook tries it only briefly (`LEASE_LOST_BUDGET`).
    pub(super) lease_lost: bool,
    /// How long a rotated job waits before it is eligible again; `None` (stopped with its
    /// node): eligible at once.
    pub(super) resubmit_delay: Option<Duration>,
    pub(super) timer: Option<tokio::task::JoinHandle<()>>,
    /// Since when this node may still run the replication without another node taking it.
    pub(super) lease: Arc<Lease>,
    /// `replication_job{job_id, rep_id, source, target}`: entered by every message handler
    /// and, through them, by the engine's tasks (changes reader, workers, checkpointer).
    pub(super) span: tracing::Span,
}

impl Drop for JobActorState {
    fn drop(&mut self) {
        if let Some(t) = &self.timer {
            t.abort();
        }
    }
}

/// Keeps the latest stats in the record (what `_active_tasks` and `_scheduler/*` show).
pub(super) fn put_stats(st: &mut JobActorState, stats: &ReplicationStats) {
    st.record.rep_stats = Some(stats.clone());
}
