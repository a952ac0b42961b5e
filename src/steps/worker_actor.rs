//! A step worker as a supervised child: a [`supervisors::Server`] that runs one worker loop
//! ([`run_worker`]) as its task, so the node's [`supervisors::Supervisor`] restarts it the
//! OTP way when the loop fails or panics.
//!
//! Takes [`WorkerMsg::Observe`] and [`WorkerMsg::Exited`], sent by a watcher of the loop's
//! task when the loop ends: an error or panic fails the actor (the supervisor restarts it); any end after
//! the node's shutdown signal leaves the actor idle until the supervisor stops it, so a
//! stopping (or killed) node does not restart workers. The loop's task is aborted whenever the actor's
//! state is dropped (stopped, failed or killed), so no loop outlives its actor.

use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, ExitReason, Observable, Server};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::action::Action;
use super::api::Steps;
use super::worker::{WorkerCtx, run_worker};

/// What the node shares with all its workers.
#[derive(Clone)]
pub struct PoolShared {
    /// The node's steps handle.
    pub steps: Steps,
    /// What runs each step's command.
    pub action: Arc<dyn Action>,
    /// Turns true when the node stops: workers end after their current step.
    pub shutdown: watch::Receiver<bool>,
    /// Worker loops currently alive (the node waits for 0 when stopping).
    pub alive: Arc<watch::Sender<usize>>,
    /// Abort handles of the live loops, by worker index (for a node kill).
    pub loops: Arc<std::sync::Mutex<Vec<Option<AbortHandle>>>>,
}

/// One worker of the pool: its index in the node.
#[derive(Clone)]
pub struct StepWorker {
    /// What all workers of the node share.
    pub shared: PoolShared,
    /// The worker's index in its node (the `<index>` of its name `<node>/<index>`).
    pub index: usize,
}

/// The worker actor's message.
#[derive(Debug)]
pub enum WorkerMsg {
    /// The worker loop ended: `Ok` when it stopped cleanly, else why it failed.
    Exited(Result<(), String>),
    /// The worker's state.
    Observe(RpcReplyPort<WorkerObservation>),
}

/// What [`WorkerMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerObservation {
    /// The worker's name in step records (`node/index`).
    pub worker: String,
    /// Its loop is running (false after it ended, until the supervisor restarts the worker).
    pub loop_running: bool,
    /// The node is stopping: the loop ends after its current step.
    pub shutting_down: bool,
}

impl Observable for WorkerMsg {
    type Observation = WorkerObservation;
    fn observe(reply: RpcReplyPort<WorkerObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// Aborts the worker loop when dropped.
pub struct LoopGuard(AbortHandle);

impl Drop for LoopGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Server for StepWorker {
    type Msg = WorkerMsg;
    type State = LoopGuard;
    type Args = ();

    async fn init(&self, myself: ActorRef<WorkerMsg>, (): ()) -> Result<LoopGuard, BoxError> {
        let s = &self.shared;
        let ctx = WorkerCtx {
            steps: s.steps.clone(),
            action: s.action.clone(),
            worker: format!("{}/{}", s.steps.node(), self.index),
        };
        s.alive.send_modify(|n| *n += 1);
        let task = tokio::spawn(run_worker(ctx, s.shutdown.clone()));
        let abort = task.abort_handle();
        if let Ok(mut loops) = s.loops.lock()
            && let Some(slot) = loops.get_mut(self.index)
        {
            *slot = Some(abort.clone());
        }
        let alive = s.alive.clone();
        tokio::spawn(async move {
            let exit = match task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) if e.is_panic() => Err(format!("panicked: {e}")),
                Err(e) => Err(format!("aborted: {e}")),
            };
            alive.send_modify(|n| *n = n.saturating_sub(1));
            // The actor may be gone already (stopped or killed); then nobody needs to know.
            let _ = myself.send_message(WorkerMsg::Exited(exit));
        });
        Ok(LoopGuard(abort))
    }

    async fn handle(
        &self,
        _myself: ActorRef<WorkerMsg>,
        msg: WorkerMsg,
        state: &mut LoopGuard,
    ) -> Result<(), BoxError> {
        let exit = match msg {
            WorkerMsg::Exited(exit) => exit,
            WorkerMsg::Observe(reply) => {
                let _ = reply.send(WorkerObservation {
                    worker: format!("{}/{}", self.shared.steps.node(), self.index),
                    loop_running: !state.0.is_finished(),
                    shutting_down: *self.shared.shutdown.borrow(),
                });
                return Ok(());
            }
        };
        // Once the node stops or is killed, however a loop ended, it is not restarted.
        if *self.shared.shutdown.borrow() {
            return Ok(());
        }
        match exit {
            Ok(()) => Err("step worker loop ended without a shutdown".into()),
            Err(why) => {
                tracing::warn!(node = %self.shared.steps.node(), worker = self.index, "step worker died ({why}); the supervisor restarts it");
                Err(why.into())
            }
        }
    }

    async fn terminate(&self, _myself: ActorRef<WorkerMsg>, state: LoopGuard, _: ExitReason) {
        drop(state);
    }
}
