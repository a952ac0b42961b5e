//! job: one actor per running replication (CouchDB 4.x's `couch_replicator_job`, RFC 016).
//!
//! Started by `job_sup` for a job an acceptor took from couch_jobs. Messages: `Start` (sent to
//! itself from `init`, so a failing start runs the terminate hook), `Tick` (stats timer:
//! `update` with fresh stats, which is also the keep-alive the activity monitor watches, and
//! healing), `CheckLock` (the same update, forced: a cancel's), `Done` (the replication
//! ended), `LeaseLost` (the lease watchdog aborted the replication: the store was not reached
//! in time, `job/lease.rs`), `Observe` (a snapshot for operators and tests).
//!
//! Start: parse the document (invalid → `failed`), compute the replication id, then in one
//! transaction claim it in the collision index (CouchDB 4.x's couch_replicator_jobs.erl) and mark the job `running` (node, pid,
//! `started` history), then run the protocol with the node's 429 limiter and a connection
//! lease from the pool.
//!
//! The terminate hook decides what the job becomes:
//! * handler error or panic → `reschedule_on_error`: transient jobs fail permanently (unless
//!   the error is `max_backoff`); persistent ones get `error_count + 1`, state `crashing`,
//!   history `crashed` + `pending`, and are resubmitted at `now + backoff` (CouchDB 4.x's couch_replicator_job.erl formula with
//!   25 % jitter); a job that ran longer than `health_threshold` is healed first;
//! * stop or shutdown → the replication writes a final checkpoint, the job goes back to
//!   `pending` scheduled `interval` later (history `stopped` + `pending`);
//! * after `finish`, a duplicate verdict, or a lost lock (`Halt`) → nothing.
//!
//! A killed actor runs no hook: its state is dropped (which aborts the replication) and the
//! activity monitor re-enqueues the job once its updates stop.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use supervisors::{BoxError, ExitReason, Server};
use tokio::time::Instant;
use tracing::Instrument;

use crate::jobs::JobsError;
use crate::replication::{self, Context, RepId, ReplicationSpec, ReplicationStats};

use super::collision::{self, Claim};
use super::error_backoff::is_healed;
use super::id::JobId;
use super::lease::{self, Lease};
use super::observe;
use super::record::{HistoryKind, JobError, RepJobRecord, RepState};
use super::runner::{self, Runner, Watchdog};
use super::view::parse_rep;
use crate::replicator::node::connection_pool::CONNECTION_POOL;
use crate::replicator::node::connection_pool::PoolMsg;
use crate::replicator::node::context::NodeCtx;
use crate::replicator::node::event_bus::ReplicatorEvent;

mod ending;
mod state;
use ending::{complete, fail, reschedule_on_error, stop_to_pending};
use state::put_stats;
pub use state::{JobActorState, JobArgs, JobMsg, JobObservation};

/// One replication's actor (stateless; everything is in [`JobActorState`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct JobActor;

impl Server for JobActor {
    type Msg = JobMsg;
    type State = JobActorState;
    type Args = JobArgs;

