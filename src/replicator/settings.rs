//! The `[replicator]` settings of a node, with CouchDB's names and 4.x defaults (CouchDB 4.x's [replicator] defaults,
//! CouchDB 3.x's [replicator] defaults in default.ini), in one place. Deserialised from the config file's `[replicator]` table; every field
//! has its default so a partial file works.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::share::ShareParams;
use crate::replication::ReplicationOptions;

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

/// The scheduler and job settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicatorSettings {
    /// Jobs running on this node at most (outside churn spikes).
    pub max_jobs: usize,
    /// The job server's cycle, seconds.
    pub interval_sec: u64,
    /// Extra job starts per cycle when work is pending.
    pub max_churn: usize,
    /// Idle acceptors kept waiting for work.
    pub max_acceptors: usize,
    /// Continuous jobs younger than this are never trimmed, seconds.
    pub min_run_time_sec: u64,
    /// Finished transient jobs are removed after this, seconds.
    pub transient_job_max_age_sec: u64,
    /// An idle acceptor sleeps up to this before asking again, milliseconds.
    pub startup_jitter: u64,
    /// A job running this long without error has its error count reset, seconds.
    pub health_threshold_sec: u64,
    /// Base of the crash back-off: after `n` consecutive errors a job waits about this times
    /// 2^n before it may run again, seconds (at least 2).
    pub min_backoff_penalty_sec: u64,
    /// Ceiling of that wait, seconds (CouchDB: 2 days; at most 30 days).
    pub max_backoff_penalty_sec: u64,
    /// Events kept in a job's history.
    pub max_history: usize,
    /// How often a running job refreshes its stats in the job store, seconds.
    pub stats_update_interval_sec: u64,
    /// couch_jobs activity timeout of replication jobs, seconds (CouchDB: 61).
    pub job_timeout_sec: u64,
    /// Membership must be unchanged this long before the cluster is `stable`, seconds.
    pub cluster_quiet_period: u64,
    /// The same window right after boot, seconds.
    pub cluster_start_period: u64,
    /// Ours (CouchDB hard-codes 25,000): a request whose 429 back-off would wait this long
    /// fails the job with `max_backoff`, milliseconds, at most 25,000.
    pub rate_limiter_max_interval_msec: u64,
    /// Idle pooled connections are closed after this, milliseconds.
    pub connection_close_interval: u64,
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
    /// replication document does not set. Read from the `[replicator]` keys CouchDB uses for
    /// them; not part of this table's own keys.
    #[serde(skip)]
    pub job_defaults: ReplicationOptions,
}

impl Default for ReplicatorSettings {
    fn default() -> Self {
        Self {
            max_jobs: 500,
            interval_sec: 15,
            max_churn: 100,
            max_acceptors: 2,
            min_run_time_sec: 60,
            transient_job_max_age_sec: 86_400,
            startup_jitter: 5_000,
            health_threshold_sec: 120,
            min_backoff_penalty_sec: 32,
            max_backoff_penalty_sec: 172_800,
            max_history: 10,
            stats_update_interval_sec: 10,
            job_timeout_sec: 61,
            cluster_quiet_period: 60,
            cluster_start_period: 5,
            rate_limiter_max_interval_msec: 25_000,
            connection_close_interval: 90_000,
            node_types: vec![NodeType::ApiFrontend, NodeType::Replication],
            shares: BTreeMap::new(),
            usage_coeff: 0.5,
            priority_coeff: 0.98,
            job_defaults: ReplicationOptions::default(),
        }
    }
}

impl ReplicatorSettings {
    /// The job server's cycle (`interval_sec`).
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.interval_sec)
    }

    /// The 429 back-off ceiling.
    pub fn rate_limiter_max_interval(&self) -> Duration {
        Duration::from_millis(self.rate_limiter_max_interval_msec)
    }

    /// How long a continuous job runs before it may be trimmed (`min_run_time_sec`).
    pub fn min_run_time(&self) -> Duration {
        Duration::from_secs(self.min_run_time_sec)
    }

    /// How long a job must run without error for its error count to be reset
    /// (`health_threshold_sec`).
    pub fn health_threshold(&self) -> Duration {
        Duration::from_secs(self.health_threshold_sec)
    }

    /// The crash back-off's starting wait (`min_backoff_penalty_sec`).
    pub fn min_backoff_penalty(&self) -> Duration {
        Duration::from_secs(self.min_backoff_penalty_sec)
    }

    /// The crash back-off's ceiling (`max_backoff_penalty_sec`).
    pub fn max_backoff_penalty(&self) -> Duration {
        Duration::from_secs(self.max_backoff_penalty_sec)
    }

    /// How long an idle pooled connection is kept (`connection_close_interval`).
    pub fn connection_close_interval(&self) -> Duration {
        Duration::from_millis(self.connection_close_interval)
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

    /// Rejects settings that would stall the scheduler, with the setting's CouchDB name.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_jobs", self.max_jobs as u64),
            ("interval_sec", self.interval_sec),
            ("max_acceptors", self.max_acceptors as u64),
            ("job_timeout_sec", self.job_timeout_sec),
            ("stats_update_interval_sec", self.stats_update_interval_sec),
            (
                "rate_limiter_max_interval_msec",
                self.rate_limiter_max_interval_msec,
            ),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("[replicator] {name} must be greater than 0"));
        }
        if self.node_types.is_empty() {
            return Err(
                "[replicator] node_types must name at least one of api_frontend, replication"
                    .into(),
            );
        }
        if self.rate_limiter_max_interval_msec > 25_000 {
            return Err("[replicator] rate_limiter_max_interval_msec must be at most 25000".into());
        }
        if self.min_backoff_penalty_sec > self.max_backoff_penalty_sec {
            return Err(
                "[replicator] min_backoff_penalty_sec must not exceed max_backoff_penalty_sec"
                    .into(),
            );
        }
        for (name, v) in [
            ("usage_coeff", self.usage_coeff),
            ("priority_coeff", self.priority_coeff),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("[replicator] {name} must be between 0 and 1"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_json_keeps_the_other_defaults() {
        let s: ReplicatorSettings =
            serde_json::from_str(r#"{"max_jobs": 100, "node_types": ["replication"]}"#).unwrap();
        assert_eq!(s.max_jobs, 100);
        assert_eq!(s.interval_sec, 15);
        assert!(s.runs(NodeType::Replication));
        assert!(!s.runs(NodeType::ApiFrontend));
        assert!(s.validate().is_ok());
    }

    #[test]
    fn unknown_and_zero_settings_are_rejected_by_name() {
        assert!(serde_json::from_str::<ReplicatorSettings>(r#"{"max_jobz": 1}"#).is_err());
        let s = ReplicatorSettings {
            max_jobs: 0,
            ..Default::default()
        };
        assert_eq!(
            s.validate().unwrap_err(),
            "[replicator] max_jobs must be greater than 0"
        );
        let s = ReplicatorSettings {
            node_types: vec![],
            ..Default::default()
        };
        assert!(s.validate().unwrap_err().contains("node_types"));
    }
}
