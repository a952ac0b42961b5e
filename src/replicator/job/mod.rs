//! One replication job: its stored record in couch_jobs (`record`), its id and how it is computed
//! (`id`), how the rest of the node sees it (`view`: [`view::JobView`]), the collision index
//! that keeps one job per replication id (`collision`), which transient jobs each user
//! holds (`owners`), the error backoff between its runs
//! (`error_backoff`), the lease that keeps a replication from running on two nodes at
//! once (`lease`), and the actor that runs it ([`actor`], with `runner` for the engine
//! task and its lease watchdog, and `observe` for its span and counters).
//!
//! The job actor takes [`actor::JobMsg`]: `Start`, `Tick` (stats and checkpoint period),
//! `CheckLock`, `Done` (the engine ended), `Rotate` (the job server trims it), `LeaseLost`
//! (the lease watchdog aborted the replication) and `Observe`.

pub mod actor;
pub(crate) mod collision;
pub(crate) mod error_backoff;
pub(crate) mod id;
pub(crate) mod lease;
pub(crate) mod observe;
pub(crate) mod owners;
pub(crate) mod record;
pub(crate) mod runner;
pub(crate) mod view;

#[cfg(any(test, feature = "internals"))]
pub use id::persistent_job_id;
pub use view::REP_JOBS;
