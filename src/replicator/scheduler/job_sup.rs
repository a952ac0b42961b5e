//! job_sup: the dynamic supervisor of job actors (OTP `simple_one_for_one`, CouchDB's
//! `couch_replicator_scheduler_sup`), a [`supervisors::DynamicSupervisor`] with one child per
//! running replication, keyed by couch_jobs job id. Children are temporary: a job actor that
//! exits is never restarted here (its own terminate hook resubmits the job, and the activity
//! monitor covers killed ones). Every exit is reported through the `on_exit` hook the tree
//! gives it (to the job server). On shutdown it stops
//! every job gracefully and in parallel (each writes its final checkpoint and goes back to
//! pending), killing any still running after [`JOB_SHUTDOWN`].
//!
//! It takes the supervisor's own calls through [`JobSupRef`]: `start_child`, `which_child`,
//! `which_children`, `terminate_child`.

use std::time::Duration;

use supervisors::{ChildExit, DynamicSupervisor, DynamicSupervisorRef, Shutdown};

use crate::replicator::job::actor::{JobActor, JobArgs, JobMsg};

/// How long a stopping job may take before it is killed (CouchDB: 5 s).
pub const JOB_SHUTDOWN: Duration = Duration::from_secs(5);

/// The dynamic supervisor's id in the tree (no lookup by type: the tree holds its handle).
pub(crate) const JOB_SUP: &str = "job_sup";

/// A handle on the node's job_sup that stays valid across its restarts.
pub type JobSupRef = DynamicSupervisorRef<JobArgs, JobMsg>;

/// The job_sup specification; `on_exit` hears of every job actor's exit (the tree passes one
/// that tells the job server, so this module needs no path back up to it).
pub fn spec(
    on_exit: impl Fn(ChildExit) + Send + Sync + 'static,
) -> DynamicSupervisor<JobArgs, JobMsg> {
    // Temporary children (the default): a job resubmits itself, job_sup never restarts it.
    DynamicSupervisor::server(JobActor)
        .shutdown(Shutdown::Timeout(JOB_SHUTDOWN))
        .on_exit(on_exit)
}