    async fn init(
        &self,
        myself: ActorRef<JobMsg>,
        args: JobArgs,
    ) -> Result<JobActorState, BoxError> {
        myself.send_message(JobMsg::Start)?;
        let job_id = JobId::from(&args.job.id);
        let span = observe::job_span(args.ctx.node(), &job_id, &args.record);
        let lease = Arc::new(Lease::new(args.ctx.settings().job_timeout));
        Ok(JobActorState {
            lease,
            span,
            ctx: args.ctx,
            job: args.job,
            job_id,
            record: args.record,
            rep_id: None,
            last_start: None,
            runner: None,
            done: false,
            lease_lost: false,
            error: None,
            resubmit_delay: None,
            timer: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<JobMsg>,
        msg: JobMsg,
        st: &mut JobActorState,
    ) -> Result<(), BoxError> {
        let span = st.span.clone();
        handle_msg(myself, msg, st).instrument(span).await
    }

    async fn terminate(&self, myself: ActorRef<JobMsg>, st: JobActorState, reason: ExitReason) {
        let span = st.span.clone();
        terminate_job(myself, st, reason).instrument(span).await
    }
}

/// How long the terminate hook of a job whose lease ran out tries to put it back to
/// pending: the lease ran out because the store was not reached, and the activity monitor
/// re-enqueues the job anyway.
const LEASE_LOST_BUDGET: Duration = Duration::from_secs(1);

async fn handle_msg(
    myself: ActorRef<JobMsg>,
    msg: JobMsg,
    st: &mut JobActorState,
) -> Result<(), BoxError> {
    match msg {
        JobMsg::Start => {
            // Bounded by the lease as the keep-alive is: a start stuck on an unreachable
            // store (claiming the replication id) outlasts the time other nodes wait before
            // taking the job, so it stops instead of holding the actor for the store's timeout.
            let Ok(r) = tokio::time::timeout(st.lease.remaining(), start(&myself, st)).await else {
                tracing::warn!(job = %st.job.id, "job start outlasted its lease (store unreachable?); stopping");
                st.runner = None;
                st.lease_lost = true;
                myself.stop(None);
                return Ok(());
            };
            observe::count_start(st.ctx.metrics(), st.runner.is_some(), r.is_err());
            r
        }
        JobMsg::Tick => tick(&myself, st, false).await,
        JobMsg::CheckLock => tick(&myself, st, true).await,
        JobMsg::Done(result) => match *result {
            Ok(stats) => complete(&myself, st, stats).await,
            Err(e) => {
                observe::count_run_error(st.ctx.metrics(), &e);
                let err = JobError::from(&e);
                st.error = Some(err.clone());
                st.runner = None;
                Err(err.into())
            }
        },
        JobMsg::LeaseLost => {
            // Already aborted; the terminate hook puts the job back to pending if the lock
            // is still ours (the store answers again), else it finds the lock gone.
            st.runner = None;
            st.lease_lost = true;
            myself.stop(None);
            Ok(())
        }
        JobMsg::Rotate(delay) => {
            st.resubmit_delay = Some(delay);
            myself.stop(None);
            Ok(())
        }
        JobMsg::Observe(reply) => {
            let stats = st.runner.as_ref().map(Runner::stats);
            let _ = reply.send(JobObservation {
                job_id: st.job_id.clone(),
                rep_id: st.rep_id.clone(),
                continuous: st.record.continuous,
                running: stats.is_some(),
                last_start: st.last_start,
                stats,
                error: st.error.clone(),
            });
            Ok(())
        }
    }
}

async fn terminate_job(myself: ActorRef<JobMsg>, mut st: JobActorState, reason: ExitReason) {
    release_pool(&st.ctx, &myself);
    if st.done {
        return;
    }
    observe::count_end(st.ctx.metrics(), &reason);
    let outcome = match reason {
        ExitReason::Error(text) => {
            // A typed error the handler kept, else a panic or an untyped failure.
            let err = st
                .error
                .take()
                .unwrap_or(JobError::Internal { reason: text });
            reschedule_on_error(&mut st, err).await
        }
        ExitReason::Normal | ExitReason::Shutdown if st.lease_lost => {
            // The store was just out of reach: one short try, then the job is left to the
            // activity monitor, so the actor (what `_replicator_jobs` lists) is gone soon
            // after its replication.
            match tokio::time::timeout(LEASE_LOST_BUDGET, stop_to_pending(&mut st)).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::info!(job = %st.job.id, "store unreachable; job left to the activity monitor");
                    Ok(())
                }
            }
        }
        ExitReason::Normal | ExitReason::Shutdown => stop_to_pending(&mut st).await,
    };
    match outcome {
        Ok(()) => {}
        Err(JobsError::Halt) | Err(JobsError::NotFound) => {
            tracing::debug!(job = %st.job_id, "job's lock gone at its end");
        }
        Err(e) => tracing::warn!(job = %st.job_id, error = %e, "job terminate failed"),
    }
}

fn release_pool(ctx: &NodeCtx, myself: &ActorRef<JobMsg>) {
    let _ = ctx
        .child(CONNECTION_POOL)
        .cast(PoolMsg::Release(myself.get_id()));
}

