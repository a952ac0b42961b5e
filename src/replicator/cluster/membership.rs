//! Node membership in the store (the couch_workers RFC draft's model; docs/architecture.md, "Sources"), as transactions the clustering actor
//! runs: heartbeats, the dead right-hand neighbour check and the neighbour rules.
//!
//! Each node writes `(prefix, 55, "member", node) -> last heartbeat (ms, i64 LE)`, then one
//! byte saying whether it runs replications (1) or only the API (0; rows without it run
//! replications), then its beat count (u64 LE; older rows lack it), then its own node timeout
//! (ms, u64 LE; older rows lack it). Whether a member is alive is judged by whether its row
//! changed lately as this process saw it ([`Sightings`]), never by comparing its written time
//! with the reader's clock; and a member is given at least its *own* node timeout, since its
//! lease (which stops its jobs) runs on that: a node started with a longer timeout than its
//! neighbours', or not yet restarted after the cluster's timing was replaced, is never
//! removed while it may still run its jobs; `(prefix, 55, "load", node) -> jobs it runs (u64 LE)` as its job server last
//! reported them (read by every node's balance, so that it reads one row per node instead of
//! one per running job); and bumps
//! `(prefix, 55, "version")` (a versionstamped value) when it joins, leaves or removes
//! another node. Heartbeats never conflict with each other (see [`Membership::beat_tx`]).

use crate::replicator::node::name::NodeName;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::jobs::job_data::decode_activity;
use crate::jobs::{Jobs, JobsError};
use crate::store::tuple::{self, Bytes};
use crate::store::{RangeOptions, StoreError, Tx};

use crate::replicator::job::view::{self, REP_JOBS};
use crate::replicator::node::context::NODES;

use super::sightings::Sightings;

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

/// Whether the node of a membership row runs replications (rows without the flag do).
pub(crate) fn runs_replications(row: &[u8]) -> bool {
    row.get(8).is_none_or(|flag| *flag != 0)
}

/// Every member's row under the layer `prefix`, by name, at snapshot isolation (no node's
/// view needed: the agreement reads them before the node joins).
pub(crate) async fn member_rows_tx(
    tx: &Tx,
    prefix: &[u8],
) -> Result<Vec<(NodeName, Vec<u8>)>, StoreError> {
    let mut b = prefix.to_vec();
    tuple::pack_into(&(NODES, "member"), &mut b);
    let mut e = b.clone();
    e.push(0xFF);
    let rows = tx.get_range(&b, &e, RangeOptions::all().snapshot()).await?;
    Ok(rows
        .into_iter()
        .filter_map(|kv| Some((Membership::node_of(&b, &kv.key)?, kv.value)))
        .collect())
}

