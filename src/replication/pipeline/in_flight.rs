//! [`InFlight`], the pipeline's work in flight (an adaptive window): how many batches may be
//! between the changes feed and the target at once, and how many bytes of fetched documents
//! they may hold. Like the 429 rate limiter (`replication/rate_limiter/`), it backs off
//! multiplicatively on trouble, but what it sizes is the work in flight, not a pause. It starts
//! at [`InFlightLimits::initial`] and adapts once per epoch (an epoch ends when a batch taken
//! in it ends, so each one sees the window as it is): it doubles while throughput (documents
//! written per second) grows by a tenth (slow start: a long round trip needs many batches in
//! flight to fill the link) or while work waits for room and batches take about their best
//! time, then grows by one while either still holds; it gives one back when throughput stopped
//! growing and batches take twice their best (they queue at a saturated server), and halves on
//! a 429 or a timeout, 408/5xx or connection failure at either endpoint. A batch is admitted
//! only while the estimated bytes in flight stay under the cap (one batch is always admitted,
//! so a single huge batch still moves). Pure bookkeeping over explicit instants, so it is
//! tested without a clock.

use std::time::Duration;
use tokio::time::Instant;

/// The window's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightLimits {
    /// Batches in flight at the start.
    pub initial: usize,
    /// Never fewer than this.
    pub min: usize,
    /// Never more than this (`http_connections`: each batch holds one request at a time).
    pub max: usize,
    /// Estimated bytes of fetched documents in flight, at most.
    pub max_bytes: u64,
}

/// Document size assumed before anything is known (the source's database info usually
/// gives a better one).
const DEFAULT_DOC_BYTES: u64 = 16 * 1024;

/// Throughput must grow by this factor for the window to grow.
const GROWTH: f64 = 1.10;
/// Throughput not growing while batches take this factor of their best time means the
/// endpoints are saturated.
const SLOW_FACTOR: f64 = 2.0;
/// Batches waiting for room grow the window only while batches take less than this factor
/// of their best (beyond, more in flight only queue at the endpoints).
const QUEUED_FACTOR: f64 = 1.5;
/// An epoch lasts at least this long (very fast loopback batches).
const MIN_EPOCH: Duration = Duration::from_millis(20);

/// What the endpoints and the queue said when a batch ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// The endpoints' running count of 429s, timeouts, 408/5xx and connection failures.
    pub congestion: u64,
    /// Whether work was waiting for room in the window (batches queued behind this one).
    pub backlog: bool,
}

impl Load {
    #[cfg(test)]
    fn congestion(congestion: u64) -> Self {
        Self {
            congestion,
            backlog: false,
        }
    }
}

/// What the window has done so far (for tests, logs and the bench).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlightStats {
    /// The window now.
    pub limit: usize,
    /// The largest window reached.
    pub peak_limit: usize,
    /// Batches in flight at most at once.
    pub peak_in_flight: usize,
    /// Estimated bytes in flight at most at once.
    pub peak_bytes: u64,
    /// Times the window grew.
    pub grows: u64,
    /// Times it shrank (congestion or saturation).
    pub shrinks: u64,
}

/// The window's state.
#[derive(Debug)]
pub struct InFlight {
    limits: InFlightLimits,
    limit: usize,
    slow_start: bool,
    in_flight: usize,
    bytes: u64,
    doc_bytes: f64,
    /// Whether `doc_bytes` comes from a real size (else only one batch is admitted).
    sized: bool,
    epoch_start: Option<Instant>,
    epoch_docs: u64,
    /// Whether batches waited for room in this epoch.
    epoch_backlog: bool,
    last_rate: Option<f64>,
    /// Smoothed and best time of a batch from admission to done.
    latency: Option<Duration>,
    best_latency: Option<Duration>,
    congestion_seen: u64,
    stats: InFlightStats,
}

