//! Counters of the store writes the steps job type makes, by kind, so the cost per step can
//! be compared with the thesis' document revisions. Every counter counts committed write
//! transactions (a transaction retried after a conflict counts once).

use std::sync::atomic::{AtomicU64, Ordering};

/// Write counters, shared by the API and every worker of a node (or of several nodes).
#[derive(Debug, Default)]
pub struct WriteStats {
    submits: AtomicU64,
    accepts: AtomicU64,
    keepalives: AtomicU64,
    finishes: AtomicU64,
    dropped: AtomicU64,
    queue_setups: AtomicU64,
    halts: AtomicU64,
}

/// A copy of the counters at one moment.
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Jobs created (one write each).
    pub submits: u64,
    /// Steps accepted (accept + "running" in one write).
    pub accepts: u64,
    /// `update` calls of running steps.
    pub keepalives: u64,
    /// Steps finished (finish + next step enqueued in one write).
    pub finishes: u64,
    /// Stale queue entries dropped.
    pub dropped: u64,
    /// Queue types given their activity timeout.
    pub queue_setups: u64,
    /// Finishes refused because the step lock was lost (no write).
    pub halts: u64,
}

#[cfg(any(test, feature = "internals"))]
impl WriteCounts {
    /// Every committed write transaction.
    pub fn total_writes(&self) -> u64 {
        self.submits
            + self.accepts
            + self.keepalives
            + self.finishes
            + self.dropped
            + self.queue_setups
    }

    /// Committed writes per finished step (0 when none finished).
    pub fn writes_per_step(&self) -> f64 {
        if self.finishes == 0 {
            0.0
        } else {
            self.total_writes() as f64 / self.finishes as f64
        }
    }
}

impl WriteStats {
    pub(crate) fn submit(&self) {
        self.submits.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn accept(&self) {
        self.accepts.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn keepalive(&self) {
        self.keepalives.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn finish(&self) {
        self.finishes.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn queue_setup(&self) {
        self.queue_setups.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn halt(&self) {
        self.halts.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters as they are now (each read on its own, so not one consistent instant).
    #[cfg(any(test, feature = "internals"))]
    pub fn snapshot(&self) -> WriteCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WriteCounts {
            submits: g(&self.submits),
            accepts: g(&self.accepts),
            keepalives: g(&self.keepalives),
            finishes: g(&self.finishes),
            dropped: g(&self.dropped),
            queue_setups: g(&self.queue_setups),
            halts: g(&self.halts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_per_step_counts_every_write_kind() {
        let s = WriteStats::default();
        assert_eq!(s.snapshot().writes_per_step(), 0.0);
        s.submit();
        for _ in 0..3 {
            s.accept();
            s.finish();
        }
        s.keepalive();
        s.halt();
        let c = s.snapshot();
        assert_eq!(c.total_writes(), 8);
        assert!((c.writes_per_step() - 8.0 / 3.0).abs() < 1e-9);
    }
}
