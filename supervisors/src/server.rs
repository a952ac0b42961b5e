//! The server behaviour: OTP's `gen_server` with `trap_exit`, on a ractor actor.
//!
//! Implement [`Server`] (one trait: `init`, `handle`, optional `terminate` and
//! `handle_child_exit`) and start it with [`start`] or [`start_linked`]. The resulting
//! `ActorRef<Msg>` is a plain ractor actor: `send_message`, `cast!`, `call!` with an
//! `RpcReplyPort` all work.
//!
//! `terminate(state, reason)` runs exactly once when the actor ends, except on kill:
//! * `ExitReason::Normal`: the actor was stopped (`stop`, `stop_and_wait`, `drain`) by itself
//!   or by anyone other than its supervisor;
//! * `ExitReason::Shutdown`: its supervisor shut it down;
//! * `ExitReason::Error(text)`: `handle`/`handle_child_exit` returned `Err` or panicked (the
//!   panic is caught); after `terminate` the actor still fails, so its supervisor sees a
//!   failure and applies its restart policy.
//!
//! Not on `kill` (OTP `brutal_kill`/`kill`), and not when `init` fails.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use ractor::{Actor, ActorCell, ActorRef, Message, SpawnErr, SupervisionEvent};
use tokio::task::JoinHandle;

use crate::error::BoxError;
use crate::shutdown;

/// Why a server is terminating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitReason {
    /// Stopped by itself or by another actor (not its supervisor).
    Normal,
    /// Shut down by its supervisor (supervisor stopping, or restarting siblings).
    Shutdown,
    /// A callback returned an error or panicked; the text of the error or panic.
    Error(String),
}

/// A server: implement this, then [`start`] / [`start_linked`] it (or put it in a
/// [`crate::ChildSpec::server`]).
///
/// Callbacks take `&self`; keep per-instance data in `State`, configuration in `Self`.
pub trait Server: Send + Sync + Sized + 'static {
    /// The messages this server handles. Use `ractor::RpcReplyPort<T>` fields for calls.
    type Msg: Message;
    /// The server's state, created by `init`.
    type State: Send + 'static;
    /// Start arguments given to `init`.
    type Args: Send + 'static;

    /// Build the state. An `Err` (or panic) fails the start; `terminate` does not run.
    fn init(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Args,
    ) -> impl Future<Output = Result<Self::State, BoxError>> + Send;

    /// Handle one message. An `Err` (or panic) runs `terminate` with `ExitReason::Error` and
    /// then fails the actor. To stop normally, call `myself.stop(None)`.
    fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Called when an actor linked to this one (spawned with `spawn_linked` using `myself`)
    /// starts or exits. The default treats a failed linked actor as this server's own failure,
    /// and ignores everything else.
    fn handle_child_exit(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = (myself, state);
        async move {
            match event {
                SupervisionEvent::ActorFailed(who, err) => {
                    Err(format!("linked actor {} failed: {err}", who.get_id()).into())
                }
                _ => Ok(()),
            }
        }
    }

    /// Clean up; see the module docs for when it runs. Panics here are caught and logged.
    fn terminate(
        &self,
        myself: ActorRef<Self::Msg>,
        state: Self::State,
        reason: ExitReason,
    ) -> impl Future<Output = ()> + Send {
        let _ = (myself, state, reason);
        async {}
    }
}

/// Start `server` unsupervised. `name` registers it in ractor's global registry.
pub async fn start<S: Server>(
    name: Option<String>,
    server: S,
    args: S::Args,
) -> Result<(ActorRef<S::Msg>, JoinHandle<()>), SpawnErr> {
    Actor::spawn(name, ServerActor(server), args).await
}

/// Start `server` linked to `supervisor` (its exit is reported to that actor).
pub async fn start_linked<S: Server>(
    name: Option<String>,
    server: S,
    args: S::Args,
    supervisor: ActorCell,
) -> Result<(ActorRef<S::Msg>, JoinHandle<()>), SpawnErr> {
    Actor::spawn_linked(name, ServerActor(server), args, supervisor).await
}

/// The ractor actor that runs a [`Server`].
struct ServerActor<S>(S);

/// The user state, taken out when `terminate` consumes it.
struct Slot<T>(Option<T>);

/// The text of a caught panic payload.
pub(crate) fn panic_text(payload: Box<dyn Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "panic".to_string()
    }
}

impl<S: Server> ServerActor<S> {
    async fn terminate(&self, myself: ActorRef<S::Msg>, state: S::State, reason: ExitReason) {
        tracing::debug!(actor = %myself.get_id(), ?reason, "terminate");
        let run = AssertUnwindSafe(self.0.terminate(myself.clone(), state, reason));
        if let Err(panic) = run.catch_unwind().await {
            tracing::error!(actor = %myself.get_id(), reason = panic_text(panic), "terminate panicked");
        }
    }

    /// Turn a callback outcome into the actor's: on error/panic run terminate, then fail.
    async fn settle(
        &self,
        myself: ActorRef<S::Msg>,
        slot: &mut Slot<S::State>,
        outcome: Result<Result<(), BoxError>, Box<dyn Any + Send>>,
    ) -> Result<(), BoxError> {
        let text = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(panic) => panic_text(panic),
        };
        tracing::warn!(actor = %myself.get_id(), error = %text, "server failed");
        if let Some(state) = slot.0.take() {
            self.terminate(myself, state, ExitReason::Error(text.clone()))
                .await;
        }
        Err(text.into())
    }
}

impl<S: Server> Actor for ServerActor<S> {
    type Msg = S::Msg;
    type State = Slot<S::State>;
    type Arguments = S::Args;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, BoxError> {
        Ok(Slot(Some(self.0.init(myself, args).await?)))
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        slot: &mut Self::State,
    ) -> Result<(), BoxError> {
        let Some(state) = slot.0.as_mut() else {
            return Err("server state already terminated".into());
        };
        let outcome = AssertUnwindSafe(self.0.handle(myself.clone(), msg, state))
            .catch_unwind()
            .await;
        self.settle(myself, slot, outcome).await
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        slot: &mut Self::State,
    ) -> Result<(), BoxError> {
        let Some(state) = slot.0.as_mut() else {
            return Err("server state already terminated".into());
        };
        let outcome = AssertUnwindSafe(self.0.handle_child_exit(myself.clone(), event, state))
            .catch_unwind()
            .await;
        self.settle(myself, slot, outcome).await
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        slot: &mut Self::State,
    ) -> Result<(), BoxError> {
        let reason = if shutdown::take_mark(myself.get_id()) {
            ExitReason::Shutdown
        } else {
            ExitReason::Normal
        };
        if let Some(state) = slot.0.take() {
            self.terminate(myself, state, reason).await;
        }
        Ok(())
    }
}
