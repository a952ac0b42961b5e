//! clustering: node membership in the store (the 000 draft's model), cluster stability
//! events, and dead-neighbour removal.
//!
//! Each node writes `(prefix, 55, "member", node) -> last heartbeat (ms, i64 LE)` every
//! `heartbeat` and bumps `(prefix, 55, "version")` (a versionstamped value) when it joins or
//! leaves or removes another node. A watcher task waits on the version key and tells the actor
//! ([`ClusterMsg::Changed`]); a membership different from the last one seen publishes
//! `{cluster, unstable}` and `{cluster, stable}` follows after `quiet_period` without change
//! (`start_period` for the first one). At every heartbeat a node checks its right-hand
//! neighbour in sorted order and removes it when its heartbeat is older than `dead_after`, so
//! each dead node is removed by exactly one live neighbour; the remover re-enqueues the dead
//! node's running jobs in the same transaction, and a node that finds itself removed stops
//! the jobs it still runs (the 000 draft's neighbour rules). Heartbeats never conflict with
//! each other (see [`Clustering::beat`]).
//!
//! Messages: `Changed`, `Heartbeat`, `Quiet(generation)` (own timers), `Members`, `IsStable`.
//! A graceful stop deregisters the node.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, ExitReason, Server};

use crate::jobs::JobsError;
use crate::jobs::job_data::decode_activity;
use crate::store::tuple::{self, Bytes};
use crate::store::{RangeOptions, Tx};

use super::context::{NODES, NodeCtx, ids};
use super::event_bus::{ClusterStatus, ReplicatorEvent};
use super::job_server::JobServerMsg;
use super::rep_job::REP_JOBS;

/// What one heartbeat found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    /// The right-hand neighbour this node removed as dead, and how many of its running
    /// jobs were re-enqueued with it.
    pub removed: Option<(String, usize)>,
    /// This node was not a member any more: a neighbour declared it dead (and re-enqueued
    /// its jobs), so the jobs still running here must stop.
    pub was_removed: bool,
}

/// Messages of the clustering actor.
#[derive(Debug)]
pub enum ClusterMsg {
    /// The membership version changed.
    Changed,
    /// Refresh our heartbeat, check the right-hand neighbour.
    Heartbeat,
    /// `quiet_period` elapsed since change number `generation`.
    Quiet(u64),
    /// The members, sorted.
    Members(RpcReplyPort<Vec<String>>),
    /// Whether the cluster is stable.
    IsStable(RpcReplyPort<bool>),
}

/// The clustering server.
#[derive(Debug, Clone)]
pub struct Clustering {
    /// The node context.
    pub ctx: NodeCtx,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// A node whose heartbeat is older than this is dead.
    pub dead_after: Duration,
    /// `cluster_quiet_period`.
    pub quiet_period: Duration,
    /// `cluster_start_period`.
    pub start_period: Duration,
}

impl Clustering {
    /// Timings from the node's settings: heartbeat a sixth of the couch_jobs activity
    /// timeout (≥ 1 s), dead after one activity timeout.
    pub fn from_ctx(ctx: NodeCtx) -> Self {
        let s = ctx.settings();
        let timeout = Duration::from_secs(s.job_timeout_sec);
        Self {
            heartbeat: (timeout / 6).max(Duration::from_secs(1)),
            dead_after: timeout,
            quiet_period: Duration::from_secs(s.cluster_quiet_period),
            start_period: Duration::from_secs(s.cluster_start_period),
            ctx,
        }
    }

    fn member_key(&self, node: &str) -> Vec<u8> {
        self.ctx
            .key(&(NODES, "member", Bytes::from(node.as_bytes())))
    }

    fn members_range(&self) -> (Vec<u8>, Vec<u8>) {
        let begin = self.ctx.key(&(NODES, "member"));
        let mut end = begin.clone();
        end.push(0xFF);
        (begin, end)
    }

    fn version_key(&self) -> Vec<u8> {
        self.ctx.key(&(NODES, "version"))
    }

