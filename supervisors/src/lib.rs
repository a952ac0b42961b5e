//! OTP supervision behaviours on [ractor]: a gen_server-like [`Server`] with a `terminate`
//! hook, a static [`Supervisor`] (`one_for_one`, `one_for_all`, `rest_for_one`) and a
//! [`DynamicSupervisor`] (`simple_one_for_one`).
//!
//! # Why not plain ractor
//!
//! ractor gives actors, links and supervision events, but no restart strategies, and its
//! `post_stop` does not run when a handler returns `Err`, panics, or is killed; an actor that
//! dies kills its linked children instead of stopping them. This crate adds what OTP
//! programs rely on:
//!
//! * [`Server::terminate`] runs exactly once when a server ends: on a normal stop
//!   ([`ExitReason::Normal`]), on shutdown by its supervisor ([`ExitReason::Shutdown`]), on a
//!   handler error or a (caught) panic ([`ExitReason::Error`]); not on kill and not when
//!   `init` fails, like a gen_server that traps exits.
//! * [`Supervisor`] starts children in order (a failing start aborts the whole start), stops
//!   them in reverse order, each gracefully within its [`Shutdown`] timeout and then killed,
//!   applies the [`Strategy`] and the [`Restart`] type of the exited child, and counts
//!   restarts against the intensity (`max_restarts` in a window); beyond it, it stops its
//!   children and fails to its own parent. An optional restart delay spaces restarts out.
//! * [`DynamicSupervisor`] runs any number (up to `max_children`) of children of one kind,
//!   started and terminated at run time by id, with the same guarantees.
//! * [`Children`] / [`ChildHandle`] look children up by id and always give the *current*
//!   actor: a restarted child is a new actor, so keep ids, not `ActorRef`s.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//!
//! use ractor::{ActorRef, RpcReplyPort, call};
//! use supervisors::{
//!     BoxError, ChildSpec, DynamicSupervisor, ExitReason, Restart, Server, Strategy, Supervisor,
//! };
//!
//! /// A counter: `Add` adds, `Get` answers, `Crash` fails the handler.
//! #[derive(Clone)]
//! struct Counter;
//!
//! enum Msg {
//!     Add(u64),
//!     Get(RpcReplyPort<u64>),
//!     Crash,
//! }
//!
//! impl Server for Counter {
//!     type Msg = Msg;
//!     type State = u64;
//!     type Args = u64;
//!
//!     async fn init(&self, _: ActorRef<Msg>, start: u64) -> Result<u64, BoxError> {
//!         Ok(start)
//!     }
//!
//!     async fn handle(&self, _: ActorRef<Msg>, msg: Msg, n: &mut u64) -> Result<(), BoxError> {
//!         match msg {
//!             Msg::Add(k) => *n += k,
//!             Msg::Get(reply) => {
//!                 let _ = reply.send(*n);
//!             }
//!             Msg::Crash => return Err("crash requested".into()),
//!         }
//!         Ok(())
//!     }
//!
//!     async fn terminate(&self, _: ActorRef<Msg>, n: u64, reason: ExitReason) {
//!         // Runs on stop, shutdown, error and panic: a place to save `n`.
//!         let _ = (n, reason);
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A static rest_for_one tree of two counters.
//! let sup = Supervisor::new(Strategy::RestForOne)
//!     .intensity(3, Duration::from_secs(5))
//!     .child(ChildSpec::server("first", Counter, |_| 10))
//!     .child(ChildSpec::server("second", Counter, |_| 20))
//!     .start()
//!     .await?;
//! let first = sup.which_child::<Msg>("first").ok_or("first is down")?;
//! first.send_message(Msg::Add(5))?;
//! assert_eq!(call!(first, Msg::Get)?, 15);
//!
//! // It crashes: both restart (rest_for_one), and lookups give the new actors.
//! first.send_message(Msg::Crash)?;
//! first.wait(None).await?;
//! let restarted = loop {
//!     match sup.which_child::<Msg>("first") {
//!         Some(a) if a.get_id() != first.get_id() => break a,
//!         _ => tokio::time::sleep(Duration::from_millis(1)).await,
//!     }
//! };
//! assert_eq!(call!(restarted, Msg::Get)?, 10);
//!
//! // One actor per job, by id.
//! let jobs = DynamicSupervisor::server(Counter)
//!     .restart(Restart::Transient)
//!     .max_children(100)
//!     .start()
//!     .await?;
//! let job = jobs.start_child("job-1", 0).await?;
//! job.send_message(Msg::Add(1))?;
//! assert_eq!(jobs.which_children(), vec!["job-1"]);
//! jobs.terminate_child("job-1").await?; // graceful: its terminate runs
//! assert_eq!(jobs.count(), 0);
//!
//! jobs.stop().await;
//! sup.stop().await; // children stop in reverse order
//! # Ok(())
//! # }
//! ```
//!
//! # ractor features used, and what is worked around
//!
//! Used: `Actor` (`pre_start`/`handle`/`handle_supervisor_evt`/`post_stop`),
//! `spawn_linked` links and `SupervisionEvent`s, `stop`/`kill`/`wait`, `send_after`, calls
//! with `RpcReplyPort`, the named registry. Worked around: `post_stop` not running after a
//! handler error or panic (the server catches both and runs `terminate` itself before
//! failing); `post_stop` not receiving the stop reason (the supervisor marks a child before
//! shutting it down, see [`ExitReason::Shutdown`]); an actor's death killing its linked
//! children (supervisors stop their children themselves, in order, before they exit).
#![warn(missing_docs)]

mod child_spec;
mod dynamic;
mod error;
mod intensity;
mod lookup;
mod observe;
mod server;
mod shutdown;
mod supervisor;

pub use child_spec::{ChildContext, ChildSpec, Restart, StartFuture};
pub use dynamic::{
    ChildExit, DynStartFuture, DynamicSupervisor, DynamicSupervisorMsg, DynamicSupervisorRef,
};
pub use error::{BoxError, SupervisorError};
pub use intensity::Intensity;
pub use lookup::{ChildHandle, Children};
pub use observe::{Observable, observe, observe_within};
pub use server::{ExitReason, Server, start, start_linked};
pub use shutdown::Shutdown;
pub use supervisor::{Strategy, Supervisor, SupervisorMsg, SupervisorRef};
