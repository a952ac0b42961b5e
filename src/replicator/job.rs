//! job: one actor per running replication (CouchDB 4.x's couch_replicator_job.erl; CouchDB 4.x's couch_replicator, RFC 016ouchDB's `couch_replicator_job`).
//!
//! Started by `job_sup` for a job an acceptor took from couch_jobs. Messages: `Start` (sent to
//! itself from `init`, so a failing start runs the terminate hook), `Tick` (stats timer:
//! `update` with fresh stats, which is also the keep-alive the activity monitor watches, and
//! healing), `Done` (the replication ended), `Observe` (a snapshot for operators and tests).
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

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use supervisors::{BoxError, ExitReason, Observable, Server};
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use crate::jobs::{Job, JobData, JobsError};
use crate::replication::transport::Transports;
use crate::replication::{self, Context, ReplicationError, ReplicationStats};

use super::backoff::{is_healed, jittered, penalty};
use super::collision::{self, Claim};
use super::connection_pool::{PoolMsg, endpoint_key};
use super::context::{NodeCtx, ids};
use super::event_bus::ReplicatorEvent;
use super::job_observe;
use super::rate_limiter::{RateLimiterMsg, SharedAimd};
use super::rep_job::{self, REP_JOBS, RepState, parse_rep, push_history, set_state};
use crate::telemetry::Series;

/// How long a stopping job waits for its final checkpoint (CouchDB gives 5 s in total).
const STOP_CHECKPOINT_BUDGET: Duration = Duration::from_millis(4500);

/// Messages of a job actor.
#[derive(Debug)]
pub enum JobMsg {
    /// Begin (sent by `init`).
    Start,
    /// Stats / keep-alive timer.
    Tick,
    /// The replication ended.
    Done(Box<Result<ReplicationStats, ReplicationError>>),
    /// A snapshot of the job.
    Observe(RpcReplyPort<JobObservation>),
    /// Trimmed by the job server: stop, and go back to pending this much later.
    Rotate(Duration),
}

/// What [`JobMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobObservation {
    /// The couch_jobs id.
    pub job_id: String,
    /// The replication id, once computed.
    pub rep_id: Option<String>,
    /// Continuous replication.
    pub continuous: bool,
    /// The replication is running (started, not yet ended or stopping).
    pub running: bool,
    /// When the current run started (seconds, the node's clock).
    pub last_start: Option<i64>,
    /// The replication's latest progress, while it runs.
    pub stats: Option<ReplicationStats>,
    /// The reason tag of the error that ended the run (`max_backoff`, ...).
    pub error: Option<String>,
}