/// `Start`: the document parsed, the engine's shared parts taken, the replication id
/// computed and claimed, then the replication started.
async fn start(myself: &ActorRef<JobMsg>, st: &mut JobActorState) -> Result<(), BoxError> {
    let ctx = st.ctx.clone();
    let now = ctx.now_secs();
    let rep = serde_json::Value::Object(st.record.rep.clone());
    let mut spec = match parse_rep(&rep, &ctx.settings().job_defaults) {
        Ok(s) => s,
        Err(e) => {
            let reason = e.to_string();
            return fail(st, JobError::InvalidDocument { reason }).await;
        }
    };
    if st.record.last_error.as_ref().map(JobError::tag) == Some("max_backoff") {
        // CouchDB 4.x's couch_replicator_job.erl: after a max_backoff crash, restart gentler.
        super::error_backoff::gentler_after_max_backoff(&mut spec.options);
    }
    let began = Instant::now();
    let engine = runner::engine_context(&ctx, myself.get_cell(), &mut spec).await?;
    let context_ms = began.elapsed().as_millis() as u64;
    let rep_id = match replication::compute_id(&spec, &engine).await {
        Ok(id) => id,
        Err(e) => {
            let err = JobError::from(&e);
            st.error = Some(err.clone());
            return Err(err.into());
        }
    };
    st.span.record("rep_id", rep_id.full().as_str());
    let id_ms = began.elapsed().as_millis() as u64 - context_ms;
    if !claim(myself, st, &rep_id, &spec, now).await? {
        return Ok(());
    }
    // Where a start's time goes (the failover drill's hand-overs wait on it).
    tracing::debug!(
        context_ms,
        id_ms,
        total_ms = began.elapsed().as_millis() as u64,
        "job claimed"
    );
    launch(myself, st, spec, engine, rep_id, now);
    Ok(())
}

/// In one transaction: claims the replication id in the collision index and marks the job
/// `running` (node, pid, `started` history). False when the job ended instead (lock lost,
/// or failed as a duplicate of another document); a duplicate the job may retry is an
/// error (the job crashes).
async fn claim(
    myself: &ActorRef<JobMsg>,
    st: &mut JobActorState,
    rep_id: &RepId,
    spec: &ReplicationSpec,
    now: i64,
) -> Result<bool, BoxError> {
    let ctx = &st.ctx;
    let job_id = st.job_id.clone();
    let jobs = ctx.jobs();
    let mut record = st.record.clone();
    record.rep_id = Some(rep_id.clone());
    record.base_id = Some(rep_id.base.clone());
    record.node = Some(ctx.node().clone());
    record.pid = Some(format!("{}", myself.get_id()));
    record.last_start = Some(now);
    record.retry_at = None;
    record.set_state(RepState::Running, None, now);
    record.push_history(HistoryKind::Started, now, None, ctx.settings().max_history);
    if record.rep_stats.is_none() {
        // Listed in `_active_tasks` from the moment it runs, as CouchDB lists a new task.
        record.rep_stats = Some(first_stats(rep_id, spec, now));
    }
    let data = record.to_data();
    let job = st.job.clone();
    let began = Instant::now();
    let claimed = jobs
        .db()
        .run(|tx| {
            let (data, job, job_id) = (data.clone(), job.clone(), job_id.clone());
            async move {
                match collision::claim_tx(ctx, &tx, rep_id, &job_id).await? {
                    Claim::Owned => Ok(Ok(jobs.update_tx(&tx, &job, Some(data)).await?)),
                    other => Ok::<_, JobsError>(Err(other)),
                }
            }
        })
        .await;
    let err = match claimed {
        Err(JobsError::Halt) | Err(JobsError::NotFound) => return halt(myself, st).map(|()| false),
        Err(e) => return Err(e.into()),
        Ok(Ok(job)) => {
            st.lease.renew(began);
            st.job = job;
            st.record = record;
            return Ok(true);
        }
        // `crashing`, not failed as the archived 4.x code does: a `_replicate` call may retry
        // once the document's job is gone (docs/decisions/2026-11-22-transient-duplicate-crashing.md).
        Ok(Err(Claim::DuplicatePersistent { job_id: other, .. })) if st.record.is_transient() => {
            JobError::DuplicateJob { other }
        }
        Ok(Err(Claim::DuplicatePersistent {
            db_name, doc_id, ..
        })) => {
            let err = JobError::DuplicateDocument {
                rep_id: rep_id.clone(),
                doc_id: st
                    .record
                    .origin
                    .doc_id
                    .clone()
                    .unwrap_or(job_id.into_string()),
                other_doc: doc_id,
                db: db_name,
            };
            return fail(st, err).await.map(|()| false);
        }
        Ok(Err(Claim::DuplicateTransient(other))) => JobError::DuplicateJob { other },
        // Matched above; kept total without panicking.
        Ok(Err(Claim::Owned)) => return Err("collision claim in an impossible state".into()),
    };
    st.error = Some(err.clone());
    Err(err.into())
}

