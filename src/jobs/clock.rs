//! Wall-clock time for couch_jobs, injectable so tests can move time.
//!
//! Scheduled times (`STime`) and type timeouts are UNIX seconds, as in CouchDB. [`SystemClock`]
//! reads the OS clock; [`CorrectedClock`] is another clock moved by an offset (a cluster's
//! consensus). Two more exist only for the crate's tests (`test` or feature `internals`):
//! `TokioClock` advances with tokio's clock (so paused-time tests see `sleep`/`advance` move
//! the wall clock too), and `ManualClock` only moves when told to.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of UNIX time.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds since the UNIX epoch.
    fn now_ms(&self) -> i64;

    /// Seconds since the UNIX epoch.
    fn now_secs(&self) -> i64 {
        self.now_ms().div_euclid(1000)
    }
}

/// Shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

fn system_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        system_ms()
    }
}

/// UNIX time that starts at the system time of creation and then follows tokio's clock, so
/// `tokio::time::pause`/`advance` move it.
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Clone)]
pub struct TokioClock {
    base_ms: i64,
    start: tokio::time::Instant,
}

#[cfg(any(test, feature = "internals"))]
impl TokioClock {
    /// Must be called inside a tokio runtime when time is paused, so the start instant is
    /// taken from the paused clock.
    pub fn new() -> Self {
        Self {
            base_ms: system_ms(),
            start: tokio::time::Instant::now(),
        }
    }
}

#[cfg(any(test, feature = "internals"))]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(any(test, feature = "internals"))]
impl Clock for TokioClock {
    fn now_ms(&self) -> i64 {
        self.base_ms + self.start.elapsed().as_millis() as i64
    }
}

/// A clock that only moves when [`ManualClock::advance_ms`] or [`ManualClock::set_ms`] is called.
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Default)]
pub struct ManualClock {
    ms: AtomicI64,
}

#[cfg(any(test, feature = "internals"))]
impl ManualClock {
    /// A clock stopped at `start_ms` (milliseconds since the UNIX epoch).
    pub fn new(start_ms: i64) -> Self {
        Self {
            ms: AtomicI64::new(start_ms),
        }
    }

    /// Moves the clock to `ms` (it may go backwards).
    pub fn set_ms(&self, ms: i64) {
        self.ms.store(ms, Ordering::SeqCst);
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: i64) {
        self.ms.fetch_add(ms, Ordering::SeqCst);
    }
}

#[cfg(any(test, feature = "internals"))]
impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.ms.load(Ordering::SeqCst)
    }
}

/// Another clock moved by a settable offset: on a cluster, this machine's clock moved to the
/// members' consensus (`replicator/cluster/sightings.rs` sets the offset), so that a time
/// scheduled by one node means the same instant to every other.
#[derive(Debug)]
pub struct CorrectedClock {
    base: SharedClock,
    offset_ms: AtomicI64,
}

impl CorrectedClock {
    /// `base`, not yet moved.
    pub fn new(base: SharedClock) -> Self {
        Self {
            base,
            offset_ms: AtomicI64::new(0),
        }
    }

    /// The base clock's time, without the offset.
    pub fn base_ms(&self) -> i64 {
        self.base.now_ms()
    }

    /// The offset now added to the base clock.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Moves the clock `offset_ms` away from its base.
    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::Relaxed);
    }
}

impl Clock for CorrectedClock {
    fn now_ms(&self) -> i64 {
        self.base.now_ms() + self.offset_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(10_500);
        assert_eq!(c.now_secs(), 10);
        c.advance_ms(600);
        assert_eq!(c.now_secs(), 11);
        c.set_ms(-1);
        assert_eq!(c.now_secs(), -1);
    }

    #[test]
    fn a_corrected_clock_is_its_base_moved_by_the_offset() {
        let base = Arc::new(ManualClock::new(50_000));
        let c = CorrectedClock::new(base.clone());
        assert_eq!(c.now_ms(), 50_000);
        c.set_offset_ms(-90_000);
        assert_eq!((c.now_ms(), c.base_ms()), (-40_000, 50_000));
        base.advance_ms(1);
        assert_eq!(c.now_ms(), -39_999);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let c = TokioClock::new();
        let t0 = c.now_ms();
        tokio::time::advance(std::time::Duration::from_secs(7)).await;
        assert_eq!(c.now_ms() - t0, 7000);
    }
}
