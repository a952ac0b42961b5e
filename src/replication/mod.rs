//! The CouchDB replication protocol over HTTP, without actors or jobs (docs/architecture.md,
//! "The life of a replication", CouchDB's replication protocol modules). One folder per
//! concept:
//!
//! - [`endpoint`]: a database endpoint and a whole server.
//! - [`http`]: the HTTP client, transports, TLS, authentication and coalesced reads.
//! - [`changes`]: the changes reader and the shared change watches.
//! - [`id`]: the replication id.
//! - [`options`]: options and the specification of one replication.
//! - [`pipeline`]: start-up, the pipeline, its workers, its work in flight, checkpoints and
//!   stats.
//! - `rate_limiter`: the 429 rate limiter (AIMD).
//! - [`verify`]: verifying a target against its source.
//!
//! Entry points: [`replicate`] (one-shot) and [`start`] (a handle with stats, progress stream
//! and checkpoint-then-stop, for continuous replications and job actors).

pub mod changes;
pub mod endpoint;
pub(crate) mod error;
pub mod http;
pub mod id;
pub mod options;
pub mod pipeline;
pub(crate) mod rate_limiter;
pub mod verify;

pub use endpoint::database::Endpoint;
pub use error::{ErrorClass, ReasonTag, ReplicationError};
#[cfg(any(test, feature = "internals"))]
pub use http::transport::Transports;
pub use id::rep_id::RepId;
pub use options::spec::{Filter, ReplicationOptions, ReplicationSpec};
#[cfg(any(test, feature = "internals"))]
pub use pipeline::run::replicate;
pub use pipeline::run::{Context, ReplicationHandle, compute_id, start};
pub use pipeline::stats::ReplicationStats;
pub use rate_limiter::{Aimd, RateLimiter};
#[cfg(any(test, feature = "internals"))]
pub use {
    pipeline::in_flight::InFlightStats,
    rate_limiter::{RateInterval, RateKey},
};
