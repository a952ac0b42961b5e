//! observe: the one question every actor answers, "what is your state?" (as quickwit's actors
//! do). An actor's message enum has an `Observe(RpcReplyPort<Observation>)` variant and
//! implements [`Observable`]; [`observe`] asks for a snapshot. Answering must be cheap (no
//! I/O), so an operator or a test can observe a busy actor.

use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, Message, RpcReplyPort};

/// A message type with an `Observe` variant.
pub trait Observable: Message {
    /// The snapshot the actor answers with.
    type Observation: Send + 'static;

    /// The `Observe` message carrying `reply`.
    fn observe(reply: RpcReplyPort<Self::Observation>) -> Self;
}

/// Asks `actor` for its observation; `None` when it is not running or ends without answering.
pub async fn observe<M: Observable>(actor: &ActorRef<M>) -> Option<M::Observation> {
    answer(actor.call(M::observe, None).await)
}

/// [`observe`], giving up (`None`) after `timeout`: a stuck actor does not hang the caller.
pub async fn observe_within<M: Observable>(
    actor: &ActorRef<M>,
    timeout: Duration,
) -> Option<M::Observation> {
    answer(actor.call(M::observe, Some(timeout)).await)
}

fn answer<T, E>(res: Result<CallResult<T>, E>) -> Option<T> {
    match res {
        Ok(CallResult::Success(o)) => Some(o),
        _ => None,
    }
}
