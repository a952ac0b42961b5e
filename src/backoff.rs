//! Exponential backoff, the one helper behind every retry loop of the crate: HTTP request
//! retries to endpoints, changes-feed reconnects, `_replicator` write conflicts and store
//! transaction retries.
//!
//! A [`Backoff`] starts at an initial delay and doubles it after every wait, up to a ceiling;
//! [`Backoff::reset`] starts over after progress. With [`Backoff::full_jitter`] each wait is
//! drawn uniformly from zero to the current delay, which keeps many retrying clients from
//! colliding again in lockstep (the "full jitter" of AWS's backoff study, also what
//! FoundationDB's own retry loop does). The replicator's job-level penalty (hours, persisted
//! in the job) is a policy of its own in `replicator::job::error_backoff`.

use std::time::Duration;

/// A doubling delay with a ceiling, optionally jittered.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    full_jitter: bool,
}

impl Backoff {
    /// Starts at `initial` (at most `max`) and doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.min(max);
        Self {
            initial,
            max,
            current: initial,
            full_jitter: false,
        }
    }

    /// Each delay is drawn uniformly from `[0, current]` instead of being `current`.
    pub fn full_jitter(mut self) -> Self {
        self.full_jitter = true;
        self
    }

    /// The delay to wait now; the next one is twice as long (up to the ceiling).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.current;
        self.current = self.current.saturating_mul(2).min(self.max);
        if self.full_jitter {
            delay.mul_f64(rand::random::<f64>())
        } else {
            delay
        }
    }

    /// Waits [`Backoff::next_delay`].
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// Back to the initial delay (after progress).
    pub fn reset(&mut self) {
        self.current = self.initial;
    }

    /// The delay before retry number `attempt` (1 for the first retry) of a fresh backoff,
    /// for callers that count attempts themselves.
    pub fn nth(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        let mut b = Self::new(self.initial, self.max);
        for _ in 0..doublings {
            b.current = b.current.saturating_mul(2).min(b.max);
        }
        b.full_jitter = self.full_jitter;
        b.next_delay()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn delays_double_up_to_the_ceiling_and_reset_starts_over() {
        let mut b = Backoff::new(250 * MS, 1000 * MS);
        let seen: Vec<Duration> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(seen, [250 * MS, 500 * MS, 1000 * MS, 1000 * MS, 1000 * MS]);
        b.reset();
        assert_eq!(b.next_delay(), 250 * MS);
    }

    #[test]
    fn nth_matches_the_sequence_and_saturates() {
        let b = Backoff::new(MS, Duration::from_secs(1));
        assert_eq!(b.nth(1), MS);
        assert_eq!(b.nth(4), 8 * MS);
        assert_eq!(b.nth(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn full_jitter_stays_within_the_current_delay() {
        let mut b = Backoff::new(100 * MS, 400 * MS).full_jitter();
        for ceiling in [100, 200, 400, 400] {
            assert!(b.next_delay() <= ceiling * MS);
        }
        assert!(b.nth(30) <= 400 * MS);
    }

    #[test]
    fn an_initial_delay_above_the_ceiling_is_capped() {
        let mut b = Backoff::new(Duration::from_secs(9), Duration::from_secs(2));
        assert_eq!(b.next_delay(), Duration::from_secs(2));
    }
}
