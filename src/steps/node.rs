//! A steps node: a small supervised pool of step workers serving the node's own queue and
//! `any` (the thesis' work manager with its fixed set of workers).
//!
//! The pool restarts a worker that fails or panics (one_for_one, permanent), with a short
//! pause, and gives up when restarts exceed the intensity limit (10 in 10 s), as an OTP
//! supervisor would. [`StepsNode::stop`] lets running steps end (up to a grace period);
//! [`StepsNode::kill`] drops everything at once, like a crashed node: its running steps
//! are re-enqueued by the couch_jobs activity monitor and run elsewhere.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::action::Action;
use super::api::Steps;
use super::error::StepsResult;
use super::model::Target;
use super::worker::{WorkerCtx, run_worker};

/// Restarts allowed within [`INTENSITY_PERIOD`] before the pool gives up.
pub const MAX_RESTARTS: usize = 10;
pub const INTENSITY_PERIOD: Duration = Duration::from_secs(10);
const RESTART_PAUSE: Duration = Duration::from_millis(100);

/// A running pool of step workers on one node.
pub struct StepsNode {
    name: String,
    shutdown: watch::Sender<bool>,
    pool: tokio::task::JoinHandle<()>,
    restarts: Arc<AtomicU64>,
    failed: Arc<AtomicBool>,
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
        let (shutdown, rx) = watch::channel(false);
        let restarts = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicBool::new(false));
        let name = steps.node().to_string();
        tracing::info!(node = %name, workers, action = action.name(), "steps node started");
        let pool = tokio::spawn(supervise(
            steps,
            action,
            workers.max(1),
            rx,
            restarts.clone(),
            failed.clone(),
        ));
        Ok(Self {
            name,
            shutdown,
            pool,
            restarts,
            failed,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Worker restarts so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// False once the pool gave up (restart intensity exceeded) or was stopped.
    pub fn is_running(&self) -> bool {
        !self.pool.is_finished() && !self.failed.load(Ordering::Relaxed)
    }

    /// Stops taking steps; waits up to `grace` for running steps to finish, then kills.
    pub async fn stop(self, grace: Duration) {
        let _ = self.shutdown.send(true);
        let mut pool = self.pool;
        if tokio::time::timeout(grace, &mut pool).await.is_err() {
            pool.abort();
            let _ = pool.await;
        }
    }

    /// Drops every worker at once, mid-step, with no clean-up (a crashed node).
    pub async fn kill(self) {
        self.pool.abort();
        let _ = self.pool.await;
    }
}

async fn supervise(
    steps: Steps,
    action: Arc<dyn Action>,
    workers: usize,
    shutdown: watch::Receiver<bool>,
    restarts: Arc<AtomicU64>,
    failed: Arc<AtomicBool>,
) {
    let mut set = JoinSet::new();
    let mut index_of = HashMap::new();
    let spawn = |set: &mut JoinSet<StepsResult<()>>, index_of: &mut HashMap<_, _>, i: usize| {
        let ctx = WorkerCtx {
            steps: steps.clone(),
            action: action.clone(),
            worker: format!("{}/{i}", steps.node()),
        };
        let handle = set.spawn(run_worker(ctx, shutdown.clone()));
        index_of.insert(handle.id(), i);
    };
    for i in 0..workers {
        spawn(&mut set, &mut index_of, i);
    }
    let mut recent: VecDeque<Instant> = VecDeque::new();
    while let Some(done) = set.join_next_with_id().await {
        let (id, why) = match done {
            Ok((id, Ok(()))) => (id, None),
            Ok((id, Err(e))) => (id, Some(e.to_string())),
            Err(e) => (e.id(), Some(format!("panicked or aborted: {e}"))),
        };
        let Some(i) = index_of.remove(&id) else {
            continue;
        };
        if *shutdown.borrow() {
            continue;
        }
        let why = why.unwrap_or_else(|| "exited".into());
        let now = Instant::now();
        recent.push_back(now);
        while recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > INTENSITY_PERIOD)
        {
            recent.pop_front();
        }
        if recent.len() > MAX_RESTARTS {
            tracing::error!(node = %steps.node(), "step workers keep failing; giving up: {why}");
            failed.store(true, Ordering::Relaxed);
            return;
        }
        tracing::warn!(node = %steps.node(), worker = i, "step worker died ({why}); restarting");
        restarts.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(RESTART_PAUSE).await;
        spawn(&mut set, &mut index_of, i);
    }
}
