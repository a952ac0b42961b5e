//! What every node sharing a store must agree on, kept in the store and settled at start
//! ([`settle`]): the store's format version, and the cluster's timing (`job_timeout`,
//! `node_timeout`).
//!
//! - **Format.** `(prefix, 56, "format") -> "N"`. A store without one gets this build's
//!   [`STORE_FORMAT`]; a store written in a newer format is refused with both versions named,
//!   so a node of an older version cannot join a cluster an upgrade moved on. A future format
//!   change must come with an explicit upgrade step that rewrites this key (see
//!   `docs/operations.md`).
//! - **Timing.** `(prefix, 56, "timing") -> {"job_timeout_sec", "node_timeout_sec"}`. Each
//!   node used to write its own `job_timeout` into couch_jobs' type timeout at start, the last
//!   one winning, while it timed its own leases with its own value: a node's healthy jobs
//!   could then be re-enqueued while it still ran them. Now the first node records its timing;
//!   a node started with other values adopts the cluster's and says so; `[replicator]
//!   cluster_timing = replace` is the one explicit way to change them (that node records its
//!   own; the others adopt them as they restart, so restart every node in turn). Replacing
//!   is safe while the other nodes run: each member's row carries its own node timeout and
//!   is given it (`membership.rs`), and a longer job timeout only lets a job live longer;
//!   but a *shorter* job timeout would let another node take a job whose node still times
//!   its lease on the longer one. So a replace that shortens `job_timeout` first watches the
//!   membership rows for one node timeout, and is refused, naming the nodes, while a node
//!   that runs replications still beats.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::jobs::Jobs;
use crate::replicator::cluster::membership::{member_rows_tx, runs_replications};
use crate::replicator::node::settings::{ReplicatorSettings, TimingPolicy};
use crate::store::{StoreError, Tx, tuple};

/// The format of the replicator's keys this build reads and writes.
pub const STORE_FORMAT: u32 = 1;

/// Sub-space tag of what the cluster agrees on (ours).
const AGREEMENT: i64 = 56;

/// Why the store cannot be joined.
#[derive(Debug, thiserror::Error)]
pub enum AgreementError {
    /// The store was written in a format this build does not know.
    #[error(
        "the job store's format is {stored}, newer than the {ours} this node reads: run this \
         node's newer version (an older node must not join a store an upgrade moved on)"
    )]
    NewerFormat {
        /// The store's.
        stored: u32,
        /// This build's.
        ours: u32,
    },
    /// The format key holds something else.
    #[error("the job store's format key holds {0:?}, not a version number")]
    Unreadable(String),
    /// A replace that shortens the job timeout while replication nodes still run.
    #[error(
        "cannot shorten the cluster's job timeout from {cluster_sec} s to {ours_sec} s while \
         nodes that run replications still beat ({}): their jobs' leases run on {cluster_sec} s, \
         so another node could take their jobs while they still run them. Stop them first \
         (or replace with a timeout at least as long)",
        nodes.join(", ")
    )]
    ShorterWhileRunning {
        /// The recorded job timeout, seconds.
        cluster_sec: u64,
        /// This node's, seconds.
        ours_sec: u64,
        /// The nodes seen beating.
        nodes: Vec<String>,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The cluster's timing as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterTiming {
    /// couch_jobs' activity timeout of replication jobs, seconds.
    pub job_timeout_sec: u64,
    /// Node liveness timeout, seconds.
    pub node_timeout_sec: u64,
}

impl ClusterTiming {
    fn of(s: &ReplicatorSettings) -> Self {
        Self {
            job_timeout_sec: s.job_timeout.as_secs(),
            node_timeout_sec: s.node_timeout.as_secs(),
        }
    }

    fn apply(self, s: &mut ReplicatorSettings) {
        s.job_timeout = Duration::from_secs(self.job_timeout_sec);
        s.node_timeout = Duration::from_secs(self.node_timeout_sec);
    }
}

