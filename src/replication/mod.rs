//! The CouchDB replication protocol over HTTP, without actors or jobs (docs/architecture.md, "The life of a replication",
//! CouchDB's replication protocol modules): endpoints and their HTTP client, the changes reader, `_revs_diff`, fetching,
//! writing, checkpoints, the replication id, options, stats, and the pipeline that runs a
//! replication. Entry points: [`replicate`] (one-shot) and [`start`] (a handle with stats,
//! progress stream and checkpoint-then-stop, for continuous replications and job actors).

mod aimd;
pub mod auth;
pub(crate) mod bulk_related;
pub mod changes;
pub(crate) mod checkpoint;
pub mod client;
pub mod coalesce;
mod context;
pub mod db_watch;
pub mod endpoint;
pub mod error;
pub(crate) mod etf;
pub(crate) mod feed_line;
pub(crate) mod fetch;
pub(crate) mod id_endpoint;
pub(crate) mod normal_feed;
pub mod option_values;
pub(crate) mod options;
pub(crate) mod pipeline;
pub(crate) mod rate_limit;
pub mod rep_id;
pub mod response;
pub(crate) mod revs_diff;
pub(crate) mod selector;
pub mod server;
pub mod session_cache;
mod start_up;
pub mod stats;
pub mod tls;
pub mod transport;
pub mod verify;
pub(crate) mod watch_feed;
mod worker;
pub mod write;

pub use endpoint::Endpoint;
pub use error::{ErrorClass, ReplicationError};
pub use options::{Filter, ReplicationOptions, ReplicationSpec};
pub use pipeline::{
    Context, DEFAULT_IN_FLIGHT_BYTES, ReplicationHandle, compute_id, replicate, start,
};
pub use rate_limit::{Aimd, RateInterval, RateKey, RateLimiter, WindowLimits, WindowStats};
pub use rep_id::RepId;
pub use stats::ReplicationStats;
