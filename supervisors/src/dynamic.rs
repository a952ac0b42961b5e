//! `DynamicSupervisor`: OTP's `simple_one_for_one` (Elixir's `DynamicSupervisor`) for many
//! children of one kind, started and terminated at run time by id.
//!
//! Build a [`DynamicSupervisor`] from a start function (or a [`Server`] with
//! [`DynamicSupervisor::server`]), start it, then use the [`DynamicSupervisorRef`]:
//! [`start_child`](DynamicSupervisorRef::start_child) (id + start arguments),
//! [`terminate_child`](DynamicSupervisorRef::terminate_child) (graceful stop within the
//! shutdown timeout, then kill; never restarted),
//! [`which_child`](DynamicSupervisorRef::which_child) / [`Children`] lookups by id.
//!
//! A child that exits is handled by the restart type (default [`Restart::Temporary`], the only
//! one available when the arguments are not `Clone`, since a restart needs them again),
//! counted against the intensity like in [`crate::Supervisor`]; beyond it all children are
//! stopped and the supervisor fails to its parent. Stopping the supervisor stops all children
//! in parallel (as OTP does for dynamic children), each with its shutdown policy, so their
//! `terminate` hooks run. An optional listener ([`DynamicSupervisor::on_exit`]) hears every
//! child exit.
//!
//! Messages (inside [`DynamicSupervisorMsg`], sent by the ref's methods): start child,
//! terminate child, and an internal delayed-restart tick; plus ractor supervision events.

use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use ractor::{
    Actor, ActorCell, ActorId, ActorRef, Message, RpcReplyPort, SupervisionEvent, rpc::CallResult,
};
use tokio::time::Instant;

use crate::child_spec::{ChildContext, ChildSpec, Exit, Restart};
use crate::error::{BoxError, SupervisorError};
use crate::intensity::Intensity;
use crate::lookup::{ChildHandle, Children};
use crate::server::{self, ExitReason, Server, panic_text};
use crate::shutdown::{Shutdown, Stopped, shutdown_child};
use crate::supervisor::spawn_error;

/// A boxed dynamic-child start future.
pub type DynStartFuture<M> = Pin<Box<dyn Future<Output = Result<ActorRef<M>, BoxError>> + Send>>;

type StartFn<A, M> = Arc<dyn Fn(ActorCell, A) -> DynStartFuture<M> + Send + Sync>;
type Cloner<A> = Arc<dyn Fn(&A) -> A + Send + Sync>;
type Listener = Arc<dyn Fn(ChildExit) + Send + Sync>;

/// One exit of a dynamic child, as given to the [`DynamicSupervisor::on_exit`] listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildExit {
    /// The child id.
    pub id: String,
    /// The actor that exited (a restarted child is a new actor).
    pub actor: ActorId,
    /// How it ended: `Normal` (stopped by itself or another actor), `Shutdown` (terminated by
    /// the supervisor, gracefully), `Error` (failed, panicked, or killed: `"killed"`).
    pub reason: ExitReason,
    /// Whether the supervisor restarts it (else it is gone from the supervisor).
    pub restarting: bool,
}

/// A dynamic supervisor specification (builder): children of one kind, started with
/// arguments `A`, each an actor taking messages `M`.
pub struct DynamicSupervisor<A, M> {
    name: Option<String>,
    start: StartFn<A, M>,
    cloner: Option<Cloner<A>>,
    restart: Restart,
    shutdown: Shutdown,
    max_children: Option<usize>,
    max_restarts: u32,
    period: Duration,
    restart_delay: Duration,
    on_exit: Option<Listener>,
    table: Children,
}

impl<A, M> Clone for DynamicSupervisor<A, M> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            start: self.start.clone(),
            cloner: self.cloner.clone(),
            restart: self.restart,
            shutdown: self.shutdown,
            max_children: self.max_children,
            max_restarts: self.max_restarts,
            period: self.period,
            restart_delay: self.restart_delay,
            on_exit: self.on_exit.clone(),
            table: self.table.clone(),
        }
    }
}

