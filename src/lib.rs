#![warn(missing_docs)]
//! couch-replicator: Apache CouchDB's replicator and its `couch_jobs` background-jobs
//! framework, re-implemented in Rust on OTP-style supervised actors.
//!
//! Layers (dependencies point downwards only, see docs/architecture.md, "Layers and the one-way rule"):
//! - [`store`]: the transactional ordered key-value contract (FoundationDB semantics) and its
//!   engines.
//! - [`jobs`]: couch_jobs, the background-jobs framework on the store.
//! - [`replication`]: the CouchDB replication protocol engine (one replication, no scheduling).
//! - [`replicator`]: the replicator application: policies, settings, the supervision tree.
//! - [`steps`]: the thesis' multi-step, node-targeted job type on couch_jobs.
//! - [`http`]: the HTTP API.
//! - [`telemetry`]: metrics, their renderings and log setup (a leaf every layer reports to).

pub mod backoff;
pub mod http;
pub mod jobs;
pub mod replication;
pub mod replicator;
pub mod steps;
pub mod store;
pub mod telemetry;

pub use replicator::{
    JobKind, JobView, NewJob, RepState, Replicator, ReplicatorConfig, ReplicatorError,
    ReplicatorEvent, WaitFor,
};
