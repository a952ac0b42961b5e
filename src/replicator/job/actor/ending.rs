//! How a job actor's run ends, each as CouchDB 4.x's `couch_replicator_job` records it: a
//! one-shot replication completed, a permanent failure, a crash rescheduled with backoff, or
//! a stop back to `pending` (each finishing or resubmitting the couch_jobs job in one
//! transaction).

use std::time::Duration;

use ractor::ActorRef;
use serde_json::json;
use supervisors::BoxError;

use super::super::collision;
use super::super::error_backoff::{is_healed, jittered, penalty};
use super::super::record::{HistoryKind, JobError, RepState};
use super::super::view::REP_JOBS;
use super::state::{JobActorState, JobMsg, STOP_CHECKPOINT_BUDGET, put_stats};
use crate::jobs::JobsError;
use crate::replication::ReplicationStats;
use crate::replicator::node::event_bus::ReplicatorEvent;
use crate::telemetry::Series;

/// A one-shot replication reached the end of the feed.
pub(super) async fn complete(
    myself: &ActorRef<JobMsg>,
    st: &mut JobActorState,
    stats: ReplicationStats,
) -> Result<(), BoxError> {
    st.runner = None;
    let now = st.ctx.now_secs();
    put_stats(st, &stats);
    // CouchDB keeps the checkpoint record as the job's result (the `_replicate` answer).
    st.record.checkpoint_history = match &stats.checkpoint_record {
        Some(record) => record.clone(),
        None => json!([serde_json::to_value(&stats)?]),
    };
    st.record.error_count = 0;
    st.record.set_state(RepState::Completed, None, now);
    finish(st).await?;
    st.ctx.publish(ReplicatorEvent::Finished {
        job_id: st.job_id.clone(),
        rep_id: st.rep_id.clone().unwrap_or_default(),
        stats: Box::new(stats.clone()),
    });
    myself.stop(None);
    Ok(())
}

/// Finishes the job with the current data and releases its replication id.
pub(super) async fn finish(st: &mut JobActorState) -> Result<(), JobsError> {
    st.done = true;
    let (ctx, job, job_id) = (&st.ctx, &st.job, &st.job_id);
    let (data, rep_id) = (st.record.to_data(), st.rep_id.clone());
    ctx.jobs()
        .db()
        .run(|tx| {
            let (rep_id, data) = (rep_id.clone(), data.clone());
            async move {
                if let Some(r) = rep_id {
                    collision::release_tx(ctx, &tx, &r, job_id).await?;
                }
                ctx.jobs().finish_tx(&tx, job, Some(data.clone())).await
            }
        })
        .await
}

/// Fails the job permanently with `err`.
pub(super) async fn fail(st: &mut JobActorState, err: JobError) -> Result<(), BoxError> {
    // Only `start` fails a job this way (invalid document, duplicate of another document).
    st.ctx.metrics().inc(Series::FailedStarts);
    let now = st.ctx.now_secs();
    st.record.error_count = 1;
    st.record
        .set_state(RepState::Failed, Some(err.clone()), now);
    match finish(st).await {
        Ok(()) | Err(JobsError::Halt) | Err(JobsError::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    st.ctx.publish(ReplicatorEvent::Failed {
        job_id: st.job_id.clone(),
        error: err,
    });
    st.runner = None;
    Ok(())
}

pub(super) async fn reschedule_on_error(
    st: &mut JobActorState,
    err: JobError,
) -> Result<(), JobsError> {
    st.runner = None;
    let now = st.ctx.now_secs();
    let reason = err.to_string();
    if let Some(started) = st.last_start
        && is_healed(
            Duration::from_secs((now - started).max(0) as u64),
            st.ctx.settings().health_threshold,
        )
    {
        st.record.error_count = 0;
    }
    if st.record.is_transient() && !err.transient_job_retries() {
        st.record.error_count = 1;
        st.record
            .set_state(RepState::Failed, Some(err.clone()), now);
        finish(st).await?;
        st.ctx.publish(ReplicatorEvent::Failed {
            job_id: st.job_id.clone(),
            error: err,
        });
        return Ok(());
    }
    let errors = st.record.error_count.saturating_add(1);
    let s = st.ctx.settings();
    let wait = jittered(
        penalty(errors, s.min_backoff_penalty, s.max_backoff_penalty),
        &mut rand::rng(),
    );
    let max_history = s.max_history;
    let stime = now + wait.as_secs_f64().ceil() as i64;
    let r = &mut st.record;
    r.error_count = errors;
    r.last_error = Some(err.clone());
    r.pid = None;
    r.retry_at = Some(stime);
    r.set_state(RepState::Crashing, Some(err.clone()), now);
    // CouchDB shows no event for going back to pending: tools read the crash's reason
    // from `history[0]`.
    r.push_history(HistoryKind::Crashed, now, Some(reason.clone()), max_history);
    tracing::warn!(job = %st.job_id, errors, backoff_s = stime - now, %reason, "job crashed");
    resubmit(st, stime).await?;
    st.ctx.publish(ReplicatorEvent::Crashed {
        job_id: st.job_id.clone(),
        error: err,
    });
    Ok(())
}

/// Stopped by the job server or a shutdown: final checkpoint, back to pending later.
pub(super) async fn stop_to_pending(st: &mut JobActorState) -> Result<(), JobsError> {
    if let Some(runner) = st.runner.take() {
        let stats = runner.stop(STOP_CHECKPOINT_BUDGET).await;
        put_stats(st, &stats);
    }
    let now = st.ctx.now_secs();
    let max_history = st.ctx.settings().max_history;
    let r = &mut st.record;
    r.pid = None;
    r.set_state(RepState::Pending, None, now);
    r.push_history(HistoryKind::Stopped, now, None, max_history);
    // Rotated out: after the delay the rotation chose. Handed back to another node, or
    // stopped with its node (SIGTERM, a rolling restart): at once (scheduled at 0, due on
    // every node whatever its clock), so another node takes it without waiting an interval
    // (it waited 61 s before).
    let stime = match st.resubmit_delay {
        Some(delay) if !delay.is_zero() => now + delay.as_secs().max(1) as i64,
        _ => 0,
    };
    resubmit(st, stime).await?;
    tracing::debug!(job = %st.job_id, stime, "job back in the queue");
    st.ctx.publish(ReplicatorEvent::Stopped {
        job_id: st.job_id.clone(),
    });
    Ok(())
}

/// Resubmit at `stime` and finish in one transaction, so the job is pending again but not
/// accepted before `stime`.
pub(super) async fn resubmit(st: &mut JobActorState, stime: i64) -> Result<(), JobsError> {
    st.done = true;
    // A queued job names no node: a node that stops hands back what still names it after
    // its job actors are gone (`Membership::requeue_rest_of`), and a job taken by another
    // node keeps this name until that node stamps its own. Named, it was handed back from
    // under the node that had just taken it (a 10.4 s pause in the cluster bench's drill).
    st.record.node = None;
    let (jobs, job, data) = (st.ctx.jobs(), &st.job, &st.record.to_data());
    jobs.db()
        .run(|tx| async move {
            jobs.resubmit_tx(&tx, REP_JOBS, &job.id, Some(stime), Some(data.clone()))
                .await?;
            jobs.finish_tx(&tx, job, Some(data.clone())).await
        })
        .await
}
