//! clustering: the actor that keeps this node's membership alive (the rows and the
//! transactions are [`super::membership`]'s), cluster stability events, and the couch_workers RFC draft's
//! neighbour rules.
//!
//! Each node heart-beats every `heartbeat`. A watcher task waits on the version key and tells the actor
//! ([`ClusterMsg::Changed`]); a membership different from the last one seen publishes
//! `{cluster, unstable}` and `{cluster, stable}` follows after `quiet_period` without change
//! (`start_period` for the first one). At every heartbeat a node checks its right-hand
//! neighbour in sorted order and removes it when its row has not changed for `dead_after` as
//! this node saw it (`super::sightings`: no wall clock is compared across nodes), so
//! each dead node is removed by exactly one live neighbour; the remover re-enqueues the dead
//! node's running jobs in the same transaction, and a node that finds itself removed stops
//! the jobs it still runs (the couch_workers RFC draft's neighbour rules; docs/architecture.md, "Sources"). Heartbeats never conflict with
//! each other (see [`Membership::beat_tx`]).
//!
//! Messages: `Changed`, `Heartbeat`, `Quiet(generation)` (own timers), `Observe`.
//! Joining re-enqueues the jobs an earlier run under the same name left running; a graceful
//! stop deregisters the node.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, ExitReason, Observable, Server};

use super::membership::{Membership, REQUEUE_PER_TRANSACTION};
use crate::replicator::node::child_id::ChildId;
use crate::replicator::node::context::NodeCtx;
use crate::replicator::node::event_bus::{ClusterStatus, ReplicatorEvent};
use crate::replicator::node::name::NodeName;
use crate::replicator::scheduler::census;
use crate::replicator::scheduler::job_server::{JOB_SERVER, JobServerMsg};

/// Node membership, a child of the tree.
pub(crate) const CLUSTERING: ChildId<ClusterMsg> = ChildId::new("clustering");

/// Messages of the clustering actor.
#[derive(Debug)]
pub enum ClusterMsg {
    /// The membership version changed.
    Changed,
    /// Refresh our heartbeat, check the right-hand neighbour.
    Heartbeat,
    /// `quiet_period` elapsed since change number `generation`.
    Quiet(u64),
    /// The actor's view of the cluster.
    Observe(RpcReplyPort<ClusteringObservation>),
    /// The node is stopping: leave the membership now and beat no more, so the other nodes
    /// count it out (and open acceptors for its jobs) before it hands its jobs back; answers
    /// once the row is gone (or could not be removed).
    Leave(RpcReplyPort<()>),
}

/// What [`ClusterMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClusteringObservation {
    /// This node.
    pub node: NodeName,
    /// The members at the last membership change this node saw, sorted.
    pub members: Vec<NodeName>,
    /// Whether the cluster is stable (no change for the quiet period).
    pub stable: bool,
    /// Membership changes seen since this actor started.
    pub changes: u64,
    /// Dead neighbours this node removed, oldest first.
    pub removed: Vec<NodeName>,
    /// How often this node refreshes its heartbeat.
    pub heartbeat: Duration,
    /// `cluster_quiet_period`.
    pub quiet_period: Duration,
}

