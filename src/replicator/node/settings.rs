//! The scheduler and job settings of a node, with CouchDB 4.x's defaults (CouchDB 4.x's
//! `[replicator]` defaults, CouchDB 3.x's in default.ini), in one place, and their ranges.
//! Plain names and [`Duration`]s: CouchDB's key names and units (`interval_sec`,
//! `rate_limiter_max_interval_msec`, ...) belong to the config-file layer that fills these.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::replication::ReplicationOptions;
use crate::replicator::scheduler::share::ShareParams;

/// What a node does (CouchDB 4.x node types): `api_frontend` creates jobs (HTTP API,
/// `_replicator` docs), `replication` runs them. A node may be both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeType {
    /// `api_frontend`: serves the HTTP API and turns `_replicator` documents into jobs.
    ApiFrontend,
    /// `replication`: accepts and runs replication jobs.
    Replication,
}

/// What a node started with timing other than the cluster's does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimingPolicy {
    /// Takes the cluster's values (and logs both).
    #[default]
    Adopt,
    /// Records its own values as the cluster's (the one explicit way to change them).
    Replace,
}

/// The scheduler and job settings, as an embedding host sets them. Times are [`Duration`]s;
/// the config-file layer (the `couch-replicator` binary) reads CouchDB's `[replicator]` keys,
/// with their names and units, into these fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicatorSettings {
    /// Jobs running on this node at most (outside churn spikes).
    pub max_jobs: usize,
    /// The job server's cycle.
    pub interval: Duration,
    /// Extra job starts per cycle when work is pending.
    pub max_churn: usize,
    /// Idle acceptors kept waiting for work.
    pub max_acceptors: usize,
    /// Continuous jobs younger than this are never trimmed.
    pub min_run_time: Duration,
    /// Finished transient jobs are removed after this.
    pub transient_job_max_age: Duration,
    /// An idle acceptor sleeps up to this before asking again.
    pub startup_jitter: Duration,
    /// A job running this long without error has its error count reset.
    pub health_threshold: Duration,
    /// Base of the crash back-off: after `n` consecutive errors a job waits about this times
    /// 2^n before it may run again.
    pub min_backoff_penalty: Duration,
    /// Ceiling of that wait (CouchDB: 2 days).
    pub max_backoff_penalty: Duration,
    /// Events kept in a job's history.
    pub max_history: usize,
    /// The longest a running job waits before its changed stats reach the job store; ours
    /// writes them each second (`_active_tasks` follows progress, as CouchDB's task status
    /// does), so only a shorter value changes anything. An idle job writes nothing.
    pub stats_update_interval: Duration,
    /// couch_jobs activity timeout of replication jobs, whole seconds (CouchDB: 61 s).
    pub job_timeout: Duration,
    /// Ours: a node whose membership row has not changed for this long (as its neighbour
    /// sees it) is removed and its jobs run elsewhere; a node that could not beat for most
    /// of it stops its own jobs first. Capped by `job_timeout` (see [`Self::node_timeout`]).
    pub node_timeout: Duration,
    /// What a node started with a `job_timeout` or `node_timeout` other than the cluster's
    /// does (`[replicator] cluster_timing`; see `cluster::agreement`).
    pub cluster_timing: TimingPolicy,
    /// Membership must be unchanged this long before the cluster is `stable`.
    pub cluster_quiet_period: Duration,
    /// The same window right after boot.
    pub cluster_start_period: Duration,
    /// Ours (CouchDB hard-codes 25 s): a request whose 429 back-off would wait this long
    /// fails the job with `max_backoff`; at most 25 s.
    pub rate_limiter_max_interval: Duration,
    /// Idle pooled connections are closed after this.
    pub connection_close_interval: Duration,
    /// Ours: buffered requests in flight to one endpoint across all jobs (a job's own
    /// `http_connections` still bounds it alone). Continuous feeds do not count. It bounds
    /// the sockets a rotation's burst of job starts opens.
    pub max_requests_per_endpoint: usize,
    /// What this node runs.
    pub node_types: Vec<NodeType>,
    /// Fair-share weight per `_replicator` database (`[replicator.shares]`, 1..=1000, others
    /// 100).
    pub shares: BTreeMap<String, u32>,
    /// How much of a database's fair-share usage survives a cycle (0..=1).
    pub usage_coeff: f64,
    /// How much of a job's fair-share priority survives a cycle (0..=1).
    pub priority_coeff: f64,
    /// Per-job defaults (`worker_processes`, `connection_timeout`, TLS, ...): what a
    /// replication document does not set.
    pub job_defaults: ReplicationOptions,
}

