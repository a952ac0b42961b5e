//! Job-level error backoff and healing (CouchDB 4.x's couch_replicator_job.erl): how long a crashed replication waits
//! before it may run again, and when its error count is forgiven.
//!
//! `wait = min_penalty * 2^min(errors, cap)` seconds, where the exponent cap keeps the wait at
//! or under `max_penalty`, then 25 % jitter downwards so crashed jobs of one node do not all
//! come back in the same second. The first crash (errors = 1) waits 48-64 s with the defaults.

use std::time::Duration;

use rand::Rng;

use crate::replication::ReplicationOptions;

/// Hard bounds CouchDB clamps the settings to.
const PENALTY_FLOOR: Duration = Duration::from_secs(2);
const PENALTY_CEILING: Duration = Duration::from_secs(30 * 24 * 3600);

/// The un-jittered wait after `errors` consecutive errors.
pub fn penalty(errors: u32, min_penalty: Duration, max_penalty: Duration) -> Duration {
    let min = min_penalty.max(PENALTY_FLOOR);
    let max = max_penalty.min(PENALTY_CEILING).max(min);
    let cap = (max.as_secs_f64().log2() - min.as_secs_f64().log2()).max(0.0);
    let exponent = f64::from(errors).min(cap);
    let wait = min.as_secs_f64() * exponent.exp2();
    Duration::from_secs_f64(wait.min(max.as_secs_f64()))
}

/// `0.75 * wait + uniform(0 ..= 0.25 * wait + 1 s)`: never longer than `wait + 1 s`.
pub fn jittered(wait: Duration, rng: &mut impl Rng) -> Duration {
    let base = wait.mul_f64(0.75);
    let spread = wait.mul_f64(0.25) + Duration::from_secs(1);
    base + spread.mul_f64(rng.random::<f64>())
}

/// Whether a job that started `ran_for` ago has been healthy long enough for its error count
/// to be reset (CouchDB's `health_threshold`, 120 s).
pub fn is_healed(ran_for: Duration, health_threshold: Duration) -> bool {
    ran_for > health_threshold
}

/// After a `max_backoff` crash (429s pushed the AIMD interval to its ceiling) the job
/// restarts gentler (CouchDB 4.x's couch_replicator_job.erl, 4.x values): each setting lowered to these, never raised.
pub fn gentler_after_max_backoff(o: &mut ReplicationOptions) {
    o.checkpoint_interval = o.checkpoint_interval.min(Duration::from_millis(5000));
    o.worker_processes = o.worker_processes.min(2);
    o.worker_batch_size = o.worker_batch_size.min(100);
    o.http_connections = o.http_connections.min(2);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_backoff_lowers_settings_but_never_raises_them() {
        let mut o = ReplicationOptions::default();
        gentler_after_max_backoff(&mut o);
        assert_eq!(o.checkpoint_interval, Duration::from_millis(5000));
        assert_eq!(
            (o.worker_processes, o.worker_batch_size, o.http_connections),
            (2, 100, 2)
        );
        let mut small = ReplicationOptions {
            worker_processes: 1,
            worker_batch_size: 10,
            http_connections: 1,
            checkpoint_interval: Duration::from_millis(1000),
            ..ReplicationOptions::default()
        };
        gentler_after_max_backoff(&mut small);
        assert_eq!(small.checkpoint_interval, Duration::from_millis(1000));
        assert_eq!(
            (
                small.worker_processes,
                small.worker_batch_size,
                small.http_connections
            ),
            (1, 10, 1)
        );
    }
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// CouchDB's `min_backoff_penalty_sec` default.
    const MIN_BACKOFF_PENALTY: Duration = Duration::from_secs(32);
    /// CouchDB's `max_backoff_penalty_sec` default (2 days).
    const MAX_BACKOFF_PENALTY: Duration = Duration::from_secs(172_800);

    #[test]
    fn penalty_doubles_from_the_minimum_and_caps_at_the_maximum() {
        let (min, max) = (MIN_BACKOFF_PENALTY, MAX_BACKOFF_PENALTY);
        assert_eq!(penalty(0, min, max), Duration::from_secs(32));
        assert_eq!(penalty(1, min, max), Duration::from_secs(64));
        assert_eq!(penalty(2, min, max), Duration::from_secs(128));
        assert_eq!(penalty(10, min, max), Duration::from_secs(32 * 1024));
        // 32 * 2^12.4 = 172 800 exactly at the cap; more errors do not go beyond it.
        let capped = penalty(13, min, max).as_secs_f64();
        assert!((capped - 172_800.0).abs() < 1.0, "{capped}");
        assert_eq!(penalty(50, min, max), penalty(13, min, max));
    }

    #[test]
    fn settings_are_clamped_like_couchdb() {
        // A minimum under 2 s is raised to 2 s.
        assert_eq!(
            penalty(1, Duration::from_millis(10), MAX_BACKOFF_PENALTY),
            Duration::from_secs(4)
        );
        // A maximum below the minimum means "always the minimum".
        assert_eq!(
            penalty(5, Duration::from_secs(60), Duration::from_secs(10)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn jitter_stays_within_three_quarters_and_one_second_over() {
        let mut rng = StdRng::seed_from_u64(7);
        let wait = Duration::from_secs(64);
        let mut lowest = wait * 2;
        let mut highest = Duration::ZERO;
        for _ in 0..1_000 {
            let j = jittered(wait, &mut rng);
            lowest = lowest.min(j);
            highest = highest.max(j);
        }
        assert!(lowest >= Duration::from_secs(48), "{lowest:?}");
        assert!(highest <= Duration::from_secs(65), "{highest:?}");
        assert!(
            highest - lowest > Duration::from_secs(10),
            "jitter too narrow"
        );
    }

    #[test]
    fn healing_needs_strictly_more_than_the_threshold() {
        let t = Duration::from_secs(120);
        assert!(!is_healed(Duration::from_secs(120), t));
        assert!(is_healed(Duration::from_secs(121), t));
    }
}
