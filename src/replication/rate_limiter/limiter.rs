//! The 429 hook: every request asks a [`RateLimiter`] how long to wait first and reports
//! success or 429 back. [`Aimd`] is the one implementation: CouchDB's AIMD algorithm
//! ([`super::aimd`]) on a shared table; a node shares one among all its jobs, a standalone
//! replication gets its own. [`Window`](super::window::Window) sizes the pipeline's work in flight from the same
//! kind of signals.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::aimd::AimdTable;
pub use super::aimd::{MAX_INTERVAL_MS, RateKey};

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

/// Offset so no update ever happens at "time 0" (the table treats 0 as "never updated").
const EPOCH_OFFSET_MS: u64 = 1_000_000;

/// The AIMD limiter: one table behind a lock, on tokio's clock (milliseconds since it was
/// created, so tests step it with paused time). Clones share the table, which is how every
/// job of a node shares one (the node's `rate_limiter` actor hands out clones).
#[derive(Debug, Clone)]
pub struct Aimd {
    table: Arc<Mutex<AimdTable>>,
    epoch: Instant,
    max_interval: Duration,
}

impl Default for Aimd {
    fn default() -> Self {
        Self {
            table: Arc::default(),
            epoch: Instant::now(),
            max_interval: Duration::from_millis(MAX_INTERVAL_MS),
        }
    }
}

impl Aimd {
    /// An empty limiter with CouchDB's 25 s ceiling.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table whose requests fail with `max_backoff` once they would wait `max`
    /// (capped at CouchDB's 25 s, which the table never exceeds).
    pub fn with_max_interval(max: Duration) -> Self {
        Self {
            max_interval: max.min(Duration::from_millis(MAX_INTERVAL_MS)),
            ..Self::default()
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + EPOCH_OFFSET_MS
    }

    fn with<R>(&self, f: impl FnOnce(&mut AimdTable, u64) -> R) -> R {
        let now = self.now_ms();
        // Every operation is a single map update, so a poisoned table is still consistent.
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut t, now)
    }

    /// The current interval of `(endpoint, method)` in ms.
    #[cfg(any(test, feature = "internals"))]
    pub fn interval_ms(&self, endpoint: &str, method: &str) -> u64 {
        self.with(|t, _| t.interval(&RateKey::new(endpoint, method)))
    }

    /// Drops idle entries; returns how many.
    pub fn cleanup(&self) -> usize {
        self.with(|t, now| t.cleanup(now))
    }

    /// How many keys have an interval.
    #[cfg(any(test, feature = "internals"))]
    pub fn len(&self) -> usize {
        self.with(|t, _| t.len())
    }

    /// No key has an interval.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every `(endpoint, method)` with an interval, sorted.
    pub fn intervals(&self) -> Vec<RateInterval> {
        let mut out: Vec<RateInterval> = self.with(|t, _| {
            t.intervals()
                .map(|(k, ms)| RateInterval {
                    endpoint: k.endpoint.clone(),
                    method: k.method.clone(),
                    interval: Duration::from_millis(ms),
                })
                .collect()
        });
        out.sort_by(|a, b| (&a.endpoint, &a.method).cmp(&(&b.endpoint, &b.method)));
        out
    }
}

/// The current wait before requests of one method to one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RateInterval {
    /// The database URL, without credentials.
    pub endpoint: String,
    /// The HTTP method.
    pub method: String,
    /// The wait before each request.
    pub interval: Duration,
}

impl RateLimiter for Aimd {
    fn interval(&self, k: &RateKey) -> Duration {
        let stale = self.max_interval.as_millis() as u64;
        Duration::from_millis(self.with(|t, now| t.interval_at(k, now, stale)))
    }

    fn failure(&self, k: &RateKey) -> Duration {
        Duration::from_millis(self.with(|t, now| t.failure(k, now)))
    }

    fn success(&self, k: &RateKey) {
        self.with(|t, now| t.success(k, now));
    }

    fn max_interval(&self) -> Duration {
        self.max_interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn increases_on_429_and_recovers() {
        let l = Aimd::default();
        let k = RateKey::new("http://h/db", "GET");
        assert_eq!(l.interval(&k), Duration::ZERO);
        assert_eq!(l.failure(&k), Duration::from_millis(24));
        // Within the sensitivity window the second 429 is ignored.
        assert_eq!(l.failure(&k), Duration::from_millis(24));
        l.success(&k); // also within the window: ignored
        assert_eq!(l.interval(&k), Duration::from_millis(24));
        tokio::time::advance(Duration::from_millis(100)).await;
        l.success(&k);
        // 24 - 20 = 4, kept at the 20 ms floor.
        assert_eq!(l.interval(&k), Duration::from_millis(20));
    }
}
