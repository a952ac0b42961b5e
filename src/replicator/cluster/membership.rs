//! Node membership in the store (the couch_workers RFC draft's model; docs/architecture.md, "Sources"), as transactions the clustering actor
//! runs: heartbeats, the dead right-hand neighbour check and the neighbour rules.
//!
//! Each node writes `(prefix, 55, "member", node) -> last heartbeat (ms, i64 LE)`, then one
//! byte saying whether it runs replications (1) or only the API (0; rows without it run
//! replications), and bumps
//! `(prefix, 55, "version")` (a versionstamped value) when it joins, leaves or removes
//! another node. Heartbeats never conflict with each other (see [`Membership::beat_tx`]).

use crate::replicator::node::name::NodeName;
use std::time::Duration;

use crate::jobs::job_data::decode_activity;
use crate::jobs::{Jobs, JobsError};
use crate::store::tuple::{self, Bytes};
use crate::store::{RangeOptions, Tx};

use crate::replicator::job::view::{self, REP_JOBS};
use crate::replicator::node::context::NODES;

/// What one heartbeat found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    /// The right-hand neighbour this node removed as dead, and how many of its running
    /// jobs were re-enqueued with it.
    pub removed: Option<(NodeName, usize)>,
    /// This node was not a member any more: a neighbour declared it dead (and re-enqueued
    /// its jobs), so the jobs still running here must stop.
    pub was_removed: bool,
}

/// A dead node's jobs re-enqueued per transaction at most: each takes three writes and a
/// compare, and etcd refuses a `Txn` of more than 128 operations (FoundationDB's limits are
/// far larger, but one huge transaction would also be slow to retry there).
pub const REQUEUE_PER_TRANSACTION: usize = 25;

/// One node's view of the membership rows.
#[derive(Debug, Clone)]
pub struct Membership {
    jobs: Jobs,
    prefix: Vec<u8>,
    node: NodeName,
    dead_after: Duration,
    /// This node runs replication jobs (not only the API).
    replication: bool,
}

impl Membership {
    /// `node`'s membership under the layer `prefix`; a member whose heartbeat is older than
    /// `dead_after` is dead.
    pub fn new(jobs: Jobs, prefix: &[u8], node: &NodeName, dead_after: Duration) -> Self {
        Self {
            jobs,
            prefix: prefix.to_vec(),
            node: node.clone(),
            dead_after,
            replication: true,
        }
    }

    /// Whether this node runs replication jobs (the default) or only the API: the job
    /// servers spread the jobs over the members that run them.
    pub fn with_replication(mut self, replication: bool) -> Self {
        self.replication = replication;
        self
    }

