//! The dynamic supervisor's actor ([`super::DynamicSupervisor`]'s running side): its state
//! (the children by id and by actor, their kept arguments, the restart intensity), how a
//! child is launched (start panics caught), terminated, restarted (now or after the restart
//! delay) and how every child is stopped in parallel when the supervisor stops; and its
//! handling of the requests and of ractor's supervision events.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use ractor::{Actor, ActorCell, ActorId, ActorRef, Message, SupervisionEvent};
use tokio::time::Instant;

use super::{ChildExit, DynamicSupervisor, DynamicSupervisorMsg, Request};
use crate::child_spec::Exit;
use crate::error::{BoxError, SupervisorError};
use crate::intensity::Intensity;
use crate::server::{ExitReason, panic_text};
use crate::shutdown::{Stopped, shutdown_child};

/// The actor of a dynamic supervisor whose children take arguments `A` and messages `M`.
pub(super) struct DynActor<A, M>(PhantomData<fn() -> (A, M)>);

impl<A, M> DynActor<A, M> {
    /// The actor, to spawn with a [`DynamicSupervisor`] as its arguments.
    pub(super) fn new() -> Self {
        Self(PhantomData)
    }
}

/// One child: its actor while it runs, its arguments while it may be restarted.
struct DynChild<A> {
    /// Kept for restarts (only when the restart type can restart).
    args: Option<A>,
    cell: Option<ActorCell>,
}

/// The supervisor's state: its children by id and by actor, and the restarts counted.
pub(super) struct State<A, M> {
    name: String,
    spec: DynamicSupervisor<A, M>,
    children: HashMap<String, DynChild<A>>,
    by_actor: HashMap<ActorId, String>,
    intensity: Intensity,
}

impl<A: Send + 'static, M: Message> State<A, M> {
    fn notify(&self, id: &str, actor: ActorId, reason: ExitReason, restarting: bool) {
        if let Some(listener) = &self.spec.on_exit {
            listener(ChildExit {
                id: id.to_string(),
                actor,
                reason,
                restarting,
            });
        }
    }

    /// Run the start function (panics caught) and record the child as running.
    async fn launch(
        &mut self,
        myself: &ActorRef<DynamicSupervisorMsg<A, M>>,
        id: &str,
        args: A,
    ) -> Result<ActorRef<M>, String> {
        let kept = self.spec.cloner.as_ref().map(|clone| clone(&args));
        let started = AssertUnwindSafe((self.spec.start)(myself.get_cell(), args))
            .catch_unwind()
            .await;
        let actor = match started {
            Ok(Ok(actor)) => actor,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(panic) => return Err(panic_text(panic)),
        };
        let cell = actor.get_cell();
        self.by_actor.insert(cell.get_id(), id.to_string());
        self.spec.table.set(id, Some(cell.clone()));
        self.children.insert(
            id.to_string(),
            DynChild {
                args: kept,
                cell: Some(cell),
            },
        );
        tracing::debug!(supervisor = %self.name, child = id, "child started");
        Ok(actor)
    }

    async fn start_child(
        &mut self,
        myself: &ActorRef<DynamicSupervisorMsg<A, M>>,
        id: String,
        args: A,
    ) -> Result<ActorRef<M>, SupervisorError> {
        if self.children.contains_key(&id) {
            return Err(SupervisorError::AlreadyExists(id));
        }
        if let Some(max) = self.spec.max_children
            && self.children.len() >= max
        {
            return Err(SupervisorError::Full { max });
        }
        self.launch(myself, &id, args)
            .await
            .map_err(|reason| SupervisorError::ChildStart { id, reason })
    }

    async fn terminate_child(&mut self, id: String) -> Result<(), SupervisorError> {
        let Some(child) = self.children.remove(&id) else {
            return Err(SupervisorError::NotFound(id));
        };
        self.spec.table.remove(&id);
        if let Some(cell) = child.cell {
            self.by_actor.remove(&cell.get_id());
            let stopped = shutdown_child(&cell, &id, self.spec.shutdown).await;
            self.notify(&id, cell.get_id(), stopped_reason(stopped), false);
        }
        Ok(())
    }

    /// Stop every child in parallel and forget them all, telling the exit listener of each
    /// exit as it happens.
    async fn stop_all(&mut self) {
        self.by_actor.clear();
        let how = self.spec.shutdown;
        let running: Vec<(String, ActorCell)> = self
            .children
            .drain()
            .filter_map(|(id, c)| c.cell.map(|cell| (id, cell)))
            .collect();
        self.spec.table.reset(std::iter::empty());
        let mut stops: futures::stream::FuturesUnordered<_> = running
            .into_iter()
            .map(|(id, cell)| async move {
                let stopped = shutdown_child(&cell, &id, how).await;
                (id, cell.get_id(), stopped)
            })
            .collect();
        // Each exit is heard as it happens, not once the slowest child is gone: a listener
        // that keeps a count of the children (a node's load row) stays true meanwhile.
        while let Some((id, actor, stopped)) = futures::StreamExt::next(&mut stops).await {
            self.notify(&id, actor, stopped_reason(stopped), false);
        }
    }

    /// Record a restart; past the intensity, stop everything and fail.
    async fn count_restart(&mut self) -> Result<(), BoxError> {
        if self.intensity.record(Instant::now()) {
            return Ok(());
        }
        tracing::error!(supervisor = %self.name, "reached max restart intensity; shutting down");
        self.stop_all().await;
        Err(format!("supervisor {}: reached max restart intensity", self.name).into())
    }

    /// Restart child `id` now (or schedule it after the restart delay). A failed start counts
    /// as another restart.
    async fn restart(
        &mut self,
        myself: &ActorRef<DynamicSupervisorMsg<A, M>>,
        id: String,
    ) -> Result<(), BoxError> {
        loop {
            let Some(child) = self.children.get(&id) else {
                return Ok(()); // terminated while awaiting restart
            };
            if child.cell.is_some() {
                return Ok(());
            }
            let (Some(args), Some(clone)) = (child.args.as_ref(), self.spec.cloner.as_ref()) else {
                self.children.remove(&id);
                self.spec.table.remove(&id);
                return Ok(());
            };
            let args = clone(args);
            match self.launch(myself, &id, args).await {
                Ok(_) => return Ok(()),
                Err(reason) => {
                    tracing::warn!(supervisor = %self.name, child = %id, %reason, "child restart failed");
                    self.count_restart().await?;
                    if !self.spec.restart_delay.is_zero() {
                        self.schedule(myself, id);
                        return Ok(());
                    }
                }
            }
        }
    }

    fn schedule(&self, myself: &ActorRef<DynamicSupervisorMsg<A, M>>, id: String) {
        myself.send_after(self.spec.restart_delay, move || {
            DynamicSupervisorMsg(Request::Restart { id })
        });
    }
}

