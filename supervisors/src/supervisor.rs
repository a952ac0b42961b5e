//! `Supervisor`: OTP's static supervisor (`one_for_one`, `one_for_all`, `rest_for_one`).
//!
//! Build a [`Supervisor`] with its children in start order, then `start` it. It starts the
//! children one by one (a child whose start fails aborts the start: the ones already started
//! are stopped in reverse order and `start` returns the error). When a child exits it applies
//! the child's [`Restart`] type and its strategy, counting restarts against the intensity
//! (`max_restarts` within `period`); beyond that it stops all children in reverse order and
//! fails to its own parent. Stopping the supervisor stops the children in reverse order, each
//! with its [`Shutdown`] policy, so their `terminate` hooks run.
//!
//! Messages: none for users; the supervisor only takes ractor supervision events from its
//! children and an internal "start pending children" tick used for the restart delay.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use ractor::{Actor, ActorCell, ActorRef, Message, SpawnErr, SupervisionEvent};
use tokio::time::Instant;

use crate::child_spec::{ChildContext, ChildSpec, Exit, Restart};
use crate::error::{BoxError, SupervisorError};
use crate::intensity::Intensity;
use crate::lookup::Children;
use crate::server::panic_text;
use crate::shutdown::{Shutdown, shutdown_child};

/// Which children are restarted when one of them exits and must be restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Only the exited child.
    #[default]
    OneForOne,
    /// All children: the others are stopped in reverse order, then all start in order.
    OneForAll,
    /// The exited child and every child started after it: those are stopped in reverse
    /// order, then restarted in order. Children before it are untouched.
    RestForOne,
}

/// A supervisor specification (builder). Start it with [`Supervisor::start`], or nest it in
/// another supervisor with [`Supervisor::into_child_spec`].
///
/// The [`Children`] lookup table is created with the spec and kept across (re)starts, so
/// [`Supervisor::children`] taken before starting stays valid when this supervisor is
/// restarted by its parent. Clones share the table: run one instance per spec.
#[derive(Debug, Clone)]
pub struct Supervisor {
    name: Option<String>,
    label: Option<String>,
    strategy: Strategy,
    children: Vec<ChildSpec>,
    max_restarts: u32,
    period: Duration,
    restart_delay: Duration,
    table: Children,
}

/// The supervisor actor's message type. It has no public variants: users look children up
/// through [`SupervisorRef`] / [`Children`] and stop the supervisor with ractor's `stop`.
#[derive(Debug)]
pub struct SupervisorMsg(Tick);

#[derive(Debug)]
enum Tick {
    StartPending,
}

impl Supervisor {
    /// An empty supervisor with `strategy`, intensity 3 restarts in 5 seconds (Elixir's
    /// default), no restart delay.
    pub fn new(strategy: Strategy) -> Self {
        Self {
            name: None,
            label: None,
            strategy,
            children: Vec::new(),
            max_restarts: 3,
            period: Duration::from_secs(5),
            restart_delay: Duration::ZERO,
            table: Children::default(),
        }
    }

    /// Append a child (children start in the order they are added).
    pub fn child(mut self, spec: ChildSpec) -> Self {
        self.children.push(spec);
        self
    }

    /// Allow at most `max_restarts` restarts within `period`; one more fails the supervisor.
    pub fn intensity(mut self, max_restarts: u32, period: Duration) -> Self {
        self.max_restarts = max_restarts;
        self.period = period;
        self
    }

    /// Wait `delay` before restarting children (the supervisor keeps serving meanwhile).
    pub fn restart_delay(mut self, delay: Duration) -> Self {
        self.restart_delay = delay;
        self
    }

    /// Register the supervisor under `name` in ractor's registry (also used in logs).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Name the supervisor in logs only, without registering it: several instances (two nodes
    /// of one embedding host, tests sharing a process) may carry the same label.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The lookup table of this supervisor's children (valid across its restarts).
    pub fn children(&self) -> Children {
        self.table.clone()
    }

    /// Start unsupervised. Returns once every child has started.
    pub async fn start(self) -> Result<SupervisorRef, SupervisorError> {
        self.spawn(None).await
    }

    /// Start linked to `parent`. Returns once every child has started.
    pub async fn start_linked(self, parent: ActorCell) -> Result<SupervisorRef, SupervisorError> {
        self.spawn(Some(parent)).await
    }

    async fn spawn(self, parent: Option<ActorCell>) -> Result<SupervisorRef, SupervisorError> {
        let name = self.name.clone();
        let children = self.table.clone();
        let spawned = match parent {
            Some(p) => Actor::spawn_linked(name, SupervisorActor, self, p).await,
            None => Actor::spawn(name, SupervisorActor, self).await,
        };
        let (actor, _) = spawned.map_err(spawn_error)?;
        Ok(SupervisorRef { actor, children })
    }

