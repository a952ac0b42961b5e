//! [`Aimd`], the one [`RateLimiter`]: CouchDB's AIMD algorithm (CouchDB 3.x constants,
//! CouchDB's couch_replicator_rate_limiter.erl) on an [`AimdTable`] shared by clones.
//!
//! [`AimdTable`] owns, per `(endpoint, method)` key, the current wait interval in milliseconds
//! and when it was last updated. Pure arithmetic on caller-supplied millisecond timestamps, so
//! it is tested step by step without clocks; [`Aimd`] puts tokio's clock and a lock around it
//! (the node's `rate_limiter` actor owns one and runs its periodic cleanup). Multiplicative
//! increase on failure (429), additive decrease on success, optimistic decay after idle
//! periods, and an 80 ms window that ignores too-frequent updates (a crude low-pass filter).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::RateLimiter;

/// The additive step and the floor of a non-empty interval.
pub(crate) const BASE_INTERVAL_MS: u64 = 20;
/// Multiplicative increase on a 429.
pub(crate) const BACKOFF_FACTOR: f64 = 1.2;
/// The ceiling; a request that would wait this long fails the job with `max_backoff`.
pub const MAX_INTERVAL_MS: u64 = 25_000;
/// Idle time after which the interval decays before the success step.
pub(crate) const TIME_DECAY_THRESHOLD_MS: u64 = 1_000;
/// Milliseconds of interval removed per idle millisecond.
pub(crate) const TIME_DECAY_FACTOR: u64 = 2;
/// Updates closer than this to the previous one are ignored.
pub(crate) const SENSITIVITY_WINDOW_MS: u64 = 80;

/// What a rate is kept for: the database URL without credentials, and the HTTP method.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateKey {
    /// The database URL, credentials removed.
    pub endpoint: String,
    /// The HTTP method (`GET`, `POST`, ...).
    pub method: String,
}

impl RateKey {
    /// The key of requests with `method` to `endpoint` (pass the URL without credentials).
    pub fn new(endpoint: impl Into<String>, method: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            method: method.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    interval_ms: u64,
    updated_ms: u64,
}

/// Per-key AIMD intervals. A key with no entry waits 0 ms.
#[derive(Debug, Default, Clone)]
pub struct AimdTable {
    entries: HashMap<RateKey, Entry>,
}

impl AimdTable {
    /// The current wait before a request to `key`.
    #[cfg(any(test, feature = "internals"))]
    pub fn interval(&self, key: &RateKey) -> u64 {
        self.entries.get(key).map_or(0, |e| e.interval_ms)
    }

    /// The wait before a request to `key` at `now_ms`, forgetting the entry first when it
    /// was not updated for `stale_after_ms` (what the periodic cleanup would do at its next
    /// run): a job restarting after a `max_backoff` crash must not meet the ceiling it left
    /// behind just because the cleanup has not run yet.
    pub(crate) fn interval_at(&mut self, key: &RateKey, now_ms: u64, stale_after_ms: u64) -> u64 {
        match self.entries.get(key) {
            Some(e) if now_ms.saturating_sub(e.updated_ms) > stale_after_ms => {
                self.entries.remove(key);
                0
            }
            Some(e) => e.interval_ms,
            None => 0,
        }
    }

    /// Records a 429 from `key` at `now_ms`; returns the new interval.
    pub fn failure(&mut self, key: &RateKey, now_ms: u64) -> u64 {
        let (interval, updated) = self.current(key);
        if updated != 0 && now_ms.saturating_sub(updated) <= SENSITIVITY_WINDOW_MS {
            return interval;
        }
        let grown = (interval.max(BASE_INTERVAL_MS) as f64 * BACKOFF_FACTOR).round() as u64;
        self.insert(key, grown.min(MAX_INTERVAL_MS), now_ms)
    }

    /// Records a non-429 response from `key` at `now_ms`; returns the new interval.
    pub fn success(&mut self, key: &RateKey, now_ms: u64) -> u64 {
        let Some(entry) = self.entries.get(key).copied() else {
            // Keys that never saw a 429 stay out of the table.
            return 0;
        };
        let dt = now_ms.saturating_sub(entry.updated_ms);
        if dt <= SENSITIVITY_WINDOW_MS {
            return entry.interval_ms;
        }
        let decayed = if dt > TIME_DECAY_THRESHOLD_MS {
            entry
                .interval_ms
                .saturating_sub(TIME_DECAY_FACTOR.saturating_mul(dt))
        } else {
            entry.interval_ms
        };
        let next = decayed.saturating_sub(additive_step(decayed));
        if next == 0 {
            self.entries.remove(key);
            0
        } else {
            self.insert(key, next.max(BASE_INTERVAL_MS), now_ms)
        }
    }

    /// Drops entries not updated since `now_ms - MAX_INTERVAL_MS` (run every 2 x max).
    pub fn cleanup(&mut self, now_ms: u64) -> usize {
        let limit = now_ms.saturating_sub(MAX_INTERVAL_MS);
        let before = self.entries.len();
        self.entries.retain(|_, e| e.updated_ms >= limit);
        before - self.entries.len()
    }

    /// Every key with an interval, and that interval in ms.
    pub fn intervals(&self) -> impl Iterator<Item = (&RateKey, u64)> {
        self.entries.iter().map(|(k, e)| (k, e.interval_ms))
    }

    /// How many keys have a non-zero interval.
    #[cfg(any(test, feature = "internals"))]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn current(&self, key: &RateKey) -> (u64, u64) {
        self.entries
            .get(key)
            .map_or((0, 0), |e| (e.interval_ms, e.updated_ms))
    }