/// Starts the replication, whose end comes back as [`JobMsg::Done`], and the stats timer
/// (`Tick` every `stats_update_interval`), then announces the start.
fn launch(
    myself: &ActorRef<JobMsg>,
    st: &mut JobActorState,
    spec: ReplicationSpec,
    engine: Context,
    rep_id: RepId,
    now: i64,
) {
    st.rep_id = Some(rep_id.clone());
    st.last_start = Some(now);
    let me = myself.clone();
    let on_end = Box::new(move |result| {
        let _ = me.send_message(JobMsg::Done(Box::new(result)));
    });
    let (ctx, me, job_id) = (st.ctx.clone(), myself.clone(), st.job_id.clone());
    let watchdog = Watchdog {
        lease: st.lease.clone(),
        node_lease: st.ctx.node_lease().clone(),
        on_lost: Box::new(move || {
            // Published here, not by the actor, which may be blocked in a store call.
            ctx.publish(ReplicatorEvent::Stopped { job_id });
            let _ = me.send_message(JobMsg::LeaseLost);
        }),
    };
    st.runner = Some(Runner::start(spec, engine, on_end, watchdog));
    // Changed stats are written at most once a second, so `_active_tasks` follows progress
    // as CouchDB's task status does; an idle job's tick writes nothing (see `tick`).
    let period = st.ctx.settings().stats_update_interval.min(PROGRESS_PERIOD);
    let me = myself.clone();
    st.timer = Some(runner::every(period, move || {
        me.send_message(JobMsg::Tick).is_ok()
    }));
    st.ctx.publish(ReplicatorEvent::Started {
        job_id: st.job_id.clone(),
        rep_id,
    });
}

/// How often a running job's changed stats reach the store at most (CouchDB updates its
/// task status on progress; a shorter `stats_update_interval` makes it more often).
const PROGRESS_PERIOD: Duration = Duration::from_secs(1);

/// The stats of a job that has not reported any yet: CouchDB's task before its first
/// update (sequences `0`, no counters).
fn first_stats(rep_id: &RepId, spec: &ReplicationSpec, now: i64) -> ReplicationStats {
    let now = now.max(0) as u64;
    ReplicationStats {
        replication_id: rep_id.clone(),
        continuous: spec.options.continuous,
        source_seq: 0.into(),
        through_seq: 0.into(),
        checkpointed_source_seq: 0.into(),
        checkpoint_interval: spec.options.checkpoint_interval.as_millis() as u64,
        started_on: now,
        updated_on: now,
        ..ReplicationStats::default()
    }
}

async fn tick(
    myself: &ActorRef<JobMsg>,
    st: &mut JobActorState,
    force: bool,
) -> Result<(), BoxError> {
    let Some(stats) = st.runner.as_ref().map(Runner::stats) else {
        return Ok(());
    };
    let now = st.ctx.now_secs();
    let errors = |r: &RepJobRecord| (r.error_count, r.last_error.is_none());
    let before = errors(&st.record);
    heal(st, now);
    let changed = st.record.rep_stats.as_ref() != Some(&stats) || errors(&st.record) != before;
    // An idle job's stats do not move; rewriting them every tick was most of what 500 idle
    // running jobs cost the store. It still writes once its lease is a third of the activity
    // timeout old, or couch_jobs would re-enqueue it as dead and the lease would run out.
    let keepalive = lease::keepalive_after(st.ctx.settings().job_timeout);
    if !force && !changed && st.lease.age() < keepalive {
        return Ok(());
    }
    put_stats(st, &stats);
    st.record.last_updated = now;
    let began = Instant::now();
    // Bounded by the lease: past it the watchdog has aborted the replication and sent
    // `LeaseLost`, which this handler, stuck on an unreachable store, would otherwise hold
    // back for the store's whole transaction timeout.
    let update = st.ctx.jobs().update(&st.job, Some(st.record.to_data()));
    let Ok(updated) = tokio::time::timeout(st.lease.remaining(), update).await else {
        return Ok(());
    };
    match updated {
        Ok(job) => {
            st.lease.renew(began);
            st.job = job;
            Ok(())
        }
        Err(JobsError::Halt) | Err(JobsError::NotFound) => halt(myself, st),
        Err(e) => Err(e.into()),
    }
}

/// The lock is lost (job removed, or re-enqueued by the activity monitor): stop quietly.
fn halt(myself: &ActorRef<JobMsg>, st: &mut JobActorState) -> Result<(), BoxError> {
    tracing::info!(job = %st.job_id, "job lock lost; stopping");
    st.done = true;
    st.runner = None;
    st.ctx.publish(ReplicatorEvent::Stopped {
        job_id: st.job_id.clone(),
    });
    myself.stop(None);
    Ok(())
}

fn heal(st: &mut JobActorState, now: i64) {
    let ran = st.last_start.map_or(0, |s| now - s).max(0) as u64;
    if is_healed(Duration::from_secs(ran), st.ctx.settings().health_threshold) {
        st.record.error_count = 0;
        st.record.last_error = None;
    }
}
