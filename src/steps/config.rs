//! Settings of the steps job type, with their defaults.

use std::borrow::Cow;
use std::time::Duration;

use crate::store::tuple::{self, Bytes};

/// The tuple element after the layer prefix under which steps documents live (couch_jobs
/// uses 51, the 4.x replicator's collision index 54).
pub const STEPS_SUBSPACE: i64 = 60;

/// How the steps job type behaves on this node.
#[derive(Debug, Clone, PartialEq)]
pub struct StepsConfig {
    /// Key prefix of the steps documents: `layer prefix ‖ pack((60))` by default.
    pub prefix: Vec<u8>,
    /// couch_jobs activity timeout of the step queues (seconds): a worker that has not
    /// called `update` for this long loses its step to the activity monitor.
    pub activity_timeout_secs: i64,
    /// How often a worker running a step calls `update` (default: a third of the timeout).
    pub keepalive_interval: Option<Duration>,
    /// Bytes of command output kept per step.
    pub output_limit: usize,
    /// Scheduling weight of one remaining step, in seconds of job age: the queue key of a
    /// step is `created - remaining_steps * weight`, so jobs further from completion go
    /// first (highest level first, optimal for chains of equal steps) while a job that has
    /// waited `weight` seconds longer outranks one with one more step left. 0 = oldest first.
    pub priority_step_secs: i64,
    /// An idle worker re-reads its queues at least this often even without a wake-up.
    pub idle_recheck: Duration,
}

impl Default for StepsConfig {
    fn default() -> Self {
        let mut prefix = tuple::pack(&(Bytes(Cow::Borrowed(b"couchdb")),));
        tuple::pack_into(&(STEPS_SUBSPACE,), &mut prefix);
        Self {
            prefix,
            activity_timeout_secs: 30,
            keepalive_interval: None,
            output_limit: 4096,
            priority_step_secs: 60,
            idle_recheck: Duration::from_secs(5),
        }
    }
}

impl StepsConfig {
    /// The effective keep-alive period: the set one, or a third of the activity timeout
    /// (at least 100 ms).
    pub fn keepalive(&self) -> Duration {
        self.keepalive_interval.unwrap_or_else(|| {
            let ms = self.activity_timeout_secs.max(1).saturating_mul(1000) / 3;
            Duration::from_millis(u64::try_from(ms).unwrap_or(10_000).max(100))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_defaults_to_a_third_of_the_timeout() {
        let c = StepsConfig {
            activity_timeout_secs: 3,
            ..StepsConfig::default()
        };
        assert_eq!(c.keepalive(), Duration::from_secs(1));
        let c = StepsConfig {
            keepalive_interval: Some(Duration::from_millis(250)),
            ..c
        };
        assert_eq!(c.keepalive(), Duration::from_millis(250));
    }
}
