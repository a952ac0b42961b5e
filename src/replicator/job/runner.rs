//! What a job actor runs: the replication engine with the node's shared parts (the 429
//! limiter table, a connection lease from the pool, the pool's shared clients), the task
//! that owns the engine handle until it ends or is stopped, and the job's stats timer.
//! Kept apart from the actor so the actor file holds only its state changes; it reports
//! back through callbacks, never through the actor's message type.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorCell;
use supervisors::BoxError;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::replication::http::transport::Transports;
use crate::replication::{self, Context, ReplicationError, ReplicationSpec, ReplicationStats};

use super::lease::Lease;
use crate::replication::Aimd;
use crate::replicator::node::connection_pool::CONNECTION_POOL;
use crate::replicator::node::connection_pool::{PoolMsg, endpoint_key};
use crate::replicator::node::context::NodeCtx;
use crate::replicator::node::rate_limiter_actor::RATE_LIMITER;
use crate::replicator::node::rate_limiter_actor::RateLimiterMsg;

/// How a replication that ended on its own (not stopped) is reported to the job.
pub(crate) type OnEnd = Box<dyn FnOnce(Result<ReplicationStats, ReplicationError>) + Send>;

/// The job's lease, and what to tell the job when it runs out (the replication is then
/// already aborted).
pub(crate) struct Watchdog {
    /// The job's lease (renewed by its updates).
    pub(crate) lease: Arc<Lease>,
    /// The node's (renewed by its heartbeats: a neighbour re-enqueues a dead node's jobs).
    pub(crate) node_lease: Arc<Lease>,
    /// Called once the replication was aborted for a lost lease.
    pub(crate) on_lost: Box<dyn FnOnce() + Send>,
}

/// The engine context for a job owned by `owner`: the node's 429 limiter table, the
/// connections leased for both endpoints (which lowers `spec`'s `http_connections` to the
/// grant), and the pool's shared clients.
pub(crate) async fn engine_context(
    ctx: &NodeCtx,
    owner: ActorCell,
    spec: &mut ReplicationSpec,
) -> Result<Context, BoxError> {
    let limiter = match ractor::call!(
        ctx.child(RATE_LIMITER)
            .get()
            .ok_or("rate_limiter is not running")?,
        RateLimiterMsg::Table
    ) {
        Ok(t) => t,
        Err(e) => return Err(format!("rate_limiter: {e}").into()),
    };
    spec.options.http_connections = lease(ctx, owner, spec).await;
    Ok(Context {
        server_uuid: ctx.server_uuid().to_owned(),
        limiter: Arc::new(limiter) as Arc<Aimd>,
        transports: shared_clients(ctx).await,
        metrics: ctx.metrics().clone(),
        response_budget: ctx.response_budget().clone(),
        ..Context::default()
    })
}

/// The node's shared HTTP clients; without a pool (it is restarting) the job opens its own.
async fn shared_clients(ctx: &NodeCtx) -> Option<Arc<Transports>> {
    let pool = ctx.child(CONNECTION_POOL).get()?;
    ractor::call!(pool, PoolMsg::Clients).ok()
}

/// Leases connections for both endpoints; the job uses the smaller grant.
async fn lease(ctx: &NodeCtx, owner: ActorCell, spec: &ReplicationSpec) -> usize {
    let want = spec.options.http_connections;
    let Some(pool) = ctx.child(CONNECTION_POOL).get() else {
        return want;
    };
    let mut granted = want;
    for ep in [&spec.source, &spec.target] {
        let endpoint = endpoint_key(ep.parsed_url());
        let owner = owner.clone();
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

/// A running replication: the waiter task owns the engine handle; dropping this aborts it.
pub(crate) struct Runner {
    stop: Option<oneshot::Sender<()>>,
    progress: watch::Receiver<ReplicationStats>,
    task: JoinHandle<Option<ReplicationStats>>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Runner {
    /// Starts the engine; `on_end` hears how it ended unless [`Self::stop`] came first.
    /// Aborts it when `watchdog`'s lease runs out.
    pub(crate) fn start(
        spec: ReplicationSpec,
        engine: Context,
        on_end: OnEnd,
        watchdog: Watchdog,
    ) -> Self {
        let handle = replication::start(spec, engine);
        let progress = handle.progress();
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(
            async move {
                let Watchdog {
                    lease,
                    node_lease,
                    on_lost,
                } = watchdog;
                tokio::select! {
                    stats = wait_end(handle, stop_rx, on_end) => stats,
                    // Whichever runs out first: the job's own or the node's.
                    () = first(lease.expired(), node_lease.expired()) => {
                        // `wait_end` and the engine handle it owns are dropped here, which
                        // aborts the replication without a final checkpoint.
                        tracing::warn!(
                            job_lease_age_ms = lease.age().as_millis() as u64,
                            node_lease_age_ms = node_lease.age().as_millis() as u64,
                            "job lease ran out (store unreachable?); replication aborted"
                        );
                        on_lost();
                        None
                    }
                }
            }
            .in_current_span(),
        );
        Self {
            stop: Some(stop_tx),
            progress,
            task,
        }
    }

    /// The replication's latest stats.
    pub(crate) fn stats(&self) -> ReplicationStats {
        self.progress.borrow().clone()
    }

    /// Asks the engine to checkpoint and stop, and waits up to `budget` for its final stats;
    /// past the budget (or if it failed) the latest stats seen before the request.
    pub(crate) async fn stop(mut self, budget: Duration) -> ReplicationStats {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let stats = self.stats();
        match tokio::time::timeout(budget, &mut self.task).await {
            Ok(Ok(Some(final_stats))) => final_stats,
            _ => stats,
        }
    }
}

/// Resolves when either future does.
async fn first(a: impl Future<Output = ()>, b: impl Future<Output = ()>) {
    tokio::select! {
        () = a => {}
        () = b => {}
    }
}

/// Owns the engine handle: waits for its end (reported through `on_end`) or for a stop
/// request (the engine checkpoints and stops; the final stats are returned instead).
async fn wait_end(
    handle: replication::ReplicationHandle,
    mut stop: oneshot::Receiver<()>,
    on_end: OnEnd,
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
    on_end(result);
    None
}

/// Calls `tick` every `period` (the first call one period from now) until it returns
/// false (the actor is gone).
pub(crate) fn every(period: Duration, tick: impl Fn() -> bool + Send + 'static) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut t = tokio::time::interval(period);
        t.tick().await;
        loop {
            t.tick().await;
            if !tick() {
                return;
            }
        }
    })
}
