//! `observe`: an actor's `Observe` message answers its current state; a stopped actor answers
//! nothing, and `observe_within` gives up on an actor stuck in a long handler.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, Observable, Server, observe, observe_within, start};

/// Counts `Bump`s; `Stall` keeps the handler busy for a minute.
struct Counter;

enum Msg {
    Bump,
    Stall,
    Observe(RpcReplyPort<u32>),
}

impl Observable for Msg {
    type Observation = u32;
    fn observe(reply: RpcReplyPort<u32>) -> Self {
        Msg::Observe(reply)
    }
}

impl Server for Counter {
    type Msg = Msg;
    type State = u32;
    type Args = ();

    async fn init(&self, _: ActorRef<Msg>, _: ()) -> Result<u32, BoxError> {
        Ok(0)
    }

    async fn handle(&self, _: ActorRef<Msg>, msg: Msg, n: &mut u32) -> Result<(), BoxError> {
        match msg {
            Msg::Bump => *n += 1,
            Msg::Stall => tokio::time::sleep(Duration::from_secs(60)).await,
            Msg::Observe(reply) => {
                let _ = reply.send(*n);
            }
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn observe_answers_the_state_after_earlier_messages() {
    let (c, _) = start(None, Counter, ()).await.unwrap();
    assert_eq!(observe(&c).await, Some(0));
    c.send_message(Msg::Bump).unwrap();
    c.send_message(Msg::Bump).unwrap();
    assert_eq!(observe(&c).await, Some(2));
    c.stop_and_wait(None, None).await.unwrap();
    assert_eq!(observe(&c).await, None);
}

#[tokio::test(start_paused = true)]
async fn observe_within_gives_up_on_a_stuck_actor() {
    let (c, _) = start(None, Counter, ()).await.unwrap();
    c.send_message(Msg::Stall).unwrap();
    assert_eq!(observe_within(&c, Duration::from_secs(1)).await, None);
    // Once the handler is done, the actor answers again.
    assert_eq!(observe(&c).await, Some(0));
    c.stop(None);
}
