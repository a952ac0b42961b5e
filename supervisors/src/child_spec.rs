//! Child specifications: what a [`crate::Supervisor`] starts, when it restarts it, and how it
//! stops it. Also the classification of a child's exit (normal, shutdown, abnormal).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ractor::{ActorCell, SupervisionEvent};

use crate::error::BoxError;
use crate::lookup::Children;
use crate::server::{self, ExitReason, Server};
use crate::shutdown::{SHUTDOWN_REASON, Shutdown};

/// When a child is restarted after it exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Restart {
    /// Always restarted.
    #[default]
    Permanent,
    /// Restarted only after an abnormal exit (error, panic, kill); a normal stop or a
    /// shutdown leaves it stopped.
    Transient,
    /// Never restarted; removed from the supervisor when it exits.
    Temporary,
}

/// What a child's start function gets: the supervisor to link to, and the sibling table
/// (earlier siblings are already running when a child starts).
#[derive(Debug, Clone)]
pub struct ChildContext {
    /// The supervisor; spawn the child linked to it (`spawn_linked(.., ctx.supervisor)`).
    pub supervisor: ActorCell,
    /// The supervisor's children, for looking siblings up by id.
    pub siblings: Children,
}

/// A boxed child start future.
pub type StartFuture = Pin<Box<dyn Future<Output = Result<ActorCell, BoxError>> + Send>>;

type StartFn = Arc<dyn Fn(ChildContext) -> StartFuture + Send + Sync>;

/// One child of a [`crate::Supervisor`]: an id, an async start function, a restart type and
/// a shutdown policy.
#[derive(Clone)]
pub struct ChildSpec {
    pub(crate) id: String,
    pub(crate) start: StartFn,
    pub(crate) restart: Restart,
    pub(crate) shutdown: Shutdown,
}

impl std::fmt::Debug for ChildSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildSpec")
            .field("id", &self.id)
            .field("restart", &self.restart)
            .field("shutdown", &self.shutdown)
            .finish()
    }
}

impl ChildSpec {
    /// A child started by `start`, which must spawn the actor linked to
    /// `ctx.supervisor` and return its cell once it is running. Permanent, 5 s shutdown.
    pub fn new<F, Fut>(id: impl Into<String>, start: F) -> Self
    where
        F: Fn(ChildContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ActorCell, BoxError>> + Send + 'static,
    {
        Self {
            id: id.into(),
            start: Arc::new(move |ctx| Box::pin(start(ctx))),
            restart: Restart::Permanent,
            shutdown: Shutdown::default(),
        }
    }

    /// A [`Server`] child; `args` builds its start arguments at every (re)start.
    pub fn server<S, A>(id: impl Into<String>, server: S, args: A) -> Self
    where
        S: Server + Clone,
        A: Fn(&ChildContext) -> S::Args + Send + Sync + 'static,
    {
        let args = Arc::new(args);
        Self::new(id, move |ctx: ChildContext| {
            let server = server.clone();
            let args = args.clone();
            async move {
                let (actor, _) =
                    server::start_linked(None, server, args(&ctx), ctx.supervisor.clone()).await?;
                Ok(actor.get_cell())
            }
        })
    }

    /// Set the restart type.
    pub fn restart(mut self, restart: Restart) -> Self {
        self.restart = restart;
        self
    }

    /// Set the shutdown policy.
    pub fn shutdown(mut self, shutdown: Shutdown) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// The child id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// How a child ended, from its supervision event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exit {
    Normal,
    Shutdown,
    Abnormal(String),
}

impl Exit {
    /// The exited actor and how it ended; `None` for events that are not exits.
    pub(crate) fn of(event: &SupervisionEvent) -> Option<(ActorCell, Exit)> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let exit = match reason.as_deref() {
                    Some(SHUTDOWN_REASON) => Exit::Shutdown,
                    // ractor's reasons for a kill signal and for a cancelled actor task.
                    Some(r @ ("killed" | "actor_task_cancelled")) => Exit::Abnormal(r.into()),
                    _ => Exit::Normal,
                };
                Some((cell.clone(), exit))
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                Some((cell.clone(), Exit::Abnormal(err.to_string())))
            }
            _ => None,
        }
    }

    /// The same exit as a server [`ExitReason`] (what exit listeners are given).
    pub(crate) fn reason(&self) -> ExitReason {
        match self {
            Exit::Normal => ExitReason::Normal,
            Exit::Shutdown => ExitReason::Shutdown,
            Exit::Abnormal(text) => ExitReason::Error(text.clone()),
        }
    }

    /// Whether a child with restart type `restart` is restarted after this exit.
    pub(crate) fn restarts(&self, restart: Restart) -> bool {
        match restart {
            Restart::Permanent => true,
            Restart::Transient => matches!(self, Exit::Abnormal(_)),
            Restart::Temporary => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_types() {
        let crash = Exit::Abnormal("boom".into());
        for exit in [Exit::Normal, Exit::Shutdown, crash.clone()] {
            assert!(exit.restarts(Restart::Permanent));
            assert!(!exit.restarts(Restart::Temporary));
        }
        assert!(crash.restarts(Restart::Transient));
        assert!(!Exit::Normal.restarts(Restart::Transient));
        assert!(!Exit::Shutdown.restarts(Restart::Transient));
    }
}
