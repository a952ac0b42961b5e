//! Pause and resume: an operator holds a job without losing it ([`Replicator::pause`],
//! [`Replicator::resume`]; `POST /_scheduler/jobs/{id}/_pause` and `_resume` over HTTP).
//!
//! A paused job stays in couch_jobs' queue, pending at a scheduled time no accept reaches
//! ([`PAUSED_STIME`]), with state `paused` in its record: every node shows it, none takes
//! it, and a restart or a node's failover changes nothing. It keeps its checkpoint
//! documents on the endpoints and its claim on the replication id (a duplicate stays
//! refused). Pausing a running job re-enqueues it under a new lock in the same
//! transaction, so its worker, wherever it runs, finds its lock gone at its next update
//! and stops (this node's at once) without writing anything more: what it copied since its
//! last checkpoint is copied again after the resume, as after a crash. Resuming makes the
//! job pending now, ahead of its backoff if it was crashing.

use super::Replicator;
use super::error::{ReplicatorError, ReplicatorResult};
use super::handle::not_found;
use super::job::id::JobRef;
use super::job::record::{HistoryKind, RepJobRecord};
use super::job::view::{JobView, REP_JOBS, RepState};
use crate::jobs::{JobState, JobsError, MAX_SCHED_TIME};

/// Where a paused job waits in the queue: past the latest time any accept takes (couch_jobs'
/// default `max_sched_time` included).
pub(crate) const PAUSED_STIME: i64 = MAX_SCHED_TIME + 1;

/// Which of the two is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Hold the job ([`Replicator::pause`]).
    Pause,
    /// Release it ([`Replicator::resume`]).
    Resume,
}

/// What a pause or resume transaction found.
enum Outcome {
    Done(Box<JobView>),
    Refused(RepState),
}

impl Replicator {
    /// Holds a pending, running or crashing job (see the module doc); a paused job stays
    /// paused. `NotPausable` for a completed or failed one.
    pub async fn pause(&self, id: impl Into<JobRef>) -> ReplicatorResult<JobView> {
        self.hold(id.into(), Hold::Pause).await
    }

    /// Makes a paused job pending now. `NotPausable` for a job that is not paused.
    pub async fn resume(&self, id: impl Into<JobRef>) -> ReplicatorResult<JobView> {
        self.hold(id.into(), Hold::Resume).await
    }

    /// [`Replicator::pause`] or [`Replicator::resume`].
    pub(crate) async fn hold(&self, id: JobRef, what: Hold) -> ReplicatorResult<JobView> {
        let job_id = self.resolve(&id).await?;
        let now = self.ctx.now_secs();
        let max_history = self.ctx.settings().max_history;
        let jobs = self.ctx.jobs();
        let outcome = jobs
            .db()
            .run(|tx| {
                let job_id = job_id.clone();
                async move {
                    let id = job_id.as_str();
                    let data = jobs.get_job_data_tx(&tx, REP_JOBS, id).await?;
                    let mut record = RepJobRecord::from_data(&data)?;
                    let (stime, kind) = match what {
                        Hold::Pause => {
                            let state = jobs.get_job_state_tx(&tx, REP_JOBS, id).await?;
                            if state == JobState::Finished || record.state.is_terminal() {
                                return Ok::<_, JobsError>(Outcome::Refused(record.state));
                            }
                            if state == JobState::Running {
                                jobs.requeue_running_tx(&tx, REP_JOBS, id).await?;
                            }
                            record.pid = None;
                            record.node = None;
                            record.retry_at = None;
                            (PAUSED_STIME, HistoryKind::Paused)
                        }
                        Hold::Resume if record.state != RepState::Paused => {
                            return Ok(Outcome::Refused(record.state));
                        }
                        Hold::Resume => (0, HistoryKind::Resumed),
                    };
                    // Pausing a paused job changes nothing.
                    if record.state != RepState::Paused || what == Hold::Resume {
                        let state = match what {
                            Hold::Pause => RepState::Paused,
                            Hold::Resume => RepState::Pending,
                        };
                        record.set_state(state, None, now);
                        record.push_history(kind, now, None, max_history);
                        let data = record.to_data();
                        jobs.resubmit_tx(&tx, REP_JOBS, id, Some(stime), Some(data))
                            .await?;
                    }
                    Ok(Outcome::Done(Box::new(JobView::from_record(
                        &job_id, &record,
                    ))))
                }
            })
            .await
            .map_err(|e| not_found(e, &id))?;
        let view = match outcome {
            Outcome::Done(view) => *view,
            Outcome::Refused(state) => {
                let wanted = match what {
                    Hold::Pause => "only a pending, running or crashing job pauses",
                    Hold::Resume => "only a paused job resumes",
                };
                return Err(ReplicatorError::NotPausable {
                    job: job_id,
                    state,
                    wanted,
                });
            }
        };
        if what == Hold::Pause {
            self.wait_local_actor_gone(&view.job_id).await;
        }
        tracing::info!(job = %view.job_id, action = ?what, "replication job held or released");
        Ok(view)
    }
}
