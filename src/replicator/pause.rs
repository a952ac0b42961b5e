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
use super::job::id::{JobId, JobRef};
use super::job::record::{HistoryKind, RepJobRecord};
use super::job::view::{JobView, REP_JOBS, RepState};
use crate::jobs::{JobState, JobsError, MAX_SCHED_TIME};

/// Where a paused job waits in the queue: past the latest time any accept takes (couch_jobs'
/// default `max_sched_time` included).
pub(crate) const PAUSED_STIME: i64 = MAX_SCHED_TIME + 1;

/// What a pause or resume transaction found.
enum Outcome {
    Done(Box<JobView>),
    Refused(RepState),
}

impl Replicator {
    /// Holds a pending, running or crashing job (see the module doc); a paused job stays
    /// paused. `NotPausable` for a completed or failed one.
    pub async fn pause(&self, id: impl Into<JobRef>) -> ReplicatorResult<JobView> {
        let id = id.into();
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
                    let mut record =
                        RepJobRecord::from_data(&jobs.get_job_data_tx(&tx, REP_JOBS, id).await?)?;
                    let state = jobs.get_job_state_tx(&tx, REP_JOBS, id).await?;
                    if state == JobState::Finished || record.state.is_terminal() {
                        return Ok::<_, JobsError>(Outcome::Refused(record.state));
                    }
                    if record.state != RepState::Paused {
                        if state == JobState::Running {
                            jobs.requeue_running_tx(&tx, REP_JOBS, id).await?;
                        }
                        record.pid = None;
                        record.node = None;
                        record.retry_at = None;
                        record.set_state(RepState::Paused, None, now);
                        record.push_history(HistoryKind::Paused, now, None, max_history);
                        let data = record.to_data();
                        jobs.resubmit_tx(&tx, REP_JOBS, id, Some(PAUSED_STIME), Some(data))
                            .await?;
                    }
                    Ok(Outcome::Done(Box::new(JobView::from_record(
                        &job_id, &record,
                    ))))
                }
            })
            .await
            .map_err(|e| not_found(e, &id))?;
        match outcome {
            Outcome::Done(view) => {
                self.wait_local_actor_gone(&view.job_id).await;
                tracing::info!(job = %view.job_id, "replication job paused");
                Ok(*view)
            }
            Outcome::Refused(state) => Err(refused(
                job_id,
                state,
                "only a pending, running or crashing job pauses",
            )),
        }
    }

    /// Makes a paused job pending now. `NotPausable` for a job that is not paused.
    pub async fn resume(&self, id: impl Into<JobRef>) -> ReplicatorResult<JobView> {
        let id = id.into();
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
                    let mut record =
                        RepJobRecord::from_data(&jobs.get_job_data_tx(&tx, REP_JOBS, id).await?)?;
                    if record.state != RepState::Paused {
                        return Ok::<_, JobsError>(Outcome::Refused(record.state));
                    }
                    record.set_state(RepState::Pending, None, now);
                    record.push_history(HistoryKind::Resumed, now, None, max_history);
                    let data = record.to_data();
                    jobs.resubmit_tx(&tx, REP_JOBS, id, Some(0), Some(data))
                        .await?;
                    Ok(Outcome::Done(Box::new(JobView::from_record(
                        &job_id, &record,
                    ))))
                }
            })
            .await
            .map_err(|e| not_found(e, &id))?;
        match outcome {
            Outcome::Done(view) => {
                tracing::info!(job = %view.job_id, "replication job resumed");
                Ok(*view)
            }
            Outcome::Refused(state) => Err(refused(job_id, state, "only a paused job resumes")),
        }
    }
}

fn refused(job: JobId, state: RepState, wanted: &'static str) -> ReplicatorError {
    ReplicatorError::NotPausable { job, state, wanted }
}