impl<A, M> std::fmt::Debug for DynamicSupervisor<A, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamicSupervisor")
            .field("name", &self.name)
            .field("restart", &self.restart)
            .field("shutdown", &self.shutdown)
            .field("max_children", &self.max_children)
            .field("max_restarts", &self.max_restarts)
            .field("period", &self.period)
            .field("restart_delay", &self.restart_delay)
            .finish()
    }
}

impl<A: Send + 'static, M: Message> DynamicSupervisor<A, M> {
    /// Children started by `start(supervisor, args)`, which must spawn the actor linked to
    /// `supervisor` and return it once it runs. Defaults: temporary children, 5 s shutdown,
    /// no child limit, intensity 3 restarts in 5 s, no restart delay.
    pub fn new<F, Fut>(start: F) -> Self
    where
        F: Fn(ActorCell, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ActorRef<M>, BoxError>> + Send + 'static,
    {
        Self {
            name: None,
            start: Arc::new(move |sup, args| Box::pin(start(sup, args))),
            cloner: None,
            restart: Restart::Temporary,
            shutdown: Shutdown::default(),
            max_children: None,
            max_restarts: 3,
            period: Duration::from_secs(5),
            restart_delay: Duration::ZERO,
            on_exit: None,
            table: Children::default(),
        }
    }

    /// Children that are [`Server`]s, each started with its own `S::Args`.
    pub fn server<S>(server: S) -> Self
    where
        S: Server<Args = A, Msg = M> + Clone,
    {
        Self::new(move |sup: ActorCell, args: A| {
            let server = server.clone();
            async move {
                let (actor, _) = server::start_linked(None, server, args, sup).await?;
                Ok(actor)
            }
        })
    }

    /// Set the children's restart type. Permanent and transient children are restarted with
    /// a clone of the arguments they were started with, hence `A: Clone`.
    pub fn restart(mut self, restart: Restart) -> Self
    where
        A: Clone,
    {
        self.restart = restart;
        self.cloner = match restart {
            Restart::Temporary => None,
            _ => Some(Arc::new(A::clone)),
        };
        self
    }

    /// Set how children are stopped (by `terminate_child` and when the supervisor stops).
    pub fn shutdown(mut self, shutdown: Shutdown) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Refuse `start_child` with [`SupervisorError::Full`] when this many children exist
    /// (running or awaiting restart).
    pub fn max_children(mut self, max: usize) -> Self {
        self.max_children = Some(max);
        self
    }

    /// Allow at most `max_restarts` restarts within `period`; one more fails the supervisor.
    pub fn intensity(mut self, max_restarts: u32, period: Duration) -> Self {
        self.max_restarts = max_restarts;
        self.period = period;
        self
    }

    /// Wait `delay` before each restart (the supervisor keeps serving meanwhile).
    pub fn restart_delay(mut self, delay: Duration) -> Self {
        self.restart_delay = delay;
        self
    }

    /// Register the supervisor under `name` in ractor's registry (also used in logs).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Call `listener` on every child exit, whatever the cause (also `terminate_child` and
    /// the supervisor's own shutdown). It runs inside the supervisor: keep it short (send a
    /// message, bump a counter).
    pub fn on_exit(mut self, listener: impl Fn(ChildExit) + Send + Sync + 'static) -> Self {
        self.on_exit = Some(Arc::new(listener));
        self
    }

    /// The lookup table of the children (valid across restarts of this supervisor).
    pub fn children(&self) -> Children {
        self.table.clone()
    }

    /// Start unsupervised.
    pub async fn start(self) -> Result<DynamicSupervisorRef<A, M>, SupervisorError> {
        self.spawn(None).await
    }

    /// Start linked to `parent`.
    pub async fn start_linked(
        self,
        parent: ActorCell,
    ) -> Result<DynamicSupervisorRef<A, M>, SupervisorError> {
        self.spawn(Some(parent)).await
    }

    async fn spawn(
        self,
        parent: Option<ActorCell>,
    ) -> Result<DynamicSupervisorRef<A, M>, SupervisorError> {
        let name = self.name.clone();
        let children = self.table.clone();
        let actor = DynActor(PhantomData);
        let spawned = match parent {
            Some(p) => Actor::spawn_linked(name, actor, self, p).await,
            None => Actor::spawn(name, actor, self).await,
        };
        let (actor, _) = spawned.map_err(spawn_error)?;
        Ok(DynamicSupervisorRef {
            source: Source::Fixed(actor),
            children,
        })
    }

    /// This supervisor as a child of a [`crate::Supervisor`]: permanent,
    /// `Shutdown::Infinity`. Reach it with [`DynamicSupervisor::handle_in`].
    pub fn into_child_spec(self, id: impl Into<String>) -> ChildSpec {
        ChildSpec::new(id, move |ctx: ChildContext| {
            let spec = self.clone();
            async move {
                let sup = spec.start_linked(ctx.supervisor).await?;
                sup.actor()
                    .map(|a| a.get_cell())
                    .ok_or_else(|| BoxError::from("dynamic supervisor exited during start"))
            }
        })
        .shutdown(Shutdown::Infinity)
    }

    /// A ref to this supervisor running as child `id` in a parent whose table is `parent`
    /// (after [`DynamicSupervisor::into_child_spec`]). It resolves the current instance at
    /// every call, so it stays valid when the parent restarts it.
    pub fn handle_in(
        &self,
        parent: &Children,
        id: impl Into<String>,
    ) -> DynamicSupervisorRef<A, M> {
        DynamicSupervisorRef {
            source: Source::Child(parent.handle(id)),
            children: self.table.clone(),
        }
    }
}

