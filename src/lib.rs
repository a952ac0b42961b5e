#![warn(missing_docs)]
//! couch-replicator: Apache CouchDB's replicator and its `couch_jobs` background-jobs
//! framework, re-implemented in Rust on OTP-style supervised actors.
//!
//! # Layout
//!
//! The layers are private modules; what a host needs is re-exported at the crate root (see
//! "Embedding the replicator"). Dependencies point downwards only (docs/architecture.md,
//! "Layers and the one-way rule"; every file is listed in its "Map of `src/`"):
//!
//! - `store`: the transactional ordered key-value contract (FoundationDB's semantics) and
//!   its engines: embedded on `redb` (the default), in-memory, etcd v3 (several processes or
//!   machines sharing one store), FoundationDB (feature `fdb`).
//! - `jobs`: couch_jobs, the background-jobs framework on the store.
//! - `replication`: the CouchDB replication protocol engine (one replication, no actors, no
//!   scheduling), and `verify`.
//! - `replicator`: the replicator application: the supervision tree of one node, its
//!   scheduling policies and settings, the `_replicator` document processor, and
//!   [`Replicator`], the handle a host embeds.
//! - `steps`: a second job type on couch_jobs (ordered steps, each for a named node), after
//!   the job-distribution thesis in docs/architecture.md's "Sources".
//! - `http`: the CouchDB-compatible HTTP API (axum).
//! - `telemetry`: metrics, their renderings and log setup (a leaf every layer reports to).
//! - `backoff`: exponential backoff, the one helper behind the crate's retry loops.
//! - [`cli`]: the `couch-replicator` command line; `src/main.rs` only calls [`cli::main`].
//!
//! The cargo feature `internals` makes the layers public modules. It exists for this crate's
//! own `tests/`, `benches/` and `examples/` (a dev-dependency of the crate on itself turns it on
//! for them), which reach actor messages and internals by path; it is not a supported API.
//!
//! Outside this crate: the `supervisors` crate (OTP behaviours on ractor), `tests/` (one binary
//! per layer), `benches/` and `examples/`.
//!
//! # Embedding the replicator
//!
//! A host owns the store, starts a node on it, adds jobs and reads them through the
//! [`Replicator`] handle, and shuts the node down (running jobs checkpoint and go back to
//! `pending`). Every node sharing one store is one cluster. Here the node is
//! `api_frontend` only, so it adds the job but nothing runs it (a `replication` node on
//! the same store would): `examples/embedded.rs` runs a replication to the end.
//!
//! ```
//! use std::sync::Arc;
//!
//! use couch_replicator::{
//!     Db, Endpoint, MemoryStore, NewJob, NodeType, RepState, Replicator, ReplicatorConfig,
//! };
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), couch_replicator::ReplicatorError> {
//! // The store: in memory here; `EmbeddedStore` on disk, `EtcdStore`, or FoundationDB.
//! let mut config = ReplicatorConfig::new(Db::new(Arc::new(MemoryStore::new())));
//! config.settings.node_types = vec![NodeType::ApiFrontend];
//! let node = Replicator::start(config).await?;
//!
//! // A transient job, as `POST /_replicate` makes one, from typed endpoints and options.
//! let source = Endpoint::parse("http://127.0.0.1:5984/a")?;
//! let target = Endpoint::parse("http://127.0.0.1:5984/b")?;
//! let new = NewJob::transient(source, target)
//!     .continuous()
//!     .create_target()
//!     .user("alice");
//! let job = node.add(new).await?;
//! assert_eq!(job.user.as_deref(), Some("alice"));
//!
//! // Read it back: pending until a `replication` node accepts it.
//! let view = node.get(&job.job_id).await?;
//! assert_eq!(view.state, RepState::Pending);
//! assert_eq!(node.list().await?.len(), 1);
//!
//! node.shutdown().await;
//! # Ok(())
//! # }
//! ```

/// Declares a method `pub` under the `internals` feature and `pub(crate)` otherwise: the
/// handle's hooks into internal types (couch_jobs, the supervision tree, the HTTP frontend)
/// serve the HTTP layer, the CLI and this crate's tests, not the embedding API.
macro_rules! internal_pub {
    ($(#[$m:meta])* fn $($rest:tt)*) => {
        #[cfg(feature = "internals")]
        $(#[$m])* pub fn $($rest)*
        #[cfg(not(feature = "internals"))]
        $(#[$m])* pub(crate) fn $($rest)*
    };
    ($(#[$m:meta])* async fn $($rest:tt)*) => {
        #[cfg(feature = "internals")]
        $(#[$m])* pub async fn $($rest)*
        #[cfg(not(feature = "internals"))]
        $(#[$m])* pub(crate) async fn $($rest)*
    };
}

// The layers are private: the embedding API below is re-exported at the root, and the binary's
// command line lives in `cli`. The `internals` feature (for this crate's own integration tests,
// benches and examples, through a dev-dependency on itself) makes the layers public so those
// can reach actor messages and internals by path; it is not part of the supported API.

// Each layer is declared twice, public with `internals` and private without, written out
// rather than by a macro: rustfmt does not format the files of modules declared inside a
// macro, so `cargo fmt --check` skipped nearly the whole crate. What only this crate's tests,
// benches and examples use is compiled for them alone (`#[cfg(any(test, feature =
// "internals"))]` where it is declared), so the compiler still reports dead code.
#[cfg(feature = "internals")]
pub mod backoff;
#[cfg(not(feature = "internals"))]
mod backoff;
pub mod cli;
#[cfg(feature = "internals")]
pub mod http;
#[cfg(not(feature = "internals"))]
mod http;
#[cfg(feature = "internals")]
pub mod jobs;
#[cfg(not(feature = "internals"))]
mod jobs;
#[cfg(feature = "internals")]
pub mod replication;
#[cfg(not(feature = "internals"))]
mod replication;
#[cfg(feature = "internals")]
pub mod replicator;
#[cfg(not(feature = "internals"))]
mod replicator;
#[cfg(feature = "internals")]
pub mod steps;
#[cfg(not(feature = "internals"))]
mod steps;
#[cfg(feature = "internals")]
pub mod store;
#[cfg(not(feature = "internals"))]
mod store;
#[cfg(feature = "internals")]
pub mod telemetry;
#[cfg(not(feature = "internals"))]
mod telemetry;

// The embedding API: the replicator and its handle, job specs and views, events, settings and
// node types, errors, and the store contract with its engines.
pub use jobs::config::ConfigError as JobsConfigError;
pub use jobs::{Clock, JobsConfig, JobsError, JobsOptions, SharedClock, SystemClock};
pub use replication::http::auth::AuthPolicy;
pub use replication::http::tls::TlsOptions;
pub use replication::pipeline::stats::Counters;
pub use replication::{
    Endpoint, ErrorClass, Filter, ReasonTag, RepId, ReplicationError, ReplicationOptions,
    ReplicationStats,
};
pub use replicator::handle::failure as job_failure;
pub use replicator::{
    ClusterStatus, DbProgress, EventReceiver, HistoryEvent, HistoryKind, JobError, JobId, JobKind,
    JobRef, JobView, NewJob, NodeName, NodeType, RepState, Replicator, ReplicatorConfig,
    ReplicatorError, ReplicatorEvent, ReplicatorResult, ReplicatorSettings, ServerJobId,
    ServerJobView, ServerSpec, ServerState, SettingsError, WaitFor,
};
pub use store::embedded::EmbeddedStore;
pub use store::etcd::{EtcdConfig, EtcdStats, EtcdStore};
#[cfg(feature = "fdb")]
pub use store::fdb::FdbStore;
pub use store::memory::MemoryStore;
pub use store::{
    CommitStamp, Db, EngineCounter, KeyValue, RangeOptions, RetryPolicy, RetryableError, Store,
    StoreError, Transaction, Tx, Watch,
};
pub use telemetry::StoreStats;
