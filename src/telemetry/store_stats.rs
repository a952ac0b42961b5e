//! The store's numbers: commit latency of transactions run through `Db::run`, commits, and
//! retries caused by conflicts or other retryable errors (their rate against commits is the
//! conflict rate an operator watches when many nodes share one store).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::exposition::Exposition;
use super::histogram::Histogram;

/// Shared by every clone of one `Db`.
#[derive(Debug, Default)]
pub struct StoreStats {
    commit_latency: Histogram,
    retries: AtomicU64,
    failures: AtomicU64,
}

impl StoreStats {
    /// A commit succeeded after `d`.
    pub fn committed(&self, d: Duration) {
        self.commit_latency.observe(d);
    }

    /// A transaction is run again after a retryable error (a conflict, mostly).
    pub fn retried(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    /// A transaction ran out of attempts.
    pub fn failed(&self) {
        self.failures.fetch_add(1, Relaxed);
    }

    /// Successful commits so far.
    pub fn commits(&self) -> u64 {
        self.commit_latency.count()
    }

    /// Retries so far.
    pub fn retries(&self) -> u64 {
        self.retries.load(Relaxed)
    }

    /// Writes `couch_replicator_store_*`.
    pub fn render(&self, e: &mut Exposition) {
        self.commit_latency.render(
            e,
            "couch_replicator_store_commit_seconds",
            "time to commit a store transaction",
        );
        e.single(
            "couch_replicator_store_retries_total",
            "counter",
            "store transactions run again after a conflict or another retryable error",
            self.retries() as f64,
        );
        e.single(
            "couch_replicator_store_failures_total",
            "counter",
            "store transactions that ran out of retries",
            self.failures.load(Relaxed) as f64,
        );
    }
}