impl Default for ReplicatorSettings {
    fn default() -> Self {
        Self {
            max_jobs: 500,
            interval: Duration::from_secs(15),
            max_churn: 100,
            max_acceptors: 2,
            min_run_time: Duration::from_secs(60),
            transient_job_max_age: Duration::from_secs(86_400),
            startup_jitter: Duration::from_secs(5),
            health_threshold: Duration::from_secs(120),
            min_backoff_penalty: Duration::from_secs(32),
            max_backoff_penalty: Duration::from_secs(172_800),
            max_history: 10,
            stats_update_interval: Duration::from_secs(10),
            job_timeout: Duration::from_secs(61),
            node_timeout: Duration::from_secs(8),
            cluster_timing: TimingPolicy::Adopt,
            cluster_quiet_period: Duration::from_secs(60),
            cluster_start_period: Duration::from_secs(5),
            rate_limiter_max_interval: MAX_RATE_LIMITER_INTERVAL,
            connection_close_interval: Duration::from_secs(90),
            max_requests_per_endpoint: 100,
            node_types: vec![NodeType::ApiFrontend, NodeType::Replication],
            shares: BTreeMap::new(),
            usage_coeff: 0.5,
            priority_coeff: 0.98,
            job_defaults: ReplicationOptions::default(),
        }
    }
}

/// CouchDB's fixed 429 back-off ceiling, the most `rate_limiter_max_interval` may be.
const MAX_RATE_LIMITER_INTERVAL: Duration = Duration::from_secs(25);

/// A setting out of range: the field (as named in [`ReplicatorSettings`]) and the rule it
/// breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} {rule}")]
pub struct SettingsError {
    /// The field's name.
    pub setting: &'static str,
    /// What it must be.
    pub rule: &'static str,
}

impl ReplicatorSettings {
    /// How long a silent node lives on in its neighbours' eyes: `node_timeout`, at most
    /// `job_timeout` (a job's own lease never outlives its node's).
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout.min(self.job_timeout)
    }

    /// The fair-share parameters.
    pub fn share_params(&self) -> ShareParams {
        ShareParams {
            shares: self.shares.clone(),
            usage_coeff: self.usage_coeff,
            priority_coeff: self.priority_coeff,
        }
    }

    /// Whether this node has `node_type` in its `node_types`.
    pub fn runs(&self, node_type: NodeType) -> bool {
        self.node_types.contains(&node_type)
    }

    /// Rejects settings that would stall the scheduler, naming the setting.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let bad = |setting, rule| Err(SettingsError { setting, rule });
        let positive = [
            ("max_jobs", self.max_jobs == 0),
            ("interval", self.interval.is_zero()),
            ("max_acceptors", self.max_acceptors == 0),
            (
                "max_requests_per_endpoint",
                self.max_requests_per_endpoint == 0,
            ),
            (
                "stats_update_interval",
                self.stats_update_interval.is_zero(),
            ),
            (
                "rate_limiter_max_interval",
                self.rate_limiter_max_interval.is_zero(),
            ),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, zero)| *zero) {
            return bad(name, "must be greater than 0");
        }
        if self.node_timeout < Duration::from_secs(2) {
            return bad("node_timeout", "must be at least 2 seconds");
        }
        // couch_jobs keeps activity timeouts in whole seconds.
        if self.job_timeout < Duration::from_secs(1) {
            return bad("job_timeout", "must be at least 1 second");
        }
        if self.node_types.is_empty() {
            return bad(
                "node_types",
                "must name at least one of api_frontend, replication",
            );
        }
        if self.rate_limiter_max_interval > MAX_RATE_LIMITER_INTERVAL {
            return bad("rate_limiter_max_interval", "must be at most 25 seconds");
        }
        if self.min_backoff_penalty > self.max_backoff_penalty {
            return bad("min_backoff_penalty", "must not exceed max_backoff_penalty");
        }
        for (name, v) in [
            ("usage_coeff", self.usage_coeff),
            ("priority_coeff", self.priority_coeff),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(name, "must be between 0 and 1");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_couchdbs_and_valid() {
        let s = ReplicatorSettings::default();
        assert_eq!(s.interval, Duration::from_secs(15));
        assert_eq!(s.job_timeout, Duration::from_secs(61));
        assert!(s.runs(NodeType::Replication) && s.runs(NodeType::ApiFrontend));
        assert!(s.validate().is_ok());
    }

    #[test]
    fn out_of_range_settings_are_rejected_by_name() {
        let s = ReplicatorSettings {
            max_jobs: 0,
            ..Default::default()
        };
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "max_jobs must be greater than 0"
        );
        let s = ReplicatorSettings {
            node_types: vec![],
            ..Default::default()
        };
        assert_eq!(s.validate().unwrap_err().setting, "node_types");
        let s = ReplicatorSettings {
            rate_limiter_max_interval: Duration::from_millis(25_001),
            ..Default::default()
        };
        assert_eq!(
            s.validate().unwrap_err().setting,
            "rate_limiter_max_interval"
        );
        let s = ReplicatorSettings {
            job_timeout: Duration::from_millis(500),
            ..Default::default()
        };
        assert_eq!(s.validate().unwrap_err().setting, "job_timeout");
    }
}