impl InFlight {
    /// A window within `limits`, assuming documents of `doc_bytes` until sizes are seen;
    /// when the size is not known (`None`), one batch goes alone first to learn it, so that
    /// large documents cannot pass the byte cap on a wrong guess.
    pub fn new(limits: InFlightLimits, doc_bytes: Option<u64>) -> Self {
        let min = limits.min.max(1);
        let max = limits.max.max(min);
        let limits = InFlightLimits { min, max, ..limits };
        let limit = limits.initial.clamp(min, max);
        Self {
            limits,
            limit,
            slow_start: true,
            in_flight: 0,
            bytes: 0,
            doc_bytes: doc_bytes.unwrap_or(DEFAULT_DOC_BYTES).max(1) as f64,
            sized: doc_bytes.is_some(),
            epoch_start: None,
            epoch_docs: 0,
            epoch_backlog: false,
            last_rate: None,
            latency: None,
            best_latency: None,
            congestion_seen: 0,
            stats: InFlightStats {
                limit,
                peak_limit: limit,
                ..InFlightStats::default()
            },
        }
    }

    /// The largest number of batches it may ever allow.
    pub fn max(&self) -> usize {
        self.limits.max
    }

    /// Its statistics.
    pub fn stats(&self) -> InFlightStats {
        InFlightStats {
            limit: self.limit,
            ..self.stats
        }
    }

    /// The estimated bytes of a batch of `docs` documents.
    pub fn estimate(&self, docs: usize) -> u64 {
        (docs as f64 * self.doc_bytes).ceil() as u64
    }