    fn bump_version(&self, tx: &Tx) {
        let value = tuple::pack_with_versionstamp(&tuple::Versionstamp::incomplete(0));
        tx.set_versionstamped_value(&self.version_key(), &value);
    }

    /// The members at snapshot isolation: reading them never conflicts with heartbeats.
    async fn members_tx(&self, tx: &Tx) -> Result<Vec<(String, i64)>, JobsError> {
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
            out.push((name, beat));
        }
        Ok(out)
    }

    /// Members and heartbeats, sorted by name.
    pub async fn members(&self) -> Result<Vec<(String, i64)>, JobsError> {
        self.ctx
            .jobs()
            .db()
            .run(|tx| async move { self.members_tx(&tx).await })
            .await
    }

    /// One heartbeat: refresh our key, and remove the right-hand neighbour if it is dead,
    /// re-enqueueing its jobs in the same transaction (seed 000's neighbour rule).
    ///
    /// Conflict-free on FDB: the members are read at snapshot isolation and our heartbeat is
    /// a blind write, so the heartbeats of different nodes never conflict. The only read
    /// conflicts are on our own key (only a neighbour removing us writes it, and then we must
    /// see that) and, when removing, on the neighbour's key (if it beats meanwhile, the
    /// removal retries and finds it alive).
    pub async fn beat(&self, join: bool) -> Result<Beat, JobsError> {
        let now = self.ctx.jobs().clock().now_ms();
        let me = self.ctx.node().to_owned();
        let dead_ms = self.dead_after.as_millis() as i64;
        self.ctx
            .jobs()
            .db()
            .run(|tx| {
                let me = me.clone();
                async move {
                    let members = self.members_tx(&tx).await?;
                    let known = members.iter().any(|(n, _)| *n == me);
                    tx.add_read_conflict_key(&self.member_key(&me));
                    tx.set(&self.member_key(&me), &now.to_le_bytes());
                    if join || !known {
                        self.bump_version(&tx);
                    }
                    let mut beat = Beat {
                        removed: None,
                        was_removed: !join && !known,
                    };
                    // The right-hand neighbour in sorted order (wrapping), other than us.
                    let right = members
                        .iter()
                        .filter(|(n, _)| *n != me)
                        .find(|(n, _)| *n > me)
                        .or_else(|| members.iter().find(|(n, _)| *n != me));
                    if let Some((n, last)) = right
                        && now - last > dead_ms
                    {
                        tx.add_read_conflict_key(&self.member_key(n));
                        tx.clear(&self.member_key(n));
                        self.bump_version(&tx);
                        let requeued = self.requeue_jobs_of(&tx, n).await?;
                        beat.removed = Some((n.clone(), requeued));
                    }
                    Ok(beat)
                }
            })
            .await
    }

    /// Re-enqueues the running replication jobs last stamped by `node` (their data names
    /// the node that runs them), so they restart elsewhere now instead of after the
    /// activity timeout. The scan is a snapshot read; each re-enqueue conflicts only on
    /// its own job.
    async fn requeue_jobs_of(&self, tx: &Tx, node: &str) -> Result<usize, JobsError> {
        let jobs = self.ctx.jobs();
        let (b, e) = jobs.keys().activity_range(REP_JOBS);
        let rows = tx.get_range(&b, &e, RangeOptions::all().snapshot()).await?;
        let mut requeued = 0;
        for kv in rows {
            let Ok((id, data)) = decode_activity(&kv.value) else {
                continue;
            };
            let runs_there = data.get("node").and_then(|v| v.as_str()) == Some(node);
            if runs_there && jobs.requeue_running_tx(tx, REP_JOBS, &id).await? {
                requeued += 1;
            }
        }
        Ok(requeued)
    }

    async fn leave(&self) -> Result<(), JobsError> {
        let me = self.ctx.node().to_owned();
        self.ctx
            .jobs()
            .db()
            .run(|tx| {
                let me = me.clone();
                async move {
                    tx.clear(&self.member_key(&me));
                    self.bump_version(&tx);
                    Ok::<_, JobsError>(())
                }
            })
            .await
    }
}

