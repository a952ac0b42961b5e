//! The replicator: the `rest_for_one` actor tree reproducing `couch_replicator_sup` (docs/architecture.md, "The supervision tree"), and [`Replicator`], the handle a host embeds. The pure policy modules (AIMD
//! intervals, job backoff, job-server rotation) are kept apart from the actors that apply
//! them.

pub mod backoff;
pub mod churn;
pub mod clustering;
pub mod collision;
pub mod connection_pool;
pub mod context;
pub mod doc_processor;
pub mod doc_writeback;
pub mod error;
pub mod event_bus;
pub mod frontend;
pub mod handle;
pub mod job;
mod job_lease;
pub(crate) mod job_observe;
pub mod job_record;
mod job_runner;
pub mod job_server;
pub(crate) mod job_sup;
pub mod membership;
pub mod rate_limiter;
pub mod rep_doc;
pub mod rep_job;
mod rotation;
pub mod server_job;
mod server_worker;
pub(crate) mod settings;
pub mod share;
pub mod share_plan;
mod start;
pub mod tree;
pub(crate) mod validate_ddoc;

pub use error::{ReplicatorError, ReplicatorResult};
pub use event_bus::{ClusterStatus, EventReceiver, ReplicatorEvent};
pub use frontend::{Frontend, ServiceFn, ServiceFuture};
pub use handle::{NewJob, Replicator, ReplicatorConfig, WaitFor};
pub use job_record::{HistoryKind, JobError, RepJobRecord};
pub use rep_job::{JobKind, JobView, RepState};
pub use server_job::{DbProgress, ServerJobView, ServerSpec, ServerState};
pub use settings::{NodeType, ReplicatorSettings, SettingsError};