impl Observable for JobMsg {
    type Observation = JobObservation;
    fn observe(reply: RpcReplyPort<JobObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// Start arguments: the accepted job and its data.
pub struct JobArgs {
    /// The node.
    pub ctx: NodeCtx,
    /// The couch_jobs job (holds the lock).
    pub job: Job,
    /// Its data at accept time.
    pub data: JobData,
}

/// The job server (stateless; everything is in [`JobActorState`]).
#[derive(Debug, Clone, Default)]
pub struct JobActor;

/// A running replication: the waiter task owns the engine handle; dropping this aborts it.
struct Runner {
    stop: Option<oneshot::Sender<()>>,
    progress: watch::Receiver<ReplicationStats>,
    task: tokio::task::JoinHandle<Option<ReplicationStats>>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One job actor's state.
pub struct JobActorState {
    ctx: NodeCtx,
    job: Job,
    data: JobData,
    rep_id: Option<String>,
    last_start: Option<i64>,
    runner: Option<Runner>,
    /// The job needs no terminate work (finished, failed, halted).
    done: bool,
    /// The reason tag of the error that ended the run (`max_backoff`, ...).
    error_tag: Option<&'static str>,
    /// How long a stopped job waits before it is eligible again (default `interval`).
    resubmit_delay: Option<Duration>,
    timer: Option<tokio::task::JoinHandle<()>>,
    /// `replication_job{job_id, rep_id, source, target}`: entered by every message handler
    /// and, through them, by the engine's tasks (changes reader, workers, checkpointer).
    span: tracing::Span,
}

impl Drop for JobActorState {
    fn drop(&mut self) {
        if let Some(t) = &self.timer {
            t.abort();
        }
    }
}

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
        let span = job_observe::job_span(args.ctx.node(), &args.job.id, &args.data);
        Ok(JobActorState {
            span,
            ctx: args.ctx,
            job: args.job,
            data: args.data,
            rep_id: None,
            last_start: None,
            runner: None,
            done: false,
            error_tag: None,
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

async fn handle_msg(
    myself: ActorRef<JobMsg>,
    msg: JobMsg,
    st: &mut JobActorState,
) -> Result<(), BoxError> {
    match msg {
        JobMsg::Start => {
            let r = start(&myself, st).await;
            job_observe::count_start(st.ctx.metrics(), st.runner.is_some(), r.is_err());
            r
        }
        JobMsg::Tick => tick(&myself, st).await,
        JobMsg::Done(result) => match *result {
            Ok(stats) => complete(&myself, st, stats).await,
            Err(e) => {
                job_observe::count_run_error(st.ctx.metrics(), &e);
                st.error_tag = Some(e.reason());
                st.runner = None;
                Err(e.to_string().into())
            }
        },
        JobMsg::Rotate(delay) => {
            st.resubmit_delay = Some(delay);
            myself.stop(None);
            Ok(())
        }
        JobMsg::Observe(reply) => {
            let stats = st.runner.as_ref().map(|r| r.progress.borrow().clone());
            let _ = reply.send(JobObservation {
                job_id: st.job.id.clone(),
                rep_id: st.rep_id.clone(),
                continuous: st
                    .data
                    .get("continuous")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                running: stats.is_some(),
                last_start: st.last_start,
                stats,
                error: st.error_tag.map(str::to_owned),
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
    job_observe::count_end(st.ctx.metrics(), &reason);
    let outcome = match reason {
        ExitReason::Error(text) => reschedule_on_error(&mut st, &text).await,
        ExitReason::Normal | ExitReason::Shutdown => stop_to_pending(&mut st).await,
    };
    match outcome {
        Ok(()) | Err(JobsError::Halt) | Err(JobsError::NotFound) => {}
        Err(e) => tracing::warn!(job = %st.job.id, error = %e, "job terminate failed"),
    }
}

fn release_pool(ctx: &NodeCtx, myself: &ActorRef<JobMsg>) {
    let _ = ctx
        .child::<PoolMsg>(ids::CONNECTION_POOL)
        .cast(PoolMsg::Release(myself.get_id()));
}

async fn start(myself: &ActorRef<JobMsg>, st: &mut JobActorState) -> Result<(), BoxError> {
    let ctx = st.ctx.clone();
    let now = ctx.now_secs();
    let rep = st.data.get("rep").cloned().unwrap_or(Value::Null);
    let mut spec = match parse_rep(&rep, &ctx.settings().job_defaults) {
        Ok(s) => s,
        Err(e) => return fail(st, &e.to_string()).await,
    };
    if rep_job::str_field(&st.data, "last_error") == Some("max_backoff") {
        // CouchDB 4.x's couch_replicator_job.erl: after a max_backoff crash, restart gentler.
        super::backoff::gentler_after_max_backoff(&mut spec.options);
    }
    let limiter = match ractor::call!(
        ctx.child::<RateLimiterMsg>(ids::RATE_LIMITER)
            .get()
            .ok_or("rate_limiter is not running")?,
        RateLimiterMsg::Table
    ) {
        Ok(t) => t,
        Err(e) => return Err(format!("rate_limiter: {e}").into()),
    };
    spec.options.http_connections = lease(&ctx, myself, &spec).await;
    let engine = Context {
        server_uuid: ctx.server_uuid().to_owned(),
        limiter: std::sync::Arc::new(limiter) as std::sync::Arc<SharedAimd>,
        transports: shared_clients(&ctx).await,
        metrics: ctx.metrics().clone(),
    };
    let rep_id = match replication::compute_id(&spec, &engine).await {
        Ok(id) => id,
        Err(e) => {
            st.error_tag = Some(e.reason());
            return Err(e.to_string().into());
        }
    };
    let full = rep_id.full();
    st.span.record("rep_id", full.as_str());
    let job_id = st.job.id.clone();
    let pid = format!("{}", myself.get_id());
    let jobs = ctx.jobs();
    let mut data = st.data.clone();
    data.insert("rep_id".into(), json!(full));
    data.insert("base_id".into(), json!(rep_id.base));
    data.insert("node".into(), json!(ctx.node()));
    data.insert("pid".into(), json!(pid));
    data.insert("last_start".into(), json!(now));
    set_state(&mut data, RepState::Running, None, now);
    push_history(&mut data, "started", now, None, ctx.settings().max_history);
    let job = st.job.clone();
    let claimed = jobs
        .db()
        .run(|tx| {
            let (data, job, full, job_id, ctx) = (
                data.clone(),
                job.clone(),
                full.clone(),
                job_id.clone(),
                &ctx,
            );
            async move {
                match collision::claim_tx(ctx, &tx, &full, &job_id).await? {
                    Claim::Owned => Ok(Ok(jobs.update_tx(&tx, &job, Some(data)).await?)),
                    other => Ok::<_, JobsError>(Err(other)),
                }
            }
        })
        .await;
    match claimed {
        Err(JobsError::Halt) | Err(JobsError::NotFound) => return halt(myself, st),
        Err(e) => return Err(e.into()),
        Ok(Err(Claim::DuplicatePersistent(other))) if rep_job::is_transient(&st.data) => {
            // The issue asks for `crashing` here (the archived 4.x code fails it): a
            // `_replicate` call may retry once the document's job is gone.
            st.error_tag = Some("duplicate_job");
            return Err(format!("Duplicate job running: {other}").into());
        }
        Ok(Err(Claim::DuplicatePersistent(other))) => {
            let reason = format!(
                "Replication `{full}` specified by document `{job_id}` already started, \
                 triggered by document `{other}`"
            );
            return fail(st, &reason).await;
        }
        Ok(Err(Claim::DuplicateTransient(other))) => {
            st.error_tag = Some("duplicate_job");
            return Err(format!("Duplicate job running: {other}").into());
        }
        Ok(Err(Claim::Owned)) => return unreachable_claim(),
        Ok(Ok(job)) => {
            st.job = job;
            st.data = data;
        }
    }
    st.rep_id = Some(full.clone());
    st.last_start = Some(now);
    let handle = replication::start(spec, engine);
    let progress = handle.progress();
    let (stop_tx, stop_rx) = oneshot::channel();
    let task = tokio::spawn(wait_end(handle, stop_rx, myself.clone()).in_current_span());
    st.runner = Some(Runner {
        stop: Some(stop_tx),
        progress,
        task,
    });
    let period = Duration::from_secs(ctx.settings().stats_update_interval_sec.max(1));
    let me = myself.clone();
    st.timer = Some(tokio::spawn(async move {
        let mut t = tokio::time::interval(period);
        t.tick().await;
        loop {
            t.tick().await;
            if me.send_message(JobMsg::Tick).is_err() {
                return;
            }
        }
    }));
    ctx.publish(ReplicatorEvent::Started {
        job_id: st.job.id.clone(),
        rep_id: full,
    });
    Ok(())
}

/// `Claim::Owned` is matched before; kept total without panicking.
fn unreachable_claim() -> Result<(), BoxError> {
    Err("collision claim in an impossible state".into())
}

/// The node's shared HTTP clients; without a pool (it is restarting) the job opens its own.
async fn shared_clients(ctx: &NodeCtx) -> Option<std::sync::Arc<Transports>> {
    let pool = ctx.child::<PoolMsg>(ids::CONNECTION_POOL).get()?;
    ractor::call!(pool, PoolMsg::Clients).ok()
}

/// Leases connections for both endpoints; the job uses the smaller grant.
async fn lease(
    ctx: &NodeCtx,
    myself: &ActorRef<JobMsg>,
    spec: &replication::ReplicationSpec,
) -> usize {
    let want = spec.options.http_connections;
    let Some(pool) = ctx.child::<PoolMsg>(ids::CONNECTION_POOL).get() else {
        return want;
    };
    let mut granted = want;
    for ep in [&spec.source, &spec.target] {
        let endpoint = endpoint_key(ep.parsed_url());
        let owner = myself.get_cell();
        if let Ok(l) = ractor::call!(pool, |reply| PoolMsg::Acquire {
            endpoint,
            owner,
            want,
            reply
        }) {
            granted = granted.min(l.granted);
        }
    }
    granted.max(1)
}

/// Owns the engine handle: waits for its end (reported as [`JobMsg::Done`]) or for a stop
/// request (the engine checkpoints and stops; the final stats are returned instead).
async fn wait_end(
    handle: replication::ReplicationHandle,
    mut stop: oneshot::Receiver<()>,
    me: ActorRef<JobMsg>,
) -> Option<ReplicationStats> {
    let mut progress = handle.progress();
    let stopped = loop {
        tokio::select! {
            _ = &mut stop => { handle.stop(); break true; }
            changed = progress.changed() => if changed.is_err() { break false; },
        }
    };
    let result = handle.wait().await;
    if stopped {
        return result.ok();
    }
    let _ = me.send_message(JobMsg::Done(Box::new(result)));
    None
}

/// Fills stats into the job data (`rep_stats`, `active_task_info`).
fn put_stats(st: &mut JobActorState, stats: &ReplicationStats) {
    let mut task = stats.to_active_task();
    if let Some(m) = task.as_object_mut() {
        m.insert(
            "database".into(),
            st.data.get("db_name").cloned().unwrap_or(Value::Null),
        );
        m.insert(
            "doc_id".into(),
            st.data.get("doc_id").cloned().unwrap_or(Value::Null),
        );
        m.insert("node".into(), json!(st.ctx.node()));
        m.insert(
            "pid".into(),
            st.data.get("pid").cloned().unwrap_or(Value::Null),
        );
        m.insert("job_id".into(), json!(st.job.id));
    }
    st.data.insert(
        "rep_stats".into(),
        serde_json::to_value(stats).unwrap_or(Value::Null),
    );
    st.data.insert("active_task_info".into(), task);
}

async fn tick(myself: &ActorRef<JobMsg>, st: &mut JobActorState) -> Result<(), BoxError> {
    let Some(stats) = st.runner.as_ref().map(|r| r.progress.borrow().clone()) else {
        return Ok(());
    };
    let now = st.ctx.now_secs();
    put_stats(st, &stats);
    heal(st, now);
    st.data.insert("last_updated".into(), json!(now));
    match st.ctx.jobs().update(&st.job, Some(st.data.clone())).await {
        Ok(job) => {
            st.job = job;
            Ok(())
        }
        Err(JobsError::Halt) | Err(JobsError::NotFound) => halt(myself, st),
        Err(e) => Err(e.into()),
    }
}

/// The lock is lost (job removed, or re-enqueued by the activity monitor): stop quietly.
fn halt(myself: &ActorRef<JobMsg>, st: &mut JobActorState) -> Result<(), BoxError> {
    tracing::info!(job = %st.job.id, "job lock lost; stopping");
    st.done = true;
    st.runner = None;
    st.ctx.publish(ReplicatorEvent::Stopped {
        job_id: st.job.id.clone(),
    });
    myself.stop(None);
    Ok(())
}

fn heal(st: &mut JobActorState, now: i64) {
    let ran = st.last_start.map_or(0, |s| now - s).max(0) as u64;
    if is_healed(
        Duration::from_secs(ran),
        st.ctx.settings().health_threshold(),
    ) {
        st.data.insert("error_count".into(), json!(0));
        st.data.insert("last_error".into(), Value::Null);
    }
}

/// A one-shot replication reached the end of the feed.
async fn complete(
    myself: &ActorRef<JobMsg>,
    st: &mut JobActorState,
    stats: ReplicationStats,
) -> Result<(), BoxError> {
    st.runner = None;
    let now = st.ctx.now_secs();
    put_stats(st, &stats);
    st.data.insert("active_task_info".into(), Value::Null);
    // CouchDB keeps the checkpoint record as the job's result (the `_replicate` answer).
    let history = match &stats.checkpoint_record {
        Some(record) => record.clone(),
        None => json!([serde_json::to_value(&stats)?]),
    };
    st.data.insert("checkpoint_history".into(), history);
    st.data.insert("error_count".into(), json!(0));
    set_state(&mut st.data, RepState::Completed, None, now);
    finish(st).await?;
    st.ctx.publish(ReplicatorEvent::Finished {
        job_id: st.job.id.clone(),
        rep_id: st.rep_id.clone().unwrap_or_default(),
        stats: serde_json::to_value(&stats)?,
    });
    myself.stop(None);
    Ok(())
}

/// Finishes the job with the current data and releases its replication id.
async fn finish(st: &mut JobActorState) -> Result<(), JobsError> {
    st.done = true;
    let (ctx, job, data, rep_id) = (&st.ctx, &st.job, &st.data, st.rep_id.clone());
    ctx.jobs()
        .db()
        .run(|tx| {
            let rep_id = rep_id.clone();
            async move {
                if let Some(r) = rep_id {
                    collision::release_tx(ctx, &tx, &r, &job.id).await?;
                }
                ctx.jobs().finish_tx(&tx, job, Some(data.clone())).await
            }
        })
        .await
}

/// Fails the job permanently with `reason`.
async fn fail(st: &mut JobActorState, reason: &str) -> Result<(), BoxError> {
    // Only `start` fails a job this way (invalid document, duplicate of another document).
    st.ctx.metrics().inc(Series::FailedStarts);
    let now = st.ctx.now_secs();
    set_state(&mut st.data, RepState::Failed, Some(json!(reason)), now);
    st.data.insert("active_task_info".into(), Value::Null);
    match finish(st).await {
        Ok(()) | Err(JobsError::Halt) | Err(JobsError::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    st.ctx.publish(ReplicatorEvent::Failed {
        job_id: st.job.id.clone(),
        reason: reason.to_owned(),
    });
    st.runner = None;
    Ok(())
}

async fn reschedule_on_error(st: &mut JobActorState, reason: &str) -> Result<(), JobsError> {
    st.runner = None;
    let now = st.ctx.now_secs();
    let tag = st.error_tag.unwrap_or("error");
    if let Some(started) = st.last_start
        && is_healed(
            Duration::from_secs((now - started).max(0) as u64),
            st.ctx.settings().health_threshold(),
        )
    {
        st.data.insert("error_count".into(), json!(0));
    }
    let transient_retry = matches!(tag, "max_backoff" | "duplicate_job");
    if rep_job::is_transient(&st.data) && !transient_retry {
        set_state(&mut st.data, RepState::Failed, Some(json!(reason)), now);
        st.data.insert("active_task_info".into(), Value::Null);
        finish(st).await?;
        st.ctx.publish(ReplicatorEvent::Failed {
            job_id: st.job.id.clone(),
            reason: reason.to_owned(),
        });
        return Ok(());
    }
    let errors = rep_job::int_field(&st.data, "error_count").max(0) as u32 + 1;
    let s = st.ctx.settings();
    let wait = jittered(
        penalty(errors, s.min_backoff_penalty(), s.max_backoff_penalty()),
        &mut rand::rng(),
    );
    let max_history = s.max_history;
    st.data.insert("error_count".into(), json!(errors));
    st.data.insert("last_error".into(), json!(tag));
    st.data.insert("active_task_info".into(), Value::Null);
    set_state(&mut st.data, RepState::Crashing, Some(json!(reason)), now);
    push_history(&mut st.data, "crashed", now, Some(reason), max_history);
    push_history(&mut st.data, "pending", now, None, max_history);
    let stime = now + wait.as_secs_f64().ceil() as i64;
    st.data.insert("retry_at".into(), json!(stime));
    tracing::warn!(job = %st.job.id, errors, backoff_s = stime - now, %reason, "job crashed");
    resubmit(st, stime).await?;
    st.ctx.publish(ReplicatorEvent::Crashed {
        job_id: st.job.id.clone(),
        reason: reason.to_owned(),
    });
    Ok(())
}

/// Stopped by the job server or a shutdown: final checkpoint, back to pending later.
async fn stop_to_pending(st: &mut JobActorState) -> Result<(), JobsError> {
    if let Some(mut runner) = st.runner.take() {
        if let Some(stop) = runner.stop.take() {
            let _ = stop.send(());
        }
        let stats = runner.progress.borrow().clone();
        match tokio::time::timeout(STOP_CHECKPOINT_BUDGET, &mut runner.task).await {
            Ok(Ok(Some(final_stats))) => put_stats(st, &final_stats),
            _ => put_stats(st, &stats),
        }
    }
    let now = st.ctx.now_secs();
    let max_history = st.ctx.settings().max_history;
    st.data.insert("active_task_info".into(), Value::Null);
    set_state(&mut st.data, RepState::Pending, None, now);
    push_history(&mut st.data, "stopped", now, None, max_history);
    push_history(&mut st.data, "pending", now, None, max_history);
    let delay = st
        .resubmit_delay
        .unwrap_or_else(|| st.ctx.settings().interval());
    let stime = now + delay.as_secs().max(1) as i64;
    resubmit(st, stime).await?;
    st.ctx.publish(ReplicatorEvent::Stopped {
        job_id: st.job.id.clone(),
    });
    Ok(())
}

/// Resubmit at `stime` and finish in one transaction, so the job is pending again but not
/// accepted before `stime`.
async fn resubmit(st: &mut JobActorState, stime: i64) -> Result<(), JobsError> {
    st.done = true;
    let (jobs, job, data) = (st.ctx.jobs(), &st.job, &st.data);
    jobs.db()
        .run(|tx| async move {
            jobs.resubmit_tx(&tx, REP_JOBS, &job.id, Some(stime), Some(data.clone()))
                .await?;
            jobs.finish_tx(&tx, job, Some(data.clone())).await
        })
        .await
}
