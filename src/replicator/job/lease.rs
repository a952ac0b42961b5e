//! A running job's lease: how long this node may go on running the replication without
//! another node possibly taking it over (issue 25's "never twice").
//!
//! Another node's activity monitor re-enqueues a job at the earliest one activity timeout
//! after the job's last `update` committed (`jobs/activity_monitor.rs`). The node cannot
//! know when that commit happened, only that it happened after the transaction began; so each
//! successful `update` renews the lease from the instant its transaction began, and the
//! replication is aborted (no final checkpoint, no write anywhere) once the lease is older
//! than the timeout minus a margin. A node cut off from the store, or a store without
//! quorum, therefore stops its replications before any other node can start them. The
//! watchdog runs beside the job actor, so an actor blocked in a store call still stops in
//! time.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The part of the activity timeout kept as a margin: the lease lasts `timeout - margin`.
const MARGIN_DIVISOR: u32 = 5;
/// The margin at least (clock rates, scheduling delays of the watchdog and the abort).
const MIN_MARGIN: Duration = Duration::from_millis(500);
/// How long [`Lease::hold`] vouches for: longer than any stop.
const HELD: Duration = Duration::from_secs(86_400);

/// When the job's lock was last known held, and how long that vouches for.
#[derive(Debug)]
pub(crate) struct Lease {
    renewed: Mutex<Instant>,
    ttl: Duration,
    renewals: Notify,
}

impl Lease {
    /// A lease for a job type with this activity timeout, renewed now.
    pub(crate) fn new(activity_timeout: Duration) -> Self {
        Self {
            renewed: Mutex::new(Instant::now()),
            ttl: lease_ttl(activity_timeout),
            renewals: Notify::new(),
        }
    }

    fn renewed(&self) -> Instant {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A transaction that began at `began` proved the lock held (it committed an update).
    pub(crate) fn renew(&self, began: Instant) {
        let mut renewed = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        if began > *renewed {
            *renewed = began;
        }
        drop(renewed);
        self.renewals.notify_waiters();
    }

    /// Nothing can take the lock away any more: a node that left the membership is no
    /// neighbour's to remove, so its node lease stops running out (its jobs finish their
    /// final checkpoints however long the stop takes; they were aborted once the heartbeats
    /// had stopped for a lease, and left to the activity monitor for a minute).
    pub(crate) fn hold(&self) {
        let mut renewed = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        *renewed = Instant::now() + HELD;
        drop(renewed);
        self.renewals.notify_waiters();
    }

    /// How long ago the lock was last proven held.
    pub(crate) fn age(&self) -> Duration {
        self.renewed().elapsed()
    }

    /// How long the lease still lasts without a renewal (zero once it ran out).
    pub(crate) fn remaining(&self) -> Duration {
        (self.renewed() + self.ttl).saturating_duration_since(Instant::now())
    }

    /// Resolves once the lease has run out without a renewal.
    pub(crate) async fn expired(&self) {
        loop {
            let deadline = self.renewed() + self.ttl;
            if Instant::now() >= deadline {
                return;
            }
            let renewed = self.renewals.notified();
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = renewed => {}
            }
        }
    }
}

/// How long a lease lasts for an activity timeout: the timeout less a fifth (at least
/// [`MIN_MARGIN`]).
pub(crate) fn lease_ttl(activity_timeout: Duration) -> Duration {
    let margin = (activity_timeout / MARGIN_DIVISOR).max(MIN_MARGIN);
    activity_timeout.saturating_sub(margin)
}

/// How old the lease may get before an idle job writes a keep-alive anyway: a third of the
/// timeout, so that a keep-alive has the rest of the lease to commit.
pub(crate) fn keepalive_after(activity_timeout: Duration) -> Duration {
    activity_timeout / 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_runs_out_unless_renewed() {
        let lease = Lease::new(Duration::from_secs(10));
        assert_eq!(lease.ttl, Duration::from_secs(8));
        tokio::time::sleep(Duration::from_secs(5)).await;
        lease.renew(Instant::now());
        let t0 = Instant::now();
        lease.expired().await;
        assert_eq!(t0.elapsed(), Duration::from_secs(8));
        assert_eq!(
            lease_ttl(Duration::from_secs(1)),
            Duration::from_millis(500)
        );
    }
}