/// One node's view of the membership rows.
#[derive(Debug, Clone)]
pub struct Membership {
    jobs: Jobs,
    prefix: Vec<u8>,
    node: NodeName,
    dead_after: Duration,
    /// This node runs replication jobs (not only the API).
    replication: bool,
    /// When each member's row last changed, as this process saw it.
    sightings: Arc<Sightings>,
    /// This node's beats so far (in its row, so that every beat changes it).
    beats: Arc<AtomicU64>,
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
            sightings: Arc::default(),
            beats: Arc::default(),
        }
    }

    /// The couch_jobs handle these rows live beside.
    pub(crate) fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// Judges liveness by `sightings` (shared by every view this process has of the
    /// membership, so a view made anew still knows how long each row stood still).
    pub fn with_sightings(mut self, sightings: Arc<Sightings>) -> Self {
        self.sightings = sightings;
        self
    }

    /// Whether this node runs replication jobs (the default) or only the API: the job
    /// servers spread the jobs over the members that run them.
    pub fn with_replication(mut self, replication: bool) -> Self {
        self.replication = replication;
        self
    }

    /// The members that run replication jobs and whose rows changed within `dead_after`
    /// (as this process saw them), sorted by name, at snapshot isolation.
    pub(crate) async fn workers_tx(&self, tx: &Tx) -> Result<Vec<NodeName>, JobsError> {
        let (b, e) = self.members_range();
        let rows = tx.get_range(&b, &e, RangeOptions::all().snapshot()).await?;
        let mut out = Vec::with_capacity(rows.len());
        for kv in rows {
            let runs_jobs = runs_replications(&kv.value);
            let Some(node) = Self::node_of(&b, &kv.key) else {
                continue;
            };
            if runs_jobs && self.sightings.silent_for(&node, &kv.value) <= self.allowed(&kv.value) {
                out.push(node);
            }
        }
        Ok(out)
    }

    /// How long a member whose row is `row` may stay silent: our node timeout, or the
    /// member's own when its row says it is longer.
    fn allowed(&self, row: &[u8]) -> Duration {
        let own = row
            .get(17..25)
            .and_then(|b| b.try_into().ok())
            .map(|b| Duration::from_millis(u64::from_le_bytes(b)));
        own.map_or(self.dead_after, |own| own.max(self.dead_after))
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
        self.rows_range("member")
    }

    /// The rows of one kind (`member`, `load`), one per node.
    fn rows_range(&self, kind: &str) -> (Vec<u8>, Vec<u8>) {
        let begin = self.key(&(NODES, kind));
        let mut end = begin.clone();
        end.push(0xFF);
        (begin, end)
    }

    /// The node a row of the range starting at `begin` belongs to.
    fn node_of(begin: &[u8], key: &[u8]) -> Option<NodeName> {
        let rest = key.strip_prefix(begin)?;
        let (name,) = tuple::unpack::<(Bytes,)>(rest).ok()?;
        String::from_utf8(name.into_owned())
            .ok()
            .map(NodeName::from)
    }

    /// The load row of `node`.
    fn load_key(&self, node: &NodeName) -> Vec<u8> {
        self.key(&(NODES, "load", Bytes::from(node.as_str().as_bytes())))
    }

    /// Reports that this node runs `running` jobs: a blind write of its own row, so it
    /// conflicts with nothing.
    pub(crate) fn report_load_tx(&self, tx: &Tx, running: usize) {
        tx.set(&self.load_key(&self.node), &(running as u64).to_le_bytes());
    }

    /// The jobs each node last reported running, at snapshot isolation (rows of nodes that
    /// left or were removed are gone; a member that never reported has none).
    pub(crate) async fn loads_tx(&self, tx: &Tx) -> Result<BTreeMap<NodeName, usize>, JobsError> {
        let (b, e) = self.rows_range("load");
        let rows = tx.get_range(&b, &e, RangeOptions::all().snapshot()).await?;
        Ok(rows
            .into_iter()
            .filter_map(|kv| {
                let n = kv.value.get(..8)?.try_into().ok().map(u64::from_le_bytes)?;
                Some((Self::node_of(&b, &kv.key)?, n as usize))
            })
            .collect())
    }

    /// The key whose value changes whenever the membership does (watched by the actor).
    pub(crate) fn version_key(&self) -> Vec<u8> {
        self.key(&(NODES, "version"))
    }

    fn bump_version(&self, tx: &Tx) {
        let value = tuple::pack_with_versionstamp(&tuple::Versionstamp::incomplete(0));
        tx.set_versionstamped_value(&self.version_key(), &value);
    }

    /// The members and their rows at snapshot isolation: reading them never conflicts
    /// with heartbeats.
    async fn member_rows_tx(&self, tx: &Tx) -> Result<Vec<(NodeName, Vec<u8>)>, JobsError> {
        Ok(member_rows_tx(tx, &self.prefix).await?)
    }

    /// The members and the time each last wrote in its row (its own clock: shown, never
    /// compared), at snapshot isolation.
    pub(crate) async fn members_tx(&self, tx: &Tx) -> Result<Vec<(NodeName, i64)>, JobsError> {
        let rows = self.member_rows_tx(tx).await?;
        Ok(rows
            .into_iter()
            .map(|(name, row)| {
                let beat = row
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, i64::from_le_bytes);
                (name, beat)
            })
            .collect())
    }

    /// Members and heartbeats, sorted by name.
    pub async fn members(&self) -> Result<Vec<(NodeName, i64)>, JobsError> {
        self.jobs
            .db()
            .run(|tx| async move { self.members_tx(&tx).await })
            .await
    }

    /// One heartbeat at `now_ms` (written, for people to read): refresh our key, and remove
    /// the right-hand neighbour in sorted order if its row has not changed for `dead_after`
    /// as this process saw it, re-enqueueing its jobs in the same transaction (the
    /// couch_workers RFC draft's neighbour rule, so each dead node is removed by exactly one live neighbour).
    ///
    /// Conflict-free on FDB: the members are read at snapshot isolation and our heartbeat is
    /// a blind write, so the heartbeats of different nodes never conflict. The only read
    /// conflicts are on our own key (only a neighbour removing us writes it, and then we must
    /// see that) and, when removing, on the neighbour's key (if it beats meanwhile, the
    /// removal retries and finds it alive).
    pub async fn beat_tx(&self, tx: &Tx, now_ms: i64, join: bool) -> Result<Beat, JobsError> {
        let me = &self.node;
        let rows = self.member_rows_tx(tx).await?;
        // Each member with how long it has been silent, and how long it may be.
        let members: Vec<(NodeName, Duration, Duration)> = rows
            .iter()
            .map(|(n, row)| {
                (
                    n.clone(),
                    self.sightings.silent_for(n, row),
                    self.allowed(row),
                )
            })
            .collect();
        let present: Vec<NodeName> = rows.into_iter().map(|(n, _)| n).collect();
        self.sightings.keep_only(&present);
        let known = members.iter().any(|(n, _, _)| n == me);
        tx.add_read_conflict_key(&self.member_key(me));
        let mut row = now_ms.to_le_bytes().to_vec();
        row.push(u8::from(self.replication));
        row.extend_from_slice(&self.beats.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        row.extend_from_slice(&(self.dead_after.as_millis() as u64).to_le_bytes());
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
            .filter(|(n, _, _)| n != me)
            .find(|(n, _, _)| n > me)
            .or_else(|| members.iter().find(|(n, _, _)| n != me));
        if let Some((n, silent, allowed)) = right
            && silent > allowed
        {
            tx.add_read_conflict_key(&self.member_key(n));
            tx.clear(&self.member_key(n));
            tx.clear(&self.load_key(n));
            self.bump_version(tx);
            let requeued = self.requeue_jobs_of(tx, n, REQUEUE_PER_TRANSACTION).await?;
            beat.removed = Some((n.clone(), requeued));
        }
        Ok(beat)
    }

    /// [`Membership::beat_tx`] in its own retried transaction, at this machine's own time
    /// (not the corrected jobs clock: the rows are what the correction is taken from).
    pub async fn beat(&self, join: bool) -> Result<Beat, JobsError> {
        let now = self
            .sightings
            .local_ms()
            .unwrap_or_else(|| self.jobs.clock().now_ms());
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

    /// Takes this node out of the membership at the start of a graceful stop. Its load row
    /// stays: the other nodes count the jobs it still runs in the cluster's total, so they
    /// make room for them before they are handed back, not after (a rolling restart's jobs
    /// waited for the stopped node to come back, 2.6 s, when nobody had room).
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

    /// Deregisters this node for good once its jobs are handed back: membership and load
    /// rows. (A node stopped between [`Self::leave`] and this keeps its load row until it
    /// starts again.)
    pub async fn forget(&self) -> Result<(), JobsError> {
        self.jobs
            .db()
            .run(|tx| async move {
                tx.clear(&self.member_key(&self.node));
                tx.clear(&self.load_key(&self.node));
                self.bump_version(&tx);
                Ok::<_, JobsError>(())
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::JobsOptions;
    use crate::store::Db;
    use crate::store::memory::MemoryStore;
    use std::sync::Arc;

    fn members(names: &[&str], dead_after: Duration) -> (Jobs, Vec<Membership>) {
        let options = JobsOptions::default();
        let prefix = options.prefix.clone();
        let jobs = Jobs::new(Db::new(Arc::new(MemoryStore::new())), options);
        let nodes = names
            .iter()
            .map(|n| Membership::new(jobs.clone(), &prefix, &(*n).into(), dead_after))
            .collect();
        (jobs, nodes)
    }

    async fn report(m: &Membership, running: usize) {
        let db = m.jobs.db();
        db.run(|tx| async move {
            m.report_load_tx(&tx, running);
            Ok::<_, JobsError>(())
        })
        .await
        .unwrap();
    }

    async fn loads(m: &Membership) -> BTreeMap<NodeName, usize> {
        let db = m.jobs.db();
        db.run(|tx| async move { m.loads_tx(&tx).await })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn each_node_reports_its_load_in_one_row_that_forgetting_clears() {
        let (_jobs, nodes) = members(&["a", "b"], Duration::from_secs(30));
        for m in &nodes {
            m.beat(true).await.unwrap();
        }
        report(&nodes[0], 7).await;
        report(&nodes[1], 3).await;
        report(&nodes[1], 4).await;
        let seen = loads(&nodes[0]).await;
        assert_eq!(seen, [("a".into(), 7), ("b".into(), 4)].into());
        nodes[1].leave().await.unwrap();
        assert_eq!(
            loads(&nodes[0]).await,
            [("a".into(), 7), ("b".into(), 4)].into(),
            "counted while its jobs are handed back"
        );
        nodes[1].forget().await.unwrap();
        assert_eq!(loads(&nodes[0]).await, [("a".into(), 7)].into());
    }

    #[tokio::test(start_paused = true)]
    async fn removing_a_dead_neighbour_clears_its_load() {
        let (_jobs, nodes) = members(&["a", "b"], Duration::from_secs(10));
        for m in &nodes {
            m.beat(true).await.unwrap();
            report(m, 5).await;
        }
        // "a" sees b's row, then b stops beating: once a has seen it unchanged for
        // `dead_after`, a removes it.
        assert_eq!(nodes[0].beat(false).await.unwrap().removed, None);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            nodes[0].beat(false).await.unwrap().removed,
            None,
            "not past it"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let beat = nodes[0].beat(false).await.unwrap();
        assert_eq!(beat.removed, Some(("b".into(), 0)));
        assert_eq!(loads(&nodes[0]).await, [("a".into(), 5)].into());
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_with_a_longer_node_timeout_is_given_its_own() {
        let options = JobsOptions::default();
        let prefix = options.prefix.clone();
        let jobs = Jobs::new(Db::new(Arc::new(MemoryStore::new())), options);
        let a = Membership::new(jobs.clone(), &prefix, &"a".into(), Duration::from_secs(10));
        // b runs with 30 s (not restarted since the cluster's timing was replaced): its
        // lease stops its jobs only after 24 s, so a must not remove it at 10 s.
        let b = Membership::new(jobs.clone(), &prefix, &"b".into(), Duration::from_secs(30));
        a.beat(true).await.unwrap();
        b.beat(true).await.unwrap();
        assert_eq!(a.beat(false).await.unwrap().removed, None);
        tokio::time::advance(Duration::from_secs(25)).await;
        assert_eq!(
            a.beat(false).await.unwrap().removed,
            None,
            "within b's own 30 s"
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(a.beat(false).await.unwrap().removed, Some(("b".into(), 0)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_far_ahead_or_behind_never_makes_a_beating_member_dead() {
        let (jobs, nodes) = members(&["a", "b"], Duration::from_secs(10));
        let db = jobs.db();
        let now = jobs.clock().now_ms();
        // a's wall clock runs 90 s ahead, b's an hour behind; both beat every 5 s.
        for round in 0..10 {
            for (m, skew) in nodes.iter().zip([90_000, -3_600_000]) {
                let at = now + skew + round * 5_000;
                let beat = db
                    .run(|tx| async move { m.beat_tx(&tx, at, round == 0).await })
                    .await
                    .unwrap();
                assert_eq!(beat.removed, None, "round {round}");
                assert!(!beat.was_removed, "round {round}");
            }
            tokio::time::advance(Duration::from_secs(5)).await;
        }
        // A beat count in the row: even a clock that stands still changes it.
        for _ in 0..3 {
            let beat = db
                .run(|tx| {
                    let b = &nodes[1];
                    async move { b.beat_tx(&tx, now, false).await }
                })
                .await
                .unwrap();
            assert_eq!(beat.removed, None);
            tokio::time::advance(Duration::from_secs(6)).await;
            let a = &nodes[0];
            let beat = db
                .run(|tx| async move { a.beat_tx(&tx, now, false).await })
                .await
                .unwrap();
            assert_eq!(beat.removed, None, "b beats with a frozen clock");
        }
    }
}
