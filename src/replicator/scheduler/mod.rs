//! Which jobs run on this node and for how long: the job server's acceptors and rotation
//! ([`job_server`]), its table of running job actors (`running_jobs`), the pure rotation
//! arithmetic it applies (`rotation_policy`), fair share between `_replicator` databases
//! (`share`, `share_plan`), the dynamic supervisor of job actors (`job_sup`), and the count
//! of the cluster's jobs that `/metrics` shows ([`census`]).
//!
//! The job server takes [`job_server::JobServerMsg`]: `Accepted` (an acceptor took a job),
//! `AcceptorEnded`, `WorkerExited`, `Tick` (the rotation interval), `StopAll` and `Observe`.

pub(crate) mod balance;
pub mod census;
mod job_acceptor;
pub mod job_server;
pub(crate) mod job_sup;
pub(crate) mod rotation_policy;
pub(crate) mod running_jobs;
pub(crate) mod share;
pub(crate) mod share_plan;

#[cfg(any(test, feature = "internals"))]
pub use share::{ShareKey, ShareParams, share_error};