    /// The members that run replication jobs and beat within `dead_after` of `now_ms`,
    /// sorted by name, at snapshot isolation.
    pub(crate) async fn workers_tx(
        &self,
        tx: &Tx,
        now_ms: i64,
    ) -> Result<Vec<NodeName>, JobsError> {
        let (b, e) = self.members_range();
        let rows = tx.get_range(&b, &e, RangeOptions::all().snapshot()).await?;
        let dead_ms = self.dead_after.as_millis() as i64;
        let mut out = Vec::with_capacity(rows.len());
        for kv in rows {
            let runs_jobs = kv.value.get(8).is_none_or(|flag| *flag != 0);
            let beat = kv
                .value
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, i64::from_le_bytes);
            if !runs_jobs || now_ms - beat > dead_ms {
                continue;
            }
            let name = kv
                .key
                .strip_prefix(b.as_slice())
                .and_then(|rest| tuple::unpack::<(Bytes,)>(rest).ok())
                .and_then(|(name,)| String::from_utf8(name.into_owned()).ok())
                .map(NodeName::from);
            out.extend(name);
        }
        Ok(out)
    }

    fn key<T: tuple::TuplePack>(&self, t: &T) -> Vec<u8> {
        let mut k = self.prefix.clone();
        tuple::pack_into(t, &mut k);
        k
    }

    /// The membership row of `node`.
    pub fn member_key(&self, node: &NodeName) -> Vec<u8> {
        self.key(&(NODES, "member", Bytes::from(node.as_str().as_bytes())))
    }

    fn members_range(&self) -> (Vec<u8>, Vec<u8>) {
        let begin = self.key(&(NODES, "member"));
        let mut end = begin.clone();
        end.push(0xFF);
        (begin, end)
    }

    /// The key whose value changes whenever the membership does (watched by the actor).
    pub(crate) fn version_key(&self) -> Vec<u8> {
        self.key(&(NODES, "version"))
    }

    fn bump_version(&self, tx: &Tx) {
        let value = tuple::pack_with_versionstamp(&tuple::Versionstamp::incomplete(0));
        tx.set_versionstamped_value(&self.version_key(), &value);
    }

    /// The members at snapshot isolation: reading them never conflicts with heartbeats.
    pub(crate) async fn members_tx(&self, tx: &Tx) -> Result<Vec<(NodeName, i64)>, JobsError> {
        let (b, e) = self.members_range();
        let rows = tx.get_range(&b, &e, RangeOptions::all().snapshot()).await?;
        let mut out = Vec::with_capacity(rows.len());
        for kv in rows {
            let Some(rest) = kv.key.strip_prefix(b.as_slice()) else {
                continue;
            };
            let Ok((name,)) = tuple::unpack::<(Bytes,)>(rest) else {
                continue;
            };
            let Ok(name) = String::from_utf8(name.into_owned()) else {
                continue;
            };
            let beat = kv
                .value
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, i64::from_le_bytes);
            out.push((NodeName::from(name), beat));
        }
        Ok(out)
    }

    /// Members and heartbeats, sorted by name.
    pub async fn members(&self) -> Result<Vec<(NodeName, i64)>, JobsError> {
        self.jobs
            .db()
            .run(|tx| async move { self.members_tx(&tx).await })
            .await
    }

    /// One heartbeat at `now_ms`: refresh our key, and remove the right-hand neighbour in
    /// sorted order if it is dead, re-enqueueing its jobs in the same transaction (the
    /// couch_workers RFC draft's neighbour rule, so each dead node is removed by exactly one live neighbour).
    ///
    /// Conflict-free on FDB: the members are read at snapshot isolation and our heartbeat is
    /// a blind write, so the heartbeats of different nodes never conflict. The only read
    /// conflicts are on our own key (only a neighbour removing us writes it, and then we must
    /// see that) and, when removing, on the neighbour's key (if it beats meanwhile, the
    /// removal retries and finds it alive).
    pub async fn beat_tx(&self, tx: &Tx, now_ms: i64, join: bool) -> Result<Beat, JobsError> {
        let me = &self.node;
        let members = self.members_tx(tx).await?;
        let known = members.iter().any(|(n, _)| n == me);
        tx.add_read_conflict_key(&self.member_key(me));
        let mut row = now_ms.to_le_bytes().to_vec();
        row.push(u8::from(self.replication));
        tx.set(&self.member_key(me), &row);
        if join || !known {
            self.bump_version(tx);
        }
        let mut beat = Beat {
            removed: None,
            was_removed: !join && !known,
        };
        // The right-hand neighbour in sorted order (wrapping), other than us.
        let right = members
            .iter()
            .filter(|(n, _)| n != me)
            .find(|(n, _)| n > me)
            .or_else(|| members.iter().find(|(n, _)| n != me));
        let dead_ms = self.dead_after.as_millis() as i64;
        if let Some((n, last)) = right
            && now_ms - last > dead_ms
        {
            tx.add_read_conflict_key(&self.member_key(n));
            tx.clear(&self.member_key(n));
            self.bump_version(tx);
            let requeued = self.requeue_jobs_of(tx, n, REQUEUE_PER_TRANSACTION).await?;
            beat.removed = Some((n.clone(), requeued));
        }
        Ok(beat)
    }

    /// [`Membership::beat_tx`] in its own retried transaction, at the jobs clock's now.
    pub async fn beat(&self, join: bool) -> Result<Beat, JobsError> {
        let now = self.jobs.clock().now_ms();
        self.jobs
            .db()
            .run(|tx| async move { self.beat_tx(&tx, now, join).await })
            .await
    }

    /// Re-enqueues the rest of a removed node's running jobs, [`REQUEUE_PER_TRANSACTION`]
    /// per transaction (the heartbeat that removed it took the first ones). Returns how many.
    pub async fn requeue_rest_of(&self, node: &NodeName) -> Result<usize, JobsError> {
        let mut total = 0;
        loop {
            let n = self
                .jobs
                .db()
                .run(|tx| async move {
                    self.requeue_jobs_of(&tx, node, REQUEUE_PER_TRANSACTION)
                        .await
                })
                .await?;
            total += n;
            if n < REQUEUE_PER_TRANSACTION {
                return Ok(total);
            }
        }
    }

    /// Re-enqueues up to `limit` running replication jobs last stamped by `node` (their
    /// data names the node that runs them), so they restart elsewhere now instead of after
    /// the activity timeout. The scan is a snapshot read; each re-enqueue conflicts only on
    /// its own job.
    async fn requeue_jobs_of(
        &self,
        tx: &Tx,
        node: &NodeName,
        limit: usize,
    ) -> Result<usize, JobsError> {
        let (b, e) = self.jobs.keys().activity_range(REP_JOBS);
        let rows = tx.get_range(&b, &e, RangeOptions::all().snapshot()).await?;
        let mut requeued = 0;
        for kv in rows {
            let Ok((id, data)) = decode_activity(&kv.value) else {
                continue;
            };
            let runs_there = view::running_node(&data) == Some(node.as_str());
            if runs_there && self.jobs.requeue_running_tx(tx, REP_JOBS, &id).await? {
                requeued += 1;
                if requeued == limit {
                    break;
                }
            }
        }
        Ok(requeued)
    }

    /// Deregisters this node (graceful stop).
    pub async fn leave(&self) -> Result<(), JobsError> {
        self.jobs
            .db()
            .run(|tx| async move {
                tx.clear(&self.member_key(&self.node));
                self.bump_version(&tx);
                Ok::<_, JobsError>(())
            })
            .await
    }
}
