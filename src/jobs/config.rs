//! couch_jobs settings (CouchDB's `[couch_jobs]` section, default.ini on CouchDB's fdbarchive
//! branch): defaults and ranges. Times are [`Duration`]s; each field's doc names the
//! CouchDB key (and its unit) it stands for.

use std::time::Duration;

/// Every `[couch_jobs]` setting, with CouchDB's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct JobsConfig {
    /// Upper bound of the activity monitor's jitter: `uniform(min(timeout/2, this))`
    /// (`activity_monitor_max_jitter_msec`).
    pub activity_monitor_max_jitter: Duration,
    /// Checks per type timeout (ours; CouchDB checks once per timeout, which is `1`). With
    /// `n` checks a job is re-enqueued `1 + 1/n` timeouts (+ jitter) after its worker's last
    /// update at worst, instead of 2; a job is still only re-enqueued after a whole timeout
    /// without an update.
    pub activity_monitor_checks_per_timeout: u32,
    /// AIMD start size of the activity monitor's re-enqueue batches.
    pub activity_monitor_init_batch_size: usize,
    /// AIMD additive step after a full batch.
    pub activity_monitor_batch_increment: usize,
    /// AIMD multiplicative back-off (0..1) after a failed batch.
    pub activity_monitor_batch_factor: f64,
    /// Minimum spacing of type-updated notifications to a notifier
    /// (`type_monitor_holdoff_msec`).
    pub type_monitor_holdoff: Duration,
    /// How long the type monitor waits on the activity watch (`None` = infinity;
    /// `type_monitor_timeout_msec`).
    pub type_monitor_timeout: Option<Duration>,
    /// Type discovery period of the type server (`type_check_period_msec`).
    pub type_check_period: Duration,
    /// Jitter bound of the type server: `uniform(max(period/2, this))`
    /// (`type_check_max_jitter_msec`).
    pub type_check_max_jitter: Duration,
    /// AIMD start size of the notifier's batches.
    pub notifier_init_batch_size: usize,
    /// AIMD additive step of the notifier.
    pub notifier_batch_increment: usize,
    /// AIMD multiplicative back-off of the notifier.
    pub notifier_batch_factor: f64,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            activity_monitor_max_jitter: Duration::from_secs(10),
            activity_monitor_checks_per_timeout: 2,
            activity_monitor_init_batch_size: 1000,
            activity_monitor_batch_increment: 100,
            activity_monitor_batch_factor: 0.75,
            type_monitor_holdoff: Duration::from_millis(50),
            type_monitor_timeout: None,
            type_check_period: Duration::from_secs(15),
            type_check_max_jitter: Duration::from_secs(5),
            notifier_init_batch_size: 1000,
            notifier_batch_increment: 100,
            notifier_batch_factor: 0.75,
        }
    }
}

/// A setting that is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid couch_jobs setting {name}: {reason}")]
pub struct ConfigError {
    /// The setting's field name.
    pub name: &'static str,
    /// Which rule the value breaks.
    pub reason: &'static str,
}

impl JobsConfig {
    /// Checks CouchDB's rules: counts and times strictly positive, factors in (0, 1).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            (
                "activity_monitor_max_jitter",
                self.activity_monitor_max_jitter.as_nanos(),
            ),
            (
                "activity_monitor_checks_per_timeout",
                self.activity_monitor_checks_per_timeout as u128,
            ),
            (
                "activity_monitor_init_batch_size",
                self.activity_monitor_init_batch_size as u128,
            ),
            (
                "activity_monitor_batch_increment",
                self.activity_monitor_batch_increment as u128,
            ),
            ("type_monitor_holdoff", self.type_monitor_holdoff.as_nanos()),
            ("type_check_period", self.type_check_period.as_nanos()),
            (
                "type_check_max_jitter",
                self.type_check_max_jitter.as_nanos(),
            ),
            (
                "notifier_init_batch_size",
                self.notifier_init_batch_size as u128,
            ),
            (
                "notifier_batch_increment",
                self.notifier_batch_increment as u128,
            ),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(ConfigError {
                    name,
                    reason: "must be strictly positive",
                });
            }
        }
        if self.type_monitor_timeout == Some(Duration::ZERO) {
            return Err(ConfigError {
                name: "type_monitor_timeout",
                reason: "must be strictly positive or infinity",
            });
        }
        for (name, f) in [
            (
                "activity_monitor_batch_factor",
                self.activity_monitor_batch_factor,
            ),
            ("notifier_batch_factor", self.notifier_batch_factor),
        ] {
            if !(f > 0.0 && f < 1.0) {
                return Err(ConfigError {
                    name,
                    reason: "must be between 0 and 1",
                });
            }
        }
        Ok(())
    }
}

/// A batch size that adapts by additive increase / multiplicative decrease, shared by the activity monitor
/// and the notifier (CouchDB's couch_jobs_activity_monitor.erl): a full batch grows the size, a failed one shrinks it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchSize {
    /// The current batch size (never below 1).
    pub size: usize,
    /// Added to `size` after a full batch.
    pub increment: usize,
    /// Multiplies `size` after a failed batch (in 0..1).
    pub factor: f64,
}

impl BatchSize {
    /// Starts at `init` (raised to 1 if zero) with the given step and back-off factor.
    pub fn new(init: usize, increment: usize, factor: f64) -> Self {
        Self {
            size: init.max(1),
            increment,
            factor,
        }
    }

    /// After a batch that came back full.
    pub fn grow(&mut self) {
        self.size = self.size.saturating_add(self.increment);
    }

    /// After a batch that failed (too large, too slow, conflicting).
    pub fn shrink(&mut self) {
        let next = (self.size as f64 * self.factor).round() as usize;
        // round(2 * 0.75) = 2 would never reach 1: always shrink by at least one.
        self.size = next.min(self.size.saturating_sub(1)).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_couchdb_and_validate() {
        let c = JobsConfig::default();
        assert_eq!(c.activity_monitor_init_batch_size, 1000);
        assert_eq!(c.type_check_period, Duration::from_secs(15));
        assert!(c.validate().is_ok());
        let bad = JobsConfig {
            notifier_batch_factor: 1.5,
            ..JobsConfig::default()
        };
        assert_eq!(bad.validate().unwrap_err().name, "notifier_batch_factor");
        let zero = JobsConfig {
            type_check_period: Duration::ZERO,
            ..JobsConfig::default()
        };
        assert!(zero.validate().is_err());
    }

    #[test]
    fn batch_size_grows_and_shrinks_to_one() {
        let mut a = BatchSize::new(1000, 100, 0.75);
        a.grow();
        assert_eq!(a.size, 1100);
        a.shrink();
        assert_eq!(a.size, 825);
        for _ in 0..100 {
            a.shrink();
        }
        assert_eq!(a.size, 1);
    }
}