/// The dynamic supervisor actor's message type; use [`DynamicSupervisorRef`]'s methods.
pub struct DynamicSupervisorMsg<A, M>(Request<A, M>);

impl<A, M> std::fmt::Debug for DynamicSupervisorMsg<A, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Request::Start { id, .. } => write!(f, "StartChild({id})"),
            Request::Terminate { id, .. } => write!(f, "TerminateChild({id})"),
            Request::Restart { id } => write!(f, "Restart({id})"),
        }
    }
}

enum Request<A, M> {
    Start {
        id: String,
        args: A,
        reply: RpcReplyPort<Result<ActorRef<M>, SupervisorError>>,
    },
    Terminate {
        id: String,
        reply: RpcReplyPort<Result<(), SupervisorError>>,
    },
    /// A delayed (or retried) restart of child `id`.
    Restart { id: String },
}

enum Source<A, M> {
    Fixed(ActorRef<DynamicSupervisorMsg<A, M>>),
    Child(ChildHandle<DynamicSupervisorMsg<A, M>>),
}

/// A running dynamic supervisor (or one found through its parent). Cheap to clone.
pub struct DynamicSupervisorRef<A, M> {
    source: Source<A, M>,
    children: Children,
}

impl<A, M> Clone for DynamicSupervisorRef<A, M> {
    fn clone(&self) -> Self {
        Self {
            source: match &self.source {
                Source::Fixed(a) => Source::Fixed(a.clone()),
                Source::Child(h) => Source::Child(h.clone()),
            },
            children: self.children.clone(),
        }
    }
}

impl<A, M> std::fmt::Debug for DynamicSupervisorRef<A, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("DynamicSupervisorRef");
        match &self.source {
            Source::Fixed(a) => d.field("actor", &a.get_id()),
            Source::Child(h) => d.field("child", &h.id()),
        };
        d.field("children", &self.children.len()).finish()
    }
}