fn stopped_reason(stopped: Stopped) -> ExitReason {
    match stopped {
        Stopped::Gracefully => ExitReason::Shutdown,
        Stopped::Killed => ExitReason::Error("killed".into()),
    }
}

impl<A: Send + 'static, M: Message> Actor for DynActor<A, M> {
    type Msg = DynamicSupervisorMsg<A, M>;
    type State = State<A, M>;
    type Arguments = DynamicSupervisor<A, M>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        spec: DynamicSupervisor<A, M>,
    ) -> Result<Self::State, BoxError> {
        let name = spec
            .name
            .clone()
            .unwrap_or_else(|| myself.get_id().to_string());
        spec.table.reset(std::iter::empty());
        tracing::info!(supervisor = %name, "dynamic supervisor started");
        Ok(State {
            name,
            intensity: Intensity::new(spec.max_restarts, spec.period),
            spec,
            children: HashMap::new(),
            by_actor: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), BoxError> {
        match msg.0 {
            Request::Start { id, args, reply } => {
                let result = state.start_child(&myself, id, args).await;
                let _ = reply.send(result);
                Ok(())
            }
            Request::Terminate { id, reply } => {
                let result = state.terminate_child(id).await;
                let _ = reply.send(result);
                Ok(())
            }
            Request::Restart { id } => state.restart(&myself, id).await,
        }
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), BoxError> {
        let Some((cell, exit)) = Exit::of(&event) else {
            return Ok(());
        };
        let actor = cell.get_id();
        // Children we stopped ourselves were already forgotten.
        let Some(id) = state.by_actor.remove(&actor) else {
            return Ok(());
        };
        let restarting = exit.restarts(state.spec.restart);
        state.spec.table.set(&id, None);
        if let Some(child) = state.children.get_mut(&id) {
            child.cell = None;
        }
        state.notify(&id, actor, exit.reason(), restarting);
        if !restarting {
            tracing::debug!(supervisor = %state.name, child = %id, ?exit, "child exited; not restarting");
            state.children.remove(&id);
            state.spec.table.remove(&id);
            return Ok(());
        }
        tracing::warn!(supervisor = %state.name, child = %id, ?exit, "child exited; restarting");
        state.count_restart().await?;
        if state.spec.restart_delay.is_zero() {
            state.restart(&myself, id).await
        } else {
            state.schedule(&myself, id);
            Ok(())
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), BoxError> {
        tracing::info!(supervisor = %state.name, children = state.children.len(), "dynamic supervisor stopping");
        state.stop_all().await;
        Ok(())
    }
}
