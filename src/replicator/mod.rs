//! The replicator: the `rest_for_one` actor tree reproducing `couch_replicator_sup`
//! (docs/architecture.md, "The supervision tree"), and [`Replicator`], the handle a host
//! embeds. One folder per concept; the pure policies (job backoff, rotation, fair share) sit
//! beside the actors that apply them:
//!
//! - [`node`]: one node's tree, its start, shared context, settings and node-wide services.
//! - [`job`]: one replication job: its record, view and id, its actor and backoff.
//! - [`scheduler`]: the job server, its rotation and fair share, and the job supervisor.
//! - [`cluster`]: membership of the nodes sharing one store.
//! - [`replicator_db`]: `_replicator` documents and replication requests.
//! - [`server_job`]: whole-server replication jobs.
//! - [`handle`], [`new_job`], `pause` and `error`: the embedding API (the node's handle, what
//!   it adds, holding and releasing a job) and its errors.

#[macro_use]
mod text_id;

pub mod cluster;
pub(crate) mod error;
pub mod handle;
pub mod job;
pub mod new_job;
pub mod node;
pub(crate) mod pause;
pub mod replicator_db;
pub mod scheduler;
pub mod server_job;

pub use error::{ReplicatorError, ReplicatorResult};
pub use handle::{Replicator, ReplicatorConfig, WaitFor};
pub use job::id::{JobId, JobRef};
pub use job::record::{HistoryEvent, HistoryKind, JobError};
pub use job::view::{JobKind, JobView, RepState};
pub use new_job::NewJob;
pub use node::event_bus::{ClusterStatus, EventReceiver, ReplicatorEvent};
pub use node::frontend::{Frontend, ServiceError, ServiceFn};
pub use node::name::NodeName;
pub use node::settings::{NodeType, ReplicatorSettings, SettingsError, TimingPolicy};
pub use server_job::spec::{DbProgress, ServerJobId, ServerJobView, ServerSpec, ServerState};
