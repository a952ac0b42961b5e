//! The node's budget of response bytes held in memory ([`ResponseBudget`]), shared by every job:
//! the caps of [`super::limits`] bound one response, this bounds them all together, so ten
//! thousand jobs whose endpoints all answer near the cap cannot add up.
//!
//! The first [`UNBUDGETED_BYTES`] of each body are free (most answers are smaller, and take
//! no lock). Past them a body reserves what its buffer will occupy before the buffer grows
//! (`super::body` doubles it); a body that cannot grow stops reading (its bytes stay within
//! the budget) and waits, first come first served. Bodies that hold budget and wait for more could wait on one another for
//! ever: so a body waits at most `connection_timeout`, then fails its request as a transport
//! failure (retried like one) and gives its share to the others.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::telemetry::NodeMetrics;

/// Bytes of each body read without budget.
pub const UNBUDGETED_BYTES: u64 = 256 << 10;

/// [`ResponseBudget`]'s size by default: 24 MiB, one and a half responses at the default
/// `max_response_bytes`, and several hundred `_bulk_get` answers of small documents.
pub const DEFAULT_RESPONSE_BUDGET_BYTES: u64 = 24 << 20;

/// How often a body waiting for budget checks whether it must give way.
const RECHECK: Duration = Duration::from_millis(100);

/// Permits are KiB: a `u32` count then covers 4 TiB.
const UNIT: u64 = 1024;

/// The node's budget of response bytes held in memory.
#[derive(Debug)]
pub struct ResponseBudget {
    permits: Arc<Semaphore>,
    total_units: u32,
    /// Units held by bodies that are waiting for more.
    held_by_waiters: AtomicU32,
    metrics: Arc<NodeMetrics>,
}

impl ResponseBudget {
    /// A budget of `bytes` (at least 1 MiB), reported to `metrics`.
    pub fn new(bytes: u64, metrics: Arc<NodeMetrics>) -> Self {
        let units = (bytes.max(1 << 20) / UNIT).min(u64::from(u32::MAX >> 4)) as u32;
        Self {
            permits: Arc::new(Semaphore::new(units as usize)),
            total_units: units,
            held_by_waiters: AtomicU32::new(0),
            metrics,
        }
    }

    /// The budget's size in bytes.
    pub fn total_bytes(&self) -> u64 {
        u64::from(self.total_units) * UNIT
    }

    /// A body's share, empty until it passes the free bytes.
    pub(crate) fn share(self: &Arc<Self>) -> Share {
        Share {
            budget: self.clone(),
            held: None,
            units: 0,
        }
    }

    /// Whether a body holding `holding` units and waiting for `more` can only be served by
    /// other waiting bodies giving theirs back.
    fn stuck(&self, holding: u32, more: u32) -> bool {
        let available = self.permits.available_permits() as u32;
        let busy = self.total_units.saturating_sub(available);
        // `held_by_waiters` counts this body's own units too.
        let waiting = self.held_by_waiters.load(Relaxed).max(holding);
        let others_done = busy.saturating_sub(waiting);
        available.saturating_add(others_done) < more
    }

    fn units_for(&self, bytes: u64) -> u32 {
        (bytes.div_ceil(UNIT)).min(u64::from(self.total_units)) as u32
    }
}

/// What one body holds of the budget (given back on drop). A body kept after reading can
/// keep its share with it ([`super::body::Bounds::keep`]), so that documents waiting to be
/// written count as well as ones being read.
pub(crate) struct Share {
    budget: Arc<ResponseBudget>,
    held: Option<OwnedSemaphorePermit>,
    units: u32,
}

/// The body waited longer than its patience for budget.
#[derive(Debug)]
pub(crate) struct BudgetSpent {
    /// How long it waited.
    pub(crate) waited: Duration,
}

impl Share {
    /// Makes room for a body occupying `len` bytes, waiting up to `patience`; never more
    /// than the whole budget.
    pub(crate) async fn cover(&mut self, len: u64, patience: Duration) -> Result<(), BudgetSpent> {
        let Some(over) = len.checked_sub(UNBUDGETED_BYTES).filter(|o| *o > 0) else {
            return Ok(());
        };
        let more = self.budget.units_for(over).saturating_sub(self.units);
        if more == 0 {
            // The whole budget is this body's already.
            return Ok(());
        }
        if let Ok(p) = self.budget.permits.clone().try_acquire_many_owned(more) {
            self.add(p, more);
            return Ok(());
        }
        self.budget
            .metrics
            .response_budget_waits
            .fetch_add(1, Relaxed);
        let started = tokio::time::Instant::now();
        let b = self.budget.clone();
        // Holding while waiting is safe only while bodies that are not waiting hold enough to
        // let this one through when they finish. When they do not (every body growing at
        // once: sixteen documents of 7.9 MB fetched together waited 30 s, the patience), it
        // gives way: gives back its share and waits for all it needs. Its bytes then stay
        // outside the budget until it is served, but no more arrive. Checked again every
        // [`RECHECK`], as others start waiting.
        let deadline = started + patience;
        let mut more = more;
        let mut holding = self.units;
        b.held_by_waiters.fetch_add(holding, Relaxed);
        let mut acquire = Box::pin(b.permits.clone().acquire_many_owned(more));
        let got = loop {
            let until = deadline.min(tokio::time::Instant::now() + RECHECK);
            match tokio::time::timeout_at(until, &mut acquire).await {
                Ok(got) => break got.ok(),
                Err(_) if tokio::time::Instant::now() >= deadline => break None,
                Err(_) if holding > 0 && b.stuck(holding, more) => {
                    b.held_by_waiters.fetch_sub(holding, Relaxed);
                    more += holding;
                    self.release();
                    holding = 0;
                    acquire = Box::pin(b.permits.clone().acquire_many_owned(more));
                }
                Err(_) => {}
            }
        };
        b.held_by_waiters.fetch_sub(holding, Relaxed);
        match got {
            Some(p) => {
                self.add(p, more);
                Ok(())
            }
            None => {
                self.release();
                Err(BudgetSpent {
                    waited: started.elapsed(),
                })
            }
        }
    }

