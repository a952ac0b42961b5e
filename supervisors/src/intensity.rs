//! Restart intensity: OTP's `max_restarts` within `max_seconds` sliding window.
//!
//! A supervisor records every restart here; when more than `max_restarts` restarts fall inside
//! the window, the supervisor gives up (stops its children and fails to its own parent).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Sliding-window restart counter.
#[derive(Debug, Clone)]
pub struct Intensity {
    max_restarts: u32,
    period: Duration,
    restarts: VecDeque<Instant>,
}

impl Intensity {
    /// At most `max_restarts` restarts within any `period`.
    pub fn new(max_restarts: u32, period: Duration) -> Self {
        Self {
            max_restarts,
            period,
            restarts: VecDeque::new(),
        }
    }

    /// Record a restart at `now`. Returns `true` if it is allowed, `false` if it exceeds the
    /// intensity (the caller must then give up). Restarts older than the window age out;
    /// like OTP a restart exactly `period` ago still counts.
    pub fn record(&mut self, now: Instant) -> bool {
        self.restarts.push_back(now);
        while let Some(first) = self.restarts.front() {
            if now.saturating_duration_since(*first) > self.period {
                self.restarts.pop_front();
            } else {
                break;
            }
        }
        self.restarts.len() <= self.max_restarts as usize
    }

    /// Restarts currently inside the window (as of the last `record`).
    pub fn recent(&self) -> usize {
        self.restarts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_at_limit_is_allowed_one_past_is_not() {
        let t0 = Instant::now();
        let mut i = Intensity::new(3, Duration::from_secs(5));
        assert!(i.record(t0));
        assert!(i.record(t0 + Duration::from_secs(1)));
        assert!(i.record(t0 + Duration::from_secs(2)));
        assert!(!i.record(t0 + Duration::from_secs(3)));
    }

    #[test]
    fn old_restarts_age_out() {
        let t0 = Instant::now();
        let mut i = Intensity::new(2, Duration::from_secs(5));
        assert!(i.record(t0));
        assert!(i.record(t0 + Duration::from_secs(1)));
        // t0 is 5s old: still in the window (OTP counts `now - t =< period`).
        assert!(!i.record(t0 + Duration::from_secs(5)));
        let mut j = Intensity::new(2, Duration::from_secs(5));
        assert!(j.record(t0));
        assert!(j.record(t0 + Duration::from_secs(1)));
        // t0 is older than 5s: aged out, so this is the 2nd restart in the window.
        assert!(j.record(t0 + Duration::from_millis(5001)));
        assert_eq!(j.recent(), 2);
    }

    #[test]
    fn zero_allows_nothing() {
        let mut i = Intensity::new(0, Duration::from_secs(5));
        assert!(!i.record(Instant::now()));
    }
}
