//! A fixed-bucket latency histogram with lock-free updates (store commit latency): bucket
//! bounds in seconds chosen for an embedded store (sub-millisecond to seconds).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::exposition::Exposition;

/// Upper bounds of the buckets, in seconds.
pub const BOUNDS: [f64; 10] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

/// Counts of observations per bucket, their sum and count.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BOUNDS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// Writes the family `name` (cumulative buckets, `+Inf`, `_sum`, `_count`).
    pub fn render(&self, e: &mut Exposition, name: &str, help: &str) {
        e.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (b, n) in BOUNDS.iter().zip(&self.buckets) {
            cumulative += n.load(Relaxed);
            e.sample(&bucket, &[("le", &b.to_string())], cumulative as f64);
        }
        e.sample(&bucket, &[("le", "+Inf")], self.count() as f64);
        let sum = self.sum_micros.load(Relaxed) as f64 / 1e6;
        e.sample(&format!("{name}_sum"), &[], sum);
        e.sample(&format!("{name}_count"), &[], self.count() as f64);
    }
}