    /// Whether the share holds any budget.
    pub(crate) fn holds_any(&self) -> bool {
        self.units > 0
    }

    /// Gives back what a body now occupying `len` bytes no longer needs (the buffer it grew
    /// out of).
    pub(crate) fn fit(&mut self, len: u64) {
        let need = self.budget.units_for(len.saturating_sub(UNBUDGETED_BYTES));
        let spare = self.units.saturating_sub(need);
        if spare == 0 {
            return;
        }
        if let Some(extra) = self.held.as_mut().and_then(|h| h.split(spare as usize)) {
            drop(extra);
            self.units -= spare;
            self.budget
                .metrics
                .response_bytes_held
                .fetch_sub(u64::from(spare) * UNIT, Relaxed);
        }
    }

    fn add(&mut self, p: OwnedSemaphorePermit, units: u32) {
        match &mut self.held {
            Some(h) => h.merge(p),
            None => self.held = Some(p),
        }
        self.units += units;
        self.budget
            .metrics
            .response_bytes_held
            .fetch_add(u64::from(units) * UNIT, Relaxed);
    }

    fn release(&mut self) {
        if self.held.take().is_some() {
            self.budget
                .metrics
                .response_bytes_held
                .fetch_sub(u64::from(self.units) * UNIT, Relaxed);
        }
        self.units = 0;
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn small_bodies_take_nothing_and_large_ones_give_it_back() {
        let metrics = Arc::new(NodeMetrics::default());
        let budget = Arc::new(ResponseBudget::new(4 << 20, metrics.clone()));
        let patience = Duration::from_millis(50);
        let held = || metrics.response_bytes_held.load(Relaxed);
        let mut small = budget.share();
        small.cover(UNBUDGETED_BYTES, patience).await.unwrap();
        assert_eq!(held(), 0);
        let mut big = budget.share();
        big.cover(UNBUDGETED_BYTES + 10, patience).await.unwrap();
        assert_eq!(held(), 1024, "whole KiB");
        big.cover(UNBUDGETED_BYTES + (3 << 20), patience)
            .await
            .unwrap();
        assert_eq!(held(), 3 << 20, "exactly what is asked");
        big.fit(UNBUDGETED_BYTES + (1 << 20));
        assert_eq!(held(), 1 << 20);
        drop(big);
        assert_eq!(held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn bodies_growing_together_do_not_wait_on_each_other() {
        let metrics = Arc::new(NodeMetrics::default());
        let budget = Arc::new(ResponseBudget::new(4 << 20, metrics.clone()));
        let patience = Duration::from_secs(30);
        let held = || metrics.response_bytes_held.load(Relaxed);
        let mib = |n: u64| UNBUDGETED_BYTES + (n << 20);
        let started = tokio::time::Instant::now();
        // Two bodies hold 2 MiB each of 4 and both need 3: held while waiting, neither would
        // ever come through. One gives way; each is read in turn.
        let grow = |mut share: Share| async move {
            share.cover(mib(2), patience).await.unwrap();
            tokio::task::yield_now().await;
            share.cover(mib(3), patience).await.unwrap();
            assert!(held() <= 4 << 20);
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        tokio::join!(grow(budget.share()), grow(budget.share()));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_cannot_grow_waits_then_gives_up_its_share() {
        let metrics = Arc::new(NodeMetrics::default());
        let budget = Arc::new(ResponseBudget::new(4 << 20, metrics.clone()));
        let patience = Duration::from_secs(3);
        let held = || metrics.response_bytes_held.load(Relaxed);
        let mib = |n: u64| UNBUDGETED_BYTES + (n << 20);
        let mut a = budget.share();
        a.cover(mib(3), patience).await.unwrap();
        let mut b = budget.share();
        b.cover(mib(1), patience).await.unwrap();
        assert_eq!(held(), 4 << 20);
        // b cannot grow: it keeps its 1 MiB and waits for one more until a is done.
        let grow = b.cover(mib(2), patience);
        let release = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(a);
        };
        let (grown, ()) = tokio::join!(grow, release);
        grown.unwrap();
        assert_eq!(held(), 2 << 20);
        assert_eq!(metrics.response_budget_waits.load(Relaxed), 1);
        // 3 MiB do not come within the patience while b holds 2 of the 4: c gives up.
        let mut c = budget.share();
        c.cover(mib(1), patience).await.unwrap();
        let e = c.cover(mib(3), patience).await.unwrap_err();
        assert!(e.waited >= patience);
        assert_eq!(held(), 2 << 20, "c gave its share back");
        // A body past the whole budget holds the whole budget and no more.
        b.cover(mib(100), patience).await.unwrap();
        assert_eq!(held(), 4 << 20);
    }
}
