//! A steps node: a small pool of step workers serving the node's own queue and `any` (the
//! thesis' work manager with its fixed set of workers), supervised by a
//! [`supervisors::Supervisor`] (one_for_one, permanent children, at most [`MAX_RESTARTS`]
//! restarts in [`INTENSITY_PERIOD`], [`RESTART_PAUSE`] between a crash and the restart).
//!
//! [`StepsNode::stop`] lets running steps end (up to a grace period); [`StepsNode::kill`]
//! drops everything at once, like a crashed node: its running steps are re-enqueued by the
//! couch_jobs activity monitor and run elsewhere.

#[cfg(any(test, feature = "internals"))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use supervisors::{ChildSpec, Restart, Shutdown, Strategy, Supervisor, SupervisorRef};
use tokio::sync::watch;

use super::action::Action;
use super::api::Steps;
use super::error::{StepsError, StepsResult};
use super::model::Target;
use super::worker_actor::{PoolShared, StepWorker};

/// Restarts allowed within [`INTENSITY_PERIOD`] before the pool gives up.
pub const MAX_RESTARTS: u32 = 10;
/// The window [`MAX_RESTARTS`] counts restarts in.
pub const INTENSITY_PERIOD: Duration = Duration::from_secs(10);
/// Pause between a worker's crash and its restart.
pub const RESTART_PAUSE: Duration = Duration::from_millis(100);

/// A running pool of step workers on one node.
pub struct StepsNode {
    name: String,
    shutdown: watch::Sender<bool>,
    alive: watch::Receiver<usize>,
    shared: PoolShared,
    sup: SupervisorRef,
    /// Worker restarts so far, for the crate's tests.
    #[cfg(any(test, feature = "internals"))]
    restarts: Arc<AtomicU64>,
}

impl std::fmt::Debug for StepsNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepsNode")
            .field("name", &self.name)
            .finish()
    }
}

impl StepsNode {
    /// Prepares the node's queues and starts `workers` workers running steps with `action`.
    pub async fn start(steps: Steps, action: Arc<dyn Action>, workers: usize) -> StepsResult<Self> {
        steps
            .ensure_queue(&Target::Node(steps.node().to_string()))
            .await?;
        steps.ensure_queue(&Target::Any).await?;
        let workers = workers.max(1);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (alive_tx, alive) = watch::channel(0usize);
        #[cfg(any(test, feature = "internals"))]
        let restarts = Arc::new(AtomicU64::new(0));
        let name = steps.node().to_string();
        let shared = PoolShared {
            steps,
            action,
            shutdown: shutdown_rx,
            alive: Arc::new(alive_tx),
            loops: Arc::new(Mutex::new(vec![None; workers])),
        };
        let mut sup = Supervisor::new(Strategy::OneForOne)
            .intensity(MAX_RESTARTS, INTENSITY_PERIOD)
            .restart_delay(RESTART_PAUSE);
        for index in 0..workers {
            let worker = StepWorker {
                shared: shared.clone(),
                index,
            };
            // Every start after the first is a restart (counted for the crate's tests).
            #[cfg(any(test, feature = "internals"))]
            let args = {
                let (restarts, started) = (restarts.clone(), Arc::new(AtomicU64::new(0)));
                move |_: &supervisors::ChildContext| {
                    if started.fetch_add(1, Ordering::Relaxed) > 0 {
                        restarts.fetch_add(1, Ordering::Relaxed);
                    }
                }
            };
            #[cfg(not(any(test, feature = "internals")))]
            let args = |_: &supervisors::ChildContext| {};
            // Stopping waits for running steps itself (see `stop`), so the supervisor's own
            // shutdown of a worker is quick.
            let spec = ChildSpec::server(format!("worker/{index}"), worker, args)
                .restart(Restart::Permanent)
                .shutdown(Shutdown::Timeout(Duration::from_secs(1)));
            sup = sup.child(spec);
        }
        let sup = sup
            .start()
            .await
            .map_err(|e| StepsError::Pool(e.to_string()))?;
        tracing::info!(node = %name, workers, action = shared.action.name(), "steps node started");
        Ok(Self {
            name,
            shutdown,
            alive,
            shared,
            sup,
            #[cfg(any(test, feature = "internals"))]
            restarts,
        })
    }

    /// The running actor of worker `index` (`None` while it restarts), to observe it.
    #[cfg(any(test, feature = "internals"))]
    pub fn worker(&self, index: usize) -> Option<ractor::ActorRef<super::worker_actor::WorkerMsg>> {
        self.sup.which_child(&format!("worker/{index}"))
    }

    /// Worker restarts so far.
    #[cfg(any(test, feature = "internals"))]
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// False once the pool gave up (restart intensity exceeded) or was stopped.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_running(&self) -> bool {
        self.sup.actor().get_status() == ractor::ActorStatus::Running
    }

    /// Stops taking steps; waits up to `grace` for running steps to finish, then kills.
    pub async fn stop(self, grace: Duration) {
        let _ = self.shutdown.send(true);
        let mut alive = self.alive.clone();
        if tokio::time::timeout(grace, alive.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            tracing::warn!(node = %self.name, "steps still running after the grace period; dropping them");
            self.abort_loops();
        }
        self.sup.stop().await;
    }

    /// Drops every worker at once, mid-step, with no clean-up (a crashed node).
    #[cfg(any(test, feature = "internals"))]
    pub async fn kill(self) {
        // The shutdown flag keeps the supervisor from restarting the killed loops.
        let _ = self.shutdown.send(true);
        self.abort_loops();
        self.sup.stop().await;
    }

    fn abort_loops(&self) {
        if let Ok(loops) = self.shared.loops.lock() {
            for h in loops.iter().flatten() {
                h.abort();
            }
        }
    }
}