    /// This supervisor as a child of another: permanent, `Shutdown::Infinity` (OTP's
    /// defaults for supervisor children, so it has time to stop its own children).
    pub fn into_child_spec(self, id: impl Into<String>) -> ChildSpec {
        ChildSpec::new(id, move |ctx: ChildContext| {
            let spec = self.clone();
            async move {
                let sup = spec.start_linked(ctx.supervisor).await?;
                Ok(sup.actor.get_cell())
            }
        })
        .shutdown(Shutdown::Infinity)
    }
}

/// Recover the typed error a supervisor's `pre_start` returned.
pub(crate) fn spawn_error(err: SpawnErr) -> SupervisorError {
    match err {
        SpawnErr::StartupFailed(inner) => match inner.downcast::<SupervisorError>() {
            Ok(typed) => *typed,
            Err(other) => SupervisorError::Spawn(other.to_string()),
        },
        other => SupervisorError::Spawn(other.to_string()),
    }
}

/// A running supervisor: its actor and its children table. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SupervisorRef {
    actor: ActorRef<SupervisorMsg>,
    children: Children,
}

impl SupervisorRef {
    /// The supervisor actor (link/monitor it, or `stop`/`kill` it directly).
    pub fn actor(&self) -> &ActorRef<SupervisorMsg> {
        &self.actor
    }

    /// The children lookup table.
    pub fn children(&self) -> &Children {
        &self.children
    }

    /// The current `ActorRef` of child `id` (`None` while it is down or if `M` is wrong).
    pub fn which_child<M: Message>(&self, id: &str) -> Option<ActorRef<M>> {
        self.children.get(id)
    }

    /// Ids of the running children, in start order.
    pub fn which_children(&self) -> Vec<String> {
        self.children.running()
    }

    /// Stop gracefully: children are stopped in reverse order (their `terminate` runs), then
    /// the supervisor exits. Returns when it has exited.
    pub async fn stop(&self) {
        self.actor.stop(None);
        let _ = self.actor.wait(None).await;
    }

    /// Wait until the supervisor has exited.
    pub async fn wait(&self) {
        let _ = self.actor.wait(None).await;
    }
}

struct SupervisorActor;

struct Slot {
    spec: ChildSpec,
    cell: Option<ActorCell>,
    /// Down and due to be (re)started by the next `start_pending`.
    pending: bool,
}

/// The running supervisor's state.
struct State {
    name: String,
    strategy: Strategy,
    slots: Vec<Slot>,
    intensity: Intensity,
    restart_delay: Duration,
    table: Children,
}

impl State {
    async fn start_slot(
        &mut self,
        i: usize,
        myself: &ActorRef<SupervisorMsg>,
    ) -> Result<(), String> {
        let Some(slot) = self.slots.get_mut(i) else {
            return Ok(());
        };
        let ctx = ChildContext {
            supervisor: myself.get_cell(),
            siblings: self.table.clone(),
        };
        let started = AssertUnwindSafe((slot.spec.start)(ctx))
            .catch_unwind()
            .await;
        let cell = match started {
            Ok(Ok(cell)) => cell,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(panic) => return Err(panic_text(panic)),
        };
        tracing::debug!(supervisor = %self.name, child = %slot.spec.id, "child started");
        self.table.set(&slot.spec.id, Some(cell.clone()));
        slot.cell = Some(cell);
        slot.pending = false;
        Ok(())
    }

    async fn stop_slot(&mut self, i: usize) {
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        if let Some(cell) = slot.cell.take() {
            self.table.set(&slot.spec.id, None);
            shutdown_child(&cell, &slot.spec.id, slot.spec.shutdown).await;
        }
    }

    async fn stop_all(&mut self) {
        for i in (0..self.slots.len()).rev() {
            self.stop_slot(i).await;
        }
    }

    /// Child `i` is down and must restart: stop the others its strategy takes down (reverse
    /// order), mark them all pending, and drop temporary ones (never restarted).
    async fn take_down(&mut self, i: usize) {
        let affected = match self.strategy {
            Strategy::OneForOne => i..i + 1,
            Strategy::OneForAll => 0..self.slots.len(),
            Strategy::RestForOne => i..self.slots.len(),
        };
        for j in affected.clone().rev() {
            self.stop_slot(j).await;
        }
        for j in affected {
            if let Some(slot) = self.slots.get_mut(j) {
                slot.pending = true;
            }
        }
        let table = &self.table;
        self.slots.retain(|s| {
            let drop = s.pending && s.spec.restart == Restart::Temporary;
            if drop {
                table.remove(&s.spec.id);
            }
            !drop
        });
    }

