//! Retry timing of a failing step (the thesis' `retry_strategy`): the sleep before retry
//! `n` (0-based) is `sleep * sleep_factor^n`, capped at `sleep_max`.

use std::time::Duration;

use super::model::{MAX_SLEEP_SECS, RetryStrategy};

/// The sleep before retry `n` (0 = the first retry, after the first failed attempt).
pub fn retry_delay(strategy: &RetryStrategy, n: u32) -> Duration {
    let exp = i32::try_from(n).unwrap_or(i32::MAX);
    let mut secs = strategy.sleep * strategy.sleep_factor.powi(exp);
    if let Some(max) = strategy.sleep_max {
        secs = secs.min(max);
    }
    // Validated strategies are finite and non-negative; stay safe for anything stored.
    if !secs.is_finite() || secs < 0.0 {
        secs = if secs.is_nan() || secs < 0.0 {
            0.0
        } else {
            MAX_SLEEP_SECS
        };
    }
    Duration::try_from_secs_f64(secs.min(MAX_SLEEP_SECS)).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sleep of a strategy, in order (one per retry).
    fn retry_schedule(strategy: &RetryStrategy) -> Vec<Duration> {
        (0..strategy.max_retries)
            .map(|n| retry_delay(strategy, n))
            .collect()
    }

    fn s(sleep: f64, factor: f64, max: Option<f64>, retries: u32) -> RetryStrategy {
        RetryStrategy {
            max_retries: retries,
            sleep,
            sleep_factor: factor,
            sleep_max: max,
        }
    }

    #[test]
    fn sleeps_grow_by_the_factor_up_to_the_cap() {
        let secs = |v: Vec<Duration>| v.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>();
        assert_eq!(
            secs(retry_schedule(&s(1.0, 2.0, Some(10.0), 6))),
            [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
        );
        assert_eq!(secs(retry_schedule(&s(0.5, 1.0, None, 3))), [0.5, 0.5, 0.5]);
        assert_eq!(secs(retry_schedule(&s(0.0, 3.0, None, 2))), [0.0, 0.0]);
        assert!(retry_schedule(&s(1.0, 2.0, None, 0)).is_empty());
    }

    #[test]
    fn huge_exponents_saturate_instead_of_panicking() {
        assert_eq!(
            retry_delay(&s(1.0, 10.0, None, 1000), 999),
            Duration::from_secs(86_400)
        );
        assert_eq!(
            retry_delay(&s(1.0, 10.0, Some(5.0), 1000), u32::MAX),
            Duration::from_secs(5)
        );
        assert_eq!(retry_delay(&s(-1.0, 1.0, None, 1), 0), Duration::ZERO);
        assert_eq!(retry_delay(&s(f64::NAN, 1.0, None, 1), 0), Duration::ZERO);
    }
}