impl Observable for ClusterMsg {
    type Observation = ClusteringObservation;
    fn observe(reply: RpcReplyPort<ClusteringObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// The clustering server.
#[derive(Debug, Clone)]
pub(crate) struct Clustering {
    /// The node context.
    pub ctx: NodeCtx,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// `cluster_quiet_period`.
    pub quiet_period: Duration,
    /// `cluster_start_period`.
    pub start_period: Duration,
    /// The membership rows.
    pub membership: Membership,
}

impl Clustering {
    /// Timings from the node's settings: heartbeat a sixth of the node timeout (≥ 1 s),
    /// dead after one node timeout (`node_timeout`, at most the activity timeout).
    pub(crate) fn from_ctx(ctx: NodeCtx) -> Self {
        let s = ctx.settings();
        let timeout = s.node_timeout();
        let membership = Membership::new(ctx.jobs().clone(), ctx.prefix(), ctx.node(), timeout)
            .with_replication(s.runs(crate::NodeType::Replication))
            .with_sightings(ctx.sightings().clone());
        Self {
            heartbeat: (timeout / 6).max(Duration::from_secs(1)),
            quiet_period: s.cluster_quiet_period,
            start_period: s.cluster_start_period,
            membership,
            ctx,
        }
    }
}

/// The clustering actor's state.
pub(crate) struct ClusterState {
    members: Vec<NodeName>,
    generation: u64,
    stable: bool,
    removed: Vec<NodeName>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Left the membership ([`ClusterMsg::Leave`]): heartbeats would join again.
    left: bool,
}

impl Drop for ClusterState {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Clustering {
    fn census(&self) -> tokio::task::JoinHandle<()> {
        census::spawn(
            self.ctx.census().clone(),
            self.ctx.jobs().clone(),
            self.ctx.node().clone(),
            self.ctx.settings().interval,
        )
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
        let began = tokio::time::Instant::now();
        self.membership.beat(true).await?;
        self.ctx.node_lease().renew(began);
        // This node's job server starts after this actor, so a job the store shows running
        // here was left by an earlier run under the same name (killed, then restarted before
        // a neighbour removed it): its row beats again, so no neighbour ever will, and the
        // job would wait for the activity timeout (61-91 s; the failover drill saw it).
        let left = self.membership.requeue_rest_of(self.ctx.node()).await?;
        if left > 0 {
            tracing::info!(node = %self.ctx.node(), jobs = left,
                "re-enqueued the jobs an earlier run of this node left running");
        }
        let watcher = {
            let me = myself.clone();
            let db = self.ctx.jobs().db().clone();
            let key = self.membership.version_key();
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
        let members = self
            .membership
            .members()
            .await?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        self.ctx
            .publish(ReplicatorEvent::Cluster(ClusterStatus::Unstable));
        after(&myself, self.start_period, ClusterMsg::Quiet(0));
        Ok(ClusterState {
            members,
            generation: 0,
            stable: false,
            removed: Vec::new(),
            left: false,
            // The count of the cluster's jobs `/metrics` shows runs here, on every kind of
            // node, for as long as the node takes part in the cluster.
            tasks: vec![watcher, beats, self.census()],
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
                let now: Vec<NodeName> = self
                    .membership
                    .members()
                    .await?
                    .into_iter()
                    .map(|(n, _)| n)
                    .collect();
                if now != state.members {
                    tracing::info!(node = %self.ctx.node(), members = ?now, "cluster membership changed");
                    state.members = now;
                    state.generation += 1;
                    state.stable = false;
                    self.ctx
                        .publish(ReplicatorEvent::Cluster(ClusterStatus::Unstable));
                    let _ = self
                        .ctx
                        .child(JOB_SERVER)
                        .cast(JobServerMsg::MembersChanged);
                    after(
                        &myself,
                        self.quiet_period,
                        ClusterMsg::Quiet(state.generation),
                    );
                }
            }
            ClusterMsg::Heartbeat if state.left => {}
            ClusterMsg::Leave(reply) => {
                state.left = true;
                match self.membership.leave().await {
                    // Out of the membership, no neighbour removes this node: its jobs keep
                    // their locks until they hand them back, without heartbeats.
                    Ok(()) => self.ctx.node_lease().hold(),
                    Err(e) => tracing::warn!(error = %e, "could not leave the membership"),
                }
                let _ = reply.send(());
            }
            ClusterMsg::Heartbeat => {
                let began = tokio::time::Instant::now();
                let beat = self.membership.beat(false).await?;
                self.ctx.node_lease().renew(began);
                if let Some((dead, requeued)) = &beat.removed {
                    let mut requeued = *requeued;
                    if requeued == REQUEUE_PER_TRANSACTION {
                        requeued += self.membership.requeue_rest_of(dead).await?;
                    }
                    tracing::warn!(node = %self.ctx.node(), %dead, requeued,
                        "removed dead neighbour and re-enqueued its jobs");
                    state.removed.push(dead.clone());
                }
                if beat.was_removed {
                    tracing::warn!(
                        node = %self.ctx.node(),
                        "this node was removed as dead by a neighbour; stopping its jobs"
                    );
                    let _ = self.ctx.child(JOB_SERVER).cast(JobServerMsg::StopAll);
                }
            }
            ClusterMsg::Quiet(generation) => {
                if generation == state.generation && !state.stable {
                    state.stable = true;
                    self.ctx
                        .publish(ReplicatorEvent::Cluster(ClusterStatus::Stable));
                }
            }
            ClusterMsg::Observe(reply) => {
                let _ = reply.send(ClusteringObservation {
                    node: self.ctx.node().clone(),
                    members: state.members.clone(),
                    stable: state.stable,
                    changes: state.generation,
                    removed: state.removed.clone(),
                    heartbeat: self.heartbeat,
                    quiet_period: self.quiet_period,
                });
            }
        }
        Ok(())
    }

    async fn terminate(&self, _: ActorRef<ClusterMsg>, state: ClusterState, reason: ExitReason) {
        drop(state);
        if reason != ExitReason::Normal && !matches!(reason, ExitReason::Shutdown) {
            return;
        }
        if let Err(e) = self.membership.forget().await {
            tracing::warn!(error = %e, "could not deregister the node");
        }
    }
}
