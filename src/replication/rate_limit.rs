//! The 429 hook: every request asks a [`RateLimiter`] how long to wait first and reports
//! success or 429 back. The actor tree plugs in its node-wide AIMD limiter (CouchDB's couch_replicator_rate_limiter.erl);
//! [`Aimd`] is a self-contained default with the same constants for standalone use.
//! [`Window`] sizes the pipeline's work in flight from the same kind of signals.

mod window;
pub use window::{Load, Window, WindowLimits, WindowStats};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Base interval after a first 429.
pub const BASE_INTERVAL_MS: u64 = 20;
/// Interval at which requests fail with `max_backoff`.
pub const MAX_INTERVAL_MS: u64 = 25_000;
const FACTOR: f64 = 1.2;
const SENSITIVITY_MS: u64 = 80;
const DECAY_THRESHOLD_MS: u64 = 1000;

/// Key of a limiter entry: database URL (no credentials) and HTTP method.
pub type RateKey = (String, String);

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

/// Default AIMD limiter (CouchDB's couch_replicator_rate_limiter.erl): multiplicative increase on 429, additive decrease on success,
/// updates within 80 ms of the previous one ignored, idle decay after 1 s.
#[derive(Debug, Default)]
pub struct Aimd {
    table: Mutex<HashMap<RateKey, (u64, Instant)>>,
}

impl Aimd {
    /// An empty limiter.
    pub fn new() -> Self {
        Self::default()
    }
}

impl RateLimiter for Aimd {
    fn interval(&self, key: &RateKey) -> Duration {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        Duration::from_millis(t.get(key).map_or(0, |(i, _)| *i))
    }

    fn failure(&self, key: &RateKey) -> Duration {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let entry = t.entry(key.clone()).or_insert((0, now));
        if now.duration_since(entry.1) >= Duration::from_millis(SENSITIVITY_MS) || entry.0 == 0 {
            let next = ((entry.0.max(BASE_INTERVAL_MS) as f64) * FACTOR).round() as u64;
            *entry = (next.min(MAX_INTERVAL_MS), now);
        }
        Duration::from_millis(entry.0)
    }

    fn success(&self, key: &RateKey) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let Some((old, at)) = t.get(key).copied() else {
            return;
        };
        let dt = now.duration_since(at).as_millis() as u64;
        if dt < SENSITIVITY_MS {
            return;
        }
        let mut v = old;
        if dt > DECAY_THRESHOLD_MS {
            v = v.saturating_sub(2 * dt);
        }
        let step = match v {
            v if v > 10_000 => 1000,
            v if v > 1000 => 100,
            v if v > 100 => 40,
            _ => 20,
        };
        match v.saturating_sub(step) {
            0 => {
                t.remove(key);
            }
            n => {
                t.insert(key.clone(), (n.max(BASE_INTERVAL_MS), now));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increases_on_429_and_recovers() {
        let l = Aimd::new();
        let k = ("http://h/db".to_owned(), "GET".to_owned());
        assert_eq!(l.interval(&k), Duration::ZERO);
        assert_eq!(l.failure(&k), Duration::from_millis(24));
        // Within the sensitivity window the second 429 is ignored.
        assert_eq!(l.failure(&k), Duration::from_millis(24));
        l.success(&k); // also within the window: ignored
        assert_eq!(l.interval(&k), Duration::from_millis(24));
        l.table.lock().unwrap().get_mut(&k).unwrap().1 -= Duration::from_millis(100);
        l.success(&k);
        // 24 - 20 = 4, kept at the 20 ms floor (CouchDB's couch_replicator_rate_limiter.erl).
        assert_eq!(l.interval(&k), Duration::from_millis(20));
    }
}
