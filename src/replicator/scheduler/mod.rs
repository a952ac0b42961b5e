//! Which jobs run on this node and for how long: the job server's acceptors and rotation
//! ([`job_server`]), its table of running job actors (`running_jobs`), the pure rotation
//! arithmetic it applies ([`rotation_policy`]), fair share between `_replicator` databases
//! ([`share`], [`share_plan`]), and the dynamic supervisor of job actors (`job_sup`).
//!
//! The job server takes [`job_server::JobServerMsg`]: `Accepted` (an acceptor took a job),
//! `AcceptorEnded`, `WorkerExited`, `Tick` (the rotation interval), `StopAll` and `Observe`.

pub mod job_server;
pub(crate) mod job_sup;
pub mod rotation_policy;
pub(crate) mod running_jobs;
pub mod share;
pub mod share_plan;
