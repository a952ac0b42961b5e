//! The 429 rate limiter: every request asks a [`RateLimiter`] how long to wait first and
//! reports success or 429 back. [`Aimd`] ([`aimd`]) is the one implementation, CouchDB's AIMD
//! algorithm on a shared table; a node shares one among all its jobs (the `rate_limiter`
//! actor, `replicator/node/rate_limiter_actor.rs`), a standalone replication gets its own.
//! The pipeline's work in flight, sized from the same kind of signals, is
//! `pipeline/in_flight.rs`.

pub(crate) mod aimd;

use std::time::Duration;

pub use aimd::{Aimd, MAX_INTERVAL_MS, RateInterval, RateKey};

/// Node-wide 429 back-off shared by all replications hitting the same endpoint.
pub trait RateLimiter: Send + Sync {
    /// How long to wait before sending a request for this key.
    fn interval(&self, key: &RateKey) -> Duration;
    /// A 429 was received; returns the new interval.
    fn failure(&self, key: &RateKey) -> Duration;
    /// A non-429 response was received.
    fn success(&self, key: &RateKey);
    /// The ceiling: a request that would wait this long fails with `max_backoff`
    /// (CouchDB: 25 s).
    fn max_interval(&self) -> Duration {
        Duration::from_millis(MAX_INTERVAL_MS)
    }
}