/// Checks the store's format and settles the cluster's timing into `settings` (in one
/// transaction).
pub async fn settle(
    jobs: &Jobs,
    prefix: &[u8],
    settings: &mut ReplicatorSettings,
) -> Result<(), AgreementError> {
    let policy = settings.cluster_timing;
    let key = |name: &str| {
        let mut k = prefix.to_vec();
        tuple::pack_into(&(AGREEMENT, name), &mut k);
        k
    };
    let (format_key, timing_key) = (key("format"), key("timing"));
    let ours = ClusterTiming::of(settings);
    let recorded = jobs
        .db()
        .run(|tx: Tx| {
            let timing_key = timing_key.clone();
            async move { tx.get(&timing_key, false).await }
        })
        .await?
        .and_then(|v| serde_json::from_slice::<ClusterTiming>(&v).ok());
    if let Some(cluster) = recorded
        && policy == TimingPolicy::Replace
        && ours.job_timeout_sec < cluster.job_timeout_sec
    {
        let wait = Duration::from_secs(cluster.node_timeout_sec + 1);
        let nodes = beating(jobs, prefix, wait).await?;
        if !nodes.is_empty() {
            return Err(AgreementError::ShorterWhileRunning {
                cluster_sec: cluster.job_timeout_sec,
                ours_sec: ours.job_timeout_sec,
                nodes,
            });
        }
    }
    let (format, recorded) = jobs
        .db()
        .run(|tx: Tx| {
            let (format_key, timing_key) = (format_key.clone(), timing_key.clone());
            async move {
                let format = tx.get(&format_key, false).await?;
                if format.is_none() {
                    tx.set(&format_key, STORE_FORMAT.to_string().as_bytes());
                }
                let recorded = tx
                    .get(&timing_key, false)
                    .await?
                    .and_then(|v| serde_json::from_slice::<ClusterTiming>(&v).ok());
                if recorded.is_none() || policy == TimingPolicy::Replace {
                    let v = serde_json::to_vec(&ours).unwrap_or_default();
                    tx.set(&timing_key, &v);
                }
                Ok::<_, StoreError>((format, recorded))
            }
        })
        .await?;
    if let Some(v) = format {
        let text = String::from_utf8_lossy(&v).into_owned();
        let stored: u32 = text
            .trim()
            .parse()
            .map_err(|_| AgreementError::Unreadable(text))?;
        if stored > STORE_FORMAT {
            return Err(AgreementError::NewerFormat {
                stored,
                ours: STORE_FORMAT,
            });
        }
    }
    match (recorded, policy) {
        (Some(cluster), TimingPolicy::Adopt) if cluster != ours => {
            tracing::warn!(
                ours.job_timeout_sec,
                ours.node_timeout_sec,
                cluster.job_timeout_sec,
                cluster.node_timeout_sec,
                "this node's timing differs from the cluster's: using the cluster's \
                 ([replicator] cluster_timing = replace changes the cluster's)"
            );
            cluster.apply(settings);
        }
        (Some(cluster), TimingPolicy::Replace) if cluster != ours => {
            tracing::warn!(
                ours.job_timeout_sec,
                ours.node_timeout_sec,
                cluster.job_timeout_sec,
                cluster.node_timeout_sec,
                "replaced the cluster's timing with this node's: restart every other node"
            );
        }
        _ => {}
    }
    Ok(())
}

/// The replication nodes whose membership rows changed within `wait` (read twice).
async fn beating(jobs: &Jobs, prefix: &[u8], wait: Duration) -> Result<Vec<String>, StoreError> {
    let read = || {
        jobs.db()
            .run(|tx: Tx| async move { member_rows_tx(&tx, prefix).await })
    };
    let first = read().await?;
    tokio::time::sleep(wait).await;
    let second = read().await?;
    Ok(second
        .into_iter()
        .filter(|(_, row)| runs_replications(row))
        .filter(|(node, row)| !first.iter().any(|(n, r)| n == node && r == row))
        .map(|(node, _)| node.as_str().to_owned())
        .collect())
}