/// The clustering actor's state.
pub struct ClusterState {
    members: Vec<String>,
    generation: u64,
    stable: bool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ClusterState {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn after(myself: &ActorRef<ClusterMsg>, d: Duration, msg: ClusterMsg) {
    let me = myself.clone();
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        let _ = me.send_message(msg);
    });
}

impl Server for Clustering {
    type Msg = ClusterMsg;
    type State = ClusterState;
    type Args = ();

    async fn init(&self, myself: ActorRef<ClusterMsg>, _: ()) -> Result<ClusterState, BoxError> {
        self.beat(true).await?;
        let watcher = {
            let me = myself.clone();
            let db = self.ctx.jobs().db().clone();
            let key = self.version_key();
            tokio::spawn(async move {
                loop {
                    let watch = db
                        .run(|tx| {
                            let key = key.clone();
                            async move {
                                let _ = tx.get(&key, false).await?;
                                Ok::<_, crate::store::StoreError>(tx.watch(&key))
                            }
                        })
                        .await;
                    let Ok(watch) = watch else {
                        return;
                    };
                    if watch.await.is_err() || me.send_message(ClusterMsg::Changed).is_err() {
                        return;
                    }
                }
            })
        };
        let beats = {
            let me = myself.clone();
            let period = self.heartbeat;
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    if me.send_message(ClusterMsg::Heartbeat).is_err() {
                        return;
                    }
                }
            })
        };
        let members = self.members().await?.into_iter().map(|(n, _)| n).collect();
        self.ctx
            .publish(ReplicatorEvent::Cluster(ClusterStatus::Unstable));
        after(&myself, self.start_period, ClusterMsg::Quiet(0));
        Ok(ClusterState {
            members,
            generation: 0,
            stable: false,
            tasks: vec![watcher, beats],
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ClusterMsg>,
        msg: ClusterMsg,
        state: &mut ClusterState,
    ) -> Result<(), BoxError> {
        match msg {
            ClusterMsg::Changed => {
                let now: Vec<String> = self.members().await?.into_iter().map(|(n, _)| n).collect();
                if now != state.members {
                    tracing::info!(node = self.ctx.node(), members = ?now, "cluster membership changed");
                    state.members = now;
                    state.generation += 1;
                    state.stable = false;
                    self.ctx
                        .publish(ReplicatorEvent::Cluster(ClusterStatus::Unstable));
                    after(
                        &myself,
                        self.quiet_period,
                        ClusterMsg::Quiet(state.generation),
                    );
                }
            }
            ClusterMsg::Heartbeat => {
                let beat = self.beat(false).await?;
                if let Some((dead, requeued)) = &beat.removed {
                    tracing::warn!(node = self.ctx.node(), %dead, requeued,
                        "removed dead neighbour and re-enqueued its jobs");
                }
                if beat.was_removed {
                    tracing::warn!(
                        node = self.ctx.node(),
                        "this node was removed as dead by a neighbour; stopping its jobs"
                    );
                    let _ = self
                        .ctx
                        .child::<JobServerMsg>(ids::JOB_SERVER)
                        .cast(JobServerMsg::StopAll);
                }
            }
            ClusterMsg::Quiet(generation) => {
                if generation == state.generation && !state.stable {
                    state.stable = true;
                    self.ctx
                        .publish(ReplicatorEvent::Cluster(ClusterStatus::Stable));
                }
            }
            ClusterMsg::Members(reply) => {
                let _ = reply.send(state.members.clone());
            }
            ClusterMsg::IsStable(reply) => {
                let _ = reply.send(state.stable);
            }
        }
        Ok(())
    }

    async fn terminate(&self, _: ActorRef<ClusterMsg>, state: ClusterState, reason: ExitReason) {
        drop(state);
        if reason != ExitReason::Normal && !matches!(reason, ExitReason::Shutdown) {
            return;
        }
        if let Err(e) = self.leave().await {
            tracing::warn!(error = %e, "could not deregister the node");
        }
    }
}