    fn insert(&mut self, key: &RateKey, interval_ms: u64, now_ms: u64) -> u64 {
        self.entries.insert(
            key.clone(),
            Entry {
                interval_ms,
                updated_ms: now_ms,
            },
        );
        interval_ms
    }
}

/// Larger intervals recover in larger steps, so a limiter near the ceiling is pushed back
/// before it reaches `max_backoff` (which costs a whole job restart).
fn additive_step(interval: u64) -> u64 {
    match interval {
        i if i > 10_000 => BASE_INTERVAL_MS * 50,
        i if i > 1_000 => BASE_INTERVAL_MS * 5,
        i if i > 100 => BASE_INTERVAL_MS * 2,
        _ => BASE_INTERVAL_MS,
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

    fn key() -> RateKey {
        RateKey::new("http://127.0.0.1:5984/db/", "POST")
    }

    #[test]
    fn an_entry_idle_past_the_staleness_bound_reads_as_zero_and_is_forgotten() {
        let mut t = AimdTable::default();
        let k = key();
        let i = t.failure(&k, 1_000);
        assert_eq!(t.interval_at(&k, 1_300, 300), i); // exactly at the bound: kept
        assert_eq!(t.interval_at(&k, 1_301, 300), 0);
        assert_eq!(t.len(), 0);
        assert_eq!(t.interval_at(&k, 1_302, 300), 0);
    }

    #[test]
    fn failures_grow_by_1_2_from_the_base_and_respect_the_window() {
        let mut t = AimdTable::default();
        let k = key();
        assert_eq!(t.failure(&k, 1_000), 24); // max(0, 20) * 1.2
        assert_eq!(t.failure(&k, 1_050), 24); // inside the 80 ms window: ignored
        assert_eq!(t.failure(&k, 1_080), 24); // exactly at the window edge: still ignored
        assert_eq!(t.failure(&k, 1_081), 29); // round(24 * 1.2 = 28.8)
        assert_eq!(t.failure(&k, 1_200), 35); // round(34.8)
        assert_eq!(t.interval(&k), 35);
    }

    #[test]
    fn failures_are_capped_at_the_maximum() {
        let mut t = AimdTable::default();
        let k = key();
        let mut now = 0;
        let mut last = 0;
        for _ in 0..100 {
            now += 100;
            last = t.failure(&k, now);
        }
        assert_eq!(last, MAX_INTERVAL_MS);
    }

    #[test]
    fn success_steps_down_additively_by_band() {
        let mut t = AimdTable::default();
        let k = key();
        assert_eq!(t.success(&k, 500), 0, "no entry stays empty");
        assert_eq!(t.len(), 0);
        t.insert(&k, 12_000, 0);
        assert_eq!(t.success(&k, 500), 11_000); // > 10 000: step 1000
        t.insert(&k, 5_000, 0);
        assert_eq!(t.success(&k, 500), 4_900); // > 1000: step 100
        t.insert(&k, 500, 0);
        assert_eq!(t.success(&k, 500), 460); // > 100: step 40
        t.insert(&k, 100, 0);
        assert_eq!(t.success(&k, 500), 80); // step 20
        t.insert(&k, 30, 0);
        assert_eq!(t.success(&k, 500), BASE_INTERVAL_MS); // 10 is floored to the base
        assert_eq!(t.success(&k, 1_000), 0); // 20 - 20 = 0: entry removed
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn idle_time_decays_the_interval_before_the_step() {
        let mut t = AimdTable::default();
        let k = key();
        t.insert(&k, 10_000, 0);
        // dt = 2000 > 1000: 10 000 - 2 * 2000 = 6000, then the >1000 band step of 100.
        assert_eq!(t.success(&k, 2_000), 5_900);
        // dt = 1000 is not above the threshold: no decay, step 100.
        assert_eq!(t.success(&k, 3_000), 5_800);
        // A long idle period decays everything away.
        assert_eq!(t.success(&k, 60_000), 0);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn success_inside_the_window_is_ignored() {
        let mut t = AimdTable::default();
        let k = key();
        t.insert(&k, 400, 1_000);
        assert_eq!(t.success(&k, 1_080), 400);
        assert_eq!(t.success(&k, 1_081), 360);
    }

    #[test]
    fn keys_are_independent_and_cleanup_drops_stale_entries() {
        let mut t = AimdTable::default();
        let a = key();
        let b = RateKey::new("http://127.0.0.1:5984/db/", "GET");
        t.failure(&a, 1_000);
        t.failure(&b, 30_000);
        assert_eq!(t.interval(&a), 24);
        assert_eq!(t.interval(&b), 24);
        assert_eq!(t.cleanup(30_000), 1);
        assert_eq!(t.interval(&a), 0);
        assert_eq!(t.interval(&b), 24);
    }

    #[test]
    fn a_429_storm_converges_back_to_zero_when_it_ends() {
        let mut t = AimdTable::default();
        let k = key();
        let mut now = 0;
        for _ in 0..30 {
            now += 100;
            t.failure(&k, now);
        }
        let peak = t.interval(&k);
        assert!(peak > 1_000 && peak < MAX_INTERVAL_MS, "peak {peak}");
        let mut steps = 0;
        while t.interval(&k) > 0 {
            now += 100;
            t.success(&k, now);
            steps += 1;
            assert!(steps < 1_000, "did not converge");
        }
    }

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