    /// Start pending children now, or after the restart delay.
    async fn restart_pending(&mut self, myself: &ActorRef<SupervisorMsg>) -> Result<(), BoxError> {
        if self.restart_delay.is_zero() {
            self.start_pending(myself).await
        } else {
            self.schedule(myself);
            Ok(())
        }
    }

    fn schedule(&self, myself: &ActorRef<SupervisorMsg>) {
        tracing::info!(supervisor = %self.name, delay = ?self.restart_delay, "restart delayed");
        myself.send_after(self.restart_delay, || SupervisorMsg(Tick::StartPending));
    }

    /// Start every pending child in order. A failed start counts as a restart and as a
    /// crash of that child (its strategy applies again).
    async fn start_pending(&mut self, myself: &ActorRef<SupervisorMsg>) -> Result<(), BoxError> {
        while let Some(i) = self.slots.iter().position(|s| s.pending) {
            let Err(reason) = self.start_slot(i, myself).await else {
                continue;
            };
            let id = self
                .slots
                .get(i)
                .map(|s| s.spec.id.clone())
                .unwrap_or_default();
            tracing::warn!(supervisor = %self.name, child = %id, %reason, "child restart failed");
            self.count_restart().await?;
            self.take_down(i).await;
            if !self.restart_delay.is_zero() {
                self.schedule(myself);
                return Ok(());
            }
        }
        Ok(())
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
}

impl Actor for SupervisorActor {
    type Msg = SupervisorMsg;
    type State = State;
    type Arguments = Supervisor;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        spec: Supervisor,
    ) -> Result<State, BoxError> {
        let name = spec
            .name
            .clone()
            .or_else(|| spec.label.clone())
            .unwrap_or_else(|| myself.get_id().to_string());
        for (n, child) in spec.children.iter().enumerate() {
            if spec.children[..n].iter().any(|c| c.id == child.id) {
                return Err(Box::new(SupervisorError::ChildStart {
                    id: child.id.clone(),
                    reason: "duplicate child id".into(),
                }));
            }
        }
        spec.table
            .reset(spec.children.iter().map(|c| c.id.as_str()));
        let mut state = State {
            name,
            strategy: spec.strategy,
            slots: spec
                .children
                .into_iter()
                .map(|spec| Slot {
                    spec,
                    cell: None,
                    pending: false,
                })
                .collect(),
            intensity: Intensity::new(spec.max_restarts, spec.period),
            restart_delay: spec.restart_delay,
            table: spec.table,
        };
        for i in 0..state.slots.len() {
            if let Err(reason) = state.start_slot(i, &myself).await {
                let id = state.slots[i].spec.id.clone();
                tracing::error!(supervisor = %state.name, child = %id, %reason, "child failed to start; aborting start");
                state.stop_all().await;
                return Err(Box::new(SupervisorError::ChildStart { id, reason }));
            }
        }
        tracing::info!(supervisor = %state.name, children = state.slots.len(), "supervisor started");
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut State,
    ) -> Result<(), BoxError> {
        match msg.0 {
            Tick::StartPending => state.start_pending(&myself).await,
        }
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut State,
    ) -> Result<(), BoxError> {
        let Some((cell, exit)) = Exit::of(&event) else {
            return Ok(());
        };
        let id = cell.get_id();
        // Exits of children we stopped ourselves (or already replaced) are not in the table.
        let Some(i) = state
            .slots
            .iter()
            .position(|s| s.cell.as_ref().is_some_and(|c| c.get_id() == id))
        else {
            return Ok(());
        };
        let slot = &mut state.slots[i];
        slot.cell = None;
        state.table.set(&slot.spec.id, None);
        let child = slot.spec.id.clone();
        if !exit.restarts(slot.spec.restart) {
            tracing::info!(supervisor = %state.name, %child, ?exit, "child exited; not restarting");
            if slot.spec.restart == Restart::Temporary {
                state.slots.remove(i);
                state.table.remove(&child);
            }
            return Ok(());
        }
        tracing::warn!(supervisor = %state.name, %child, ?exit, strategy = ?state.strategy, "child exited; restarting");
        state.count_restart().await?;
        state.take_down(i).await;
        state.restart_pending(&myself).await
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        state: &mut State,
    ) -> Result<(), BoxError> {
        tracing::info!(supervisor = %state.name, "supervisor stopping; stopping children in reverse order");
        state.stop_all().await;
        Ok(())
    }
}