impl<A: Send + 'static, M: Message> DynamicSupervisorRef<A, M> {
    /// The supervisor actor, if it is running.
    pub fn actor(&self) -> Option<ActorRef<DynamicSupervisorMsg<A, M>>> {
        match &self.source {
            Source::Fixed(a) => Some(a.clone()),
            Source::Child(h) => h.get(),
        }
    }

    fn running(&self) -> Result<ActorRef<DynamicSupervisorMsg<A, M>>, SupervisorError> {
        self.actor()
            .ok_or_else(|| SupervisorError::Call("dynamic supervisor is not running".into()))
    }

    /// Start a child `id` with `args`; returns once its `init` succeeded. Errors:
    /// [`SupervisorError::AlreadyExists`], [`SupervisorError::Full`],
    /// [`SupervisorError::ChildStart`] (the child is not kept), [`SupervisorError::Call`].
    pub async fn start_child(
        &self,
        id: impl Into<String>,
        args: A,
    ) -> Result<ActorRef<M>, SupervisorError> {
        let id = id.into();
        let sup = self.running()?;
        let answer = sup
            .call(
                |reply| DynamicSupervisorMsg(Request::Start { id, args, reply }),
                None,
            )
            .await;
        settle(answer)
    }

    /// Stop child `id` (gracefully within its shutdown timeout, else killed) and forget it;
    /// it is not restarted. [`SupervisorError::NotFound`] if there is no such child.
    pub async fn terminate_child(&self, id: impl Into<String>) -> Result<(), SupervisorError> {
        let id = id.into();
        let sup = self.running()?;
        let answer = sup
            .call(
                |reply| DynamicSupervisorMsg(Request::Terminate { id, reply }),
                None,
            )
            .await;
        settle(answer)
    }

    /// The current actor of child `id` (`None` while it is down or unknown).
    pub fn which_child(&self, id: &str) -> Option<ActorRef<M>> {
        self.children.get(id)
    }

    /// Ids of the running children, in start order.
    pub fn which_children(&self) -> Vec<String> {
        self.children.running()
    }

    /// Number of children (running or awaiting restart).
    pub fn count(&self) -> usize {
        self.children.len()
    }

    /// The children lookup table.
    pub fn children(&self) -> &Children {
        &self.children
    }

    /// Stop gracefully (all children stopped in parallel, their `terminate` runs); returns
    /// when the supervisor has exited.
    pub async fn stop(&self) {
        if let Some(a) = self.actor() {
            a.stop(None);
            let _ = a.wait(None).await;
        }
    }

    /// Wait until the supervisor has exited.
    pub async fn wait(&self) {
        if let Some(a) = self.actor() {
            let _ = a.wait(None).await;
        }
    }
}

fn settle<T, E>(
    answer: Result<CallResult<Result<T, SupervisorError>>, E>,
) -> Result<T, SupervisorError> {
    match answer {
        Ok(CallResult::Success(result)) => result,
        Ok(CallResult::Timeout) => Err(SupervisorError::Call("timed out".into())),
        Ok(CallResult::SenderError) => Err(SupervisorError::Call(
            "dynamic supervisor exited before answering".into(),
        )),
        Err(_) => Err(SupervisorError::Call(
            "dynamic supervisor is not running".into(),
        )),
    }
}

struct DynActor<A, M>(PhantomData<fn() -> (A, M)>);

struct DynChild<A> {
    /// Kept for restarts (only when the restart type can restart).
    args: Option<A>,
    cell: Option<ActorCell>,
}

struct State<A, M> {
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

    /// Stop every child in parallel and forget them all.
    async fn stop_all(&mut self) {
        self.by_actor.clear();
        let how = self.spec.shutdown;
        let running: Vec<(String, ActorCell)> = self
            .children
            .drain()
            .filter_map(|(id, c)| c.cell.map(|cell| (id, cell)))
            .collect();
        self.spec.table.reset(std::iter::empty());
        let stops = running.into_iter().map(|(id, cell)| async move {
            let stopped = shutdown_child(&cell, &id, how).await;
            (id, cell.get_id(), stopped)
        });
        for (id, actor, stopped) in futures::future::join_all(stops).await {
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
