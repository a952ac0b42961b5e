//! A small `rest_for_one` tree: `config` -> `cache` -> `worker` -> `reporter`.
//!
//! The worker crashes; the supervisor stops the children started after it (reporter first),
//! then restarts worker and reporter in order. `config` and `cache` keep running. Finally the
//! whole tree is shut down in reverse order.
//!
//! Run: `cargo run -p supervisors --example tree`

use std::time::Duration;

use ractor::ActorRef;
use supervisors::{BoxError, ChildSpec, ExitReason, Server, Strategy, Supervisor};

/// A server that prints its lifecycle and crashes on request.
#[derive(Clone)]
struct Node(&'static str);

enum Msg {
    Crash,
}

impl Server for Node {
    type Msg = Msg;
    type State = ();
    type Args = ();

    async fn init(&self, myself: ActorRef<Msg>, _: ()) -> Result<(), BoxError> {
        println!("  start     {:<8} (actor {})", self.0, myself.get_id());
        Ok(())
    }

    async fn handle(&self, _: ActorRef<Msg>, msg: Msg, _: &mut ()) -> Result<(), BoxError> {
        match msg {
            Msg::Crash => Err(format!("{} hit a bug", self.0).into()),
        }
    }

    async fn terminate(&self, _: ActorRef<Msg>, _: (), reason: ExitReason) {
        println!("  terminate {:<8} reason {reason:?}", self.0);
    }
}

fn child(name: &'static str) -> ChildSpec {
    ChildSpec::server(name, Node(name), |_| ())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("starting a rest_for_one tree (children start in order):");
    let sup = Supervisor::new(Strategy::RestForOne)
        .intensity(3, Duration::from_secs(5))
        .child(child("config"))
        .child(child("cache"))
        .child(child("worker"))
        .child(child("reporter"))
        .start()
        .await?;
    println!("running: {:?}", sup.which_children());

    let worker = sup
        .which_child::<Msg>("worker")
        .ok_or("worker is not running")?;
    let old_reporter = sup
        .which_child::<Msg>("reporter")
        .ok_or("reporter is not running")?
        .get_id();
    println!("\nworker crashes (reporter is stopped, then worker and reporter restart):");
    worker.send_message(Msg::Crash)?;
    worker.wait(None).await?;
    // The restart happens in the supervisor; the reporter restarts last, so once a new
    // reporter is up the whole restart is done.
    while sup
        .which_child::<Msg>("reporter")
        .is_none_or(|r| r.get_id() == old_reporter)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let new_worker = sup
        .which_child::<Msg>("worker")
        .ok_or("worker did not come back")?;
    println!(
        "running: {:?}; worker was actor {}, now actor {}",
        sup.which_children(),
        worker.get_id(),
        new_worker.get_id()
    );

    println!("\nshutting the tree down (reverse order):");
    sup.stop().await;
    println!("done");
    Ok(())
}