    /// Admits a batch estimated at `bytes` if the window and the byte cap allow it.
    pub fn try_admit(&mut self, bytes: u64) -> bool {
        let fits =
            self.in_flight == 0 || (self.sized && self.bytes + bytes <= self.limits.max_bytes);
        if self.in_flight >= self.limit || !fits {
            return false;
        }
        self.in_flight += 1;
        self.bytes += bytes;
        self.stats.peak_in_flight = self.stats.peak_in_flight.max(self.in_flight);
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.bytes);
        true
    }

    /// An admitted batch that never ran (the feed ended) gives its room back.
    pub fn release(&mut self, bytes: u64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    /// A batch admitted at `estimate` bytes fetched `docs` documents of `actual` bytes: the
    /// bytes in flight are corrected and the size estimate learns from it.
    pub fn fetched(&mut self, estimate: u64, docs: usize, actual: u64) {
        self.bytes = (self.bytes + actual).saturating_sub(estimate);
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.bytes);
        if docs > 0 {
            let per_doc = (actual as f64 / docs as f64).max(1.0);
            self.doc_bytes = if self.sized {
                0.5 * self.doc_bytes + 0.5 * per_doc
            } else {
                per_doc
            };
            self.sized = true;
        }
    }

    /// A batch taken at `started` ended at `now` holding `bytes`, after `docs` documents
    /// were written, under `load`. Adapts the window at the end of each epoch (as long as a
    /// batch takes): at once on congestion.
    pub fn done(&mut self, bytes: u64, docs: u64, (started, now): (Instant, Instant), load: Load) {
        let Load {
            congestion,
            backlog,
        } = load;
        self.in_flight = self.in_flight.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
        // Only batches that wrote something say how long copying takes (an empty one, or
        // one the target already had, ends after a round trip or none).
        if docs > 0 {
            let took = now.saturating_duration_since(started);
            self.latency = Some(self.latency.map_or(took, |l| (l * 3 + took) / 4));
            self.best_latency = Some(self.best_latency.map_or(took, |b| b.min(took)));
        }
        if congestion > self.congestion_seen {
            self.congestion_seen = congestion;
            self.shrink_to((self.limit / 2).max(self.limits.min));
            self.slow_start = false;
            self.new_epoch(now);
            return;
        }
        let start = *self.epoch_start.get_or_insert(started);
        self.epoch_docs += docs;
        self.epoch_backlog |= backlog;
        let elapsed = now.saturating_duration_since(start);
        // An epoch ends when a batch taken in it ends: only then does the throughput show
        // the window as it is now.
        if started < start || elapsed < MIN_EPOCH {
            return;
        }
        let rate = self.epoch_docs as f64 / elapsed.as_secs_f64();
        self.adapt(rate);
        self.last_rate = Some(rate);
        self.new_epoch(now);
    }

    fn adapt(&mut self, rate: f64) {
        let backlog = self.epoch_backlog;
        let Some(last) = self.last_rate else {
            // The first epoch has nothing to compare with: the pipeline was still filling.
            return self.grow();
        };
        if rate > last * GROWTH {
            self.grow();
        } else if self.saturated(SLOW_FACTOR) {
            // No more throughput, and batches take twice their best: they queue at the
            // endpoints, so one fewer in flight costs nothing.
            self.slow_start = false;
            self.shrink_to(self.limit.saturating_sub(1).max(self.limits.min));
        } else if backlog && !self.saturated(QUEUED_FACTOR) {
            // Work waited for room while batches take about their best: the window, not
            // the endpoints, holds it back (a continuous feed runs at the writers' rate, so
            // its throughput does not grow, but its changes wait).
            self.grow();
        } else {
            // Throughput flat: the knee is found (or the feed, not the window, limits).
            self.slow_start = false;
        }
    }

    fn saturated(&self, factor: f64) -> bool {
        match (self.latency, self.best_latency) {
            (Some(l), Some(b)) => l.as_secs_f64() >= b.as_secs_f64() * factor,
            _ => false,
        }
    }

    fn grow(&mut self) {
        // Only a window that was used can show that more would help.
        if self.stats.peak_in_flight < self.limit {
            return;
        }
        let next = if self.slow_start {
            self.limit * 2
        } else {
            self.limit + 1
        };
        let next = next.min(self.limits.max);
        if next > self.limit {
            self.limit = next;
            self.stats.grows += 1;
            self.stats.peak_limit = self.stats.peak_limit.max(next);
        }
    }

    fn shrink_to(&mut self, next: usize) {
        if next < self.limit {
            self.limit = next;
            self.stats.shrinks += 1;
        }
    }

    fn new_epoch(&mut self, now: Instant) {
        self.epoch_start = Some(now);
        self.epoch_docs = 0;
        self.epoch_backlog = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> InFlightLimits {
        InFlightLimits {
            initial: 4,
            min: 1,
            max: 20,
            max_bytes: 1 << 30,
        }
    }

    /// Keeps the window full for `batches` batches: one admitted at `now` with `n` in
    /// flight ends at `finish(now)` and writes `docs(n)` documents; work always waits for
    /// room when `backlog`.
    fn sim(
        w: &mut InFlight,
        batches: usize,
        docs: impl Fn(usize) -> u64,
        mut finish: impl FnMut(Instant) -> Instant,
        backlog: bool,
    ) {
        let mut now = Instant::now();
        let mut flying: Vec<(Instant, Instant, u64)> = Vec::new();
        for _ in 0..batches {
            while w.try_admit(w.estimate(500)) {
                let n = flying.len() + 1;
                flying.push((finish(now), now, docs(n)));
            }
            flying.sort();
            let (end, start, d) = flying.remove(0);
            now = end;
            let load = Load {
                congestion: 0,
                backlog,
            };
            w.done(w.estimate(500), d, (start, now), load);
        }
    }

    /// A link where a batch takes `d` however many are in flight.
    fn link(d: Duration) -> impl FnMut(Instant) -> Instant {
        move |now| now + d
    }

    /// A server that copies one batch at a time, `d` each.
    fn serial(d: Duration) -> impl FnMut(Instant) -> Instant {
        let mut free: Option<Instant> = None;
        move |now| {
            let end = free.map_or(now, |f| f.max(now)) + d;
            free = Some(end);
            end
        }
    }

    #[test]
    fn grows_on_backlog_while_batches_stay_fast() {
        let mut w = InFlight::new(limits(), Some(300));
        // A continuous feed: the writers set the rate (batches get smaller as more are in
        // flight), a batch always takes 600 ms, and changes wait for room.
        let ms600 = Duration::from_millis(600);
        sim(&mut w, 300, |n| 2000 / n as u64, link(ms600), true);
        assert_eq!(w.stats().limit, 20, "{:?}", w.stats());
        let mut idle = InFlight::new(limits(), Some(300));
        sim(&mut idle, 300, |n| 2000 / n as u64, link(ms600), false);
        assert!(idle.stats().limit < 20, "nothing waits: {:?}", idle.stats());
    }

    #[test]
    fn grows_while_throughput_grows_on_a_slow_link() {
        let mut w = InFlight::new(limits(), Some(300));
        // A batch takes 800 ms (four round trips of 200 ms) however many are in flight.
        sim(&mut w, 200, |_| 500, link(Duration::from_millis(800)), true);
        let s = w.stats();
        assert_eq!(s.limit, 20, "{s:?}");
        assert!(s.grows >= 3, "{s:?}");
    }

    #[test]
    fn stops_growing_when_throughput_does_not() {
        let mut w = InFlight::new(limits(), Some(300));
        // A server copying one batch at a time, 50 ms each: more in flight only queue.
        sim(
            &mut w,
            200,
            |_| 500,
            serial(Duration::from_millis(50)),
            true,
        );
        let s = w.stats();
        assert!(s.limit <= 8, "{s:?}");
    }

    #[test]
    fn halves_on_congestion_and_stops_doubling() {
        let mut w = InFlight::new(
            InFlightLimits {
                initial: 16,
                ..limits()
            },
            Some(300),
        );
        let t = Instant::now();
        assert!(w.try_admit(1));
        w.done(
            1,
            10,
            (t, t + Duration::from_millis(100)),
            Load::congestion(1),
        );
        assert_eq!(w.stats().limit, 8);
        // The same count again is no new congestion.
        assert!(w.try_admit(1));
        w.done(
            1,
            10,
            (t, t + Duration::from_millis(200)),
            Load::congestion(1),
        );
        assert_eq!(w.stats().limit, 8);
        assert!(w.try_admit(1));
        w.done(
            1,
            10,
            (t, t + Duration::from_millis(300)),
            Load::congestion(3),
        );
        assert_eq!(w.stats().limit, 4);
        assert_eq!(w.stats().shrinks, 2);
    }

    #[test]
    fn never_below_min_nor_above_max() {
        let mut w = InFlight::new(
            InFlightLimits {
                initial: 50,
                min: 2,
                max: 6,
                max_bytes: 1 << 30,
            },
            Some(300),
        );
        assert_eq!(w.stats().limit, 6);
        let t = Instant::now();
        for c in 1..10 {
            assert!(w.try_admit(1));
            w.done(1, 1, (t, t), Load::congestion(c));
        }
        assert_eq!(w.stats().limit, 2);
    }

    #[test]
    fn the_byte_cap_admits_one_big_batch_at_a_time() {
        let mut w = InFlight::new(
            InFlightLimits {
                max_bytes: 1_000_000,
                ..limits()
            },
            Some(300),
        );
        assert!(w.try_admit(3_000_000), "one batch always moves");
        assert!(!w.try_admit(10), "nothing more while over the cap");
        w.fetched(3_000_000, 10, 2_500_000);
        w.done(
            2_500_000,
            10,
            (Instant::now(), Instant::now()),
            Load::default(),
        );
        // The size estimate learnt from what was fetched.
        assert!(w.estimate(10) > 1_000_000);
        assert!(w.try_admit(400_000));
        assert!(w.try_admit(400_000));
        assert!(!w.try_admit(400_000), "a third would pass the cap");
        assert_eq!(w.stats().peak_bytes, 3_000_000);
    }

    #[test]
    fn an_unknown_size_sends_one_batch_alone_first() {
        let mut w = InFlight::new(limits(), None);
        assert!(w.try_admit(w.estimate(10)));
        assert!(!w.try_admit(w.estimate(10)), "the size is not known yet");
        w.fetched(w.estimate(10), 10, 2_000_000);
        assert_eq!(w.estimate(10), 2_000_000, "learnt from the first batch");
        assert!(w.try_admit(w.estimate(10)));
    }

    #[test]
    fn saturation_gives_one_back() {
        let mut w = InFlight::new(limits(), Some(300));
        // Quick batches first, then a server that copies one batch at a time.
        let ms100 = Duration::from_millis(100);
        let (mut fast, mut slow, mut n) = (link(ms100), serial(ms100), 0);
        let finish = move |now| {
            n += 1;
            if n <= 60 { fast(now) } else { slow(now) }
        };
        sim(&mut w, 200, |_| 500, finish, true);
        let s = w.stats();
        assert_eq!(s.peak_limit, 20, "{s:?}");
        assert!(s.shrinks >= 1 && s.limit < 20, "{s:?}");
    }
}
