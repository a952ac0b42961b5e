//! Steps jobs: the multi-step, node-targeted job distributor of the job-distribution thesis
//! (Unge, 2011; docs/architecture.md, "Sources") rebuilt as
//! job types on couch_jobs (docs/architecture.md, "Steps jobs").
//!
//! A job is an ordered list of steps, each for a named node or `any`, run strictly in order
//! and each exactly once, with retries and an alternative command. Where the thesis saved a
//! replicated document 2-4 times per step (claim, winner, start, finish) and needed a
//! "keep docs alive" process to rescue forgotten jobs, here a step costs one couch_jobs
//! `accept` (marking it running) and one `finish` (recording the result and queueing the
//! next step in the same transaction); a queued step is never forgotten, and a dead
//! worker's step is re-enqueued by the activity monitor.
//!
//! - [`Steps`]: the API (submit, get, list, wait) and shared handle;
//! - [`StepsNode`]: a node's pool of workers, each a [`worker_actor::StepWorker`] child of a
//!   `supervisors::Supervisor`;
//! - [`Action`]: what a command does — [`DisabledAction`] by default, [`ShellAction`] or
//!   [`SleepAction`] when chosen, or the host's own.

pub(crate) mod action;
pub(crate) mod api;
pub(crate) mod config;
pub mod error;
pub(crate) mod execute;
pub(crate) mod keys;
pub mod model;
pub mod node;
pub mod retry;
pub mod shell;
pub mod sleep_action;
pub(crate) mod stats;
pub(crate) mod txn;
pub mod worker;
pub mod worker_actor;

pub use action::{Action, DisabledAction};
pub use api::{ListOptions, Steps, StepsState};
pub use config::StepsConfig;
pub use error::StepsError;
pub use model::JobSpec;
// What the crate's tests and benches name.
pub use node::StepsNode;
pub use shell::ShellAction;
pub use sleep_action::SleepAction;
#[cfg(any(test, feature = "internals"))]
pub use {
    action::{ActionContext, ActionError, ActionOutcome},
    model::{JobDoc, JobOutcome, RetryStrategy, StepSpec, StepStatus, Target},
    stats::WriteStats,
};
