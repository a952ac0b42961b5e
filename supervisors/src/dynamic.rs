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
//! The actor that handles them, and its state, is in `dynamic/actor.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorId, ActorRef, Message, RpcReplyPort, rpc::CallResult};

use crate::child_spec::{ChildContext, ChildSpec, Restart};
use crate::error::{BoxError, SupervisorError};
use crate::lookup::{ChildHandle, Children};
use crate::server::{self, ExitReason, Server};
use crate::shutdown::Shutdown;
use crate::supervisor::spawn_error;

mod actor;
use actor::DynActor;

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
        let actor = DynActor::new();
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
