//! What every actor of one node's replicator tree shares: the couch_jobs handle, the
//! settings, the node's name and uuid, the layer prefix for the replicator's own keys, and a
//! lookup of the tree's children, the node's metrics (so later children reach earlier ones through the
//! supervisor, and always the current instance after a restart).

use crate::replicator::cluster::sightings::Sightings;
use std::sync::Arc;

use supervisors::{ChildHandle, Children};

use crate::jobs::Jobs;
use crate::replication::http::budget::ResponseBudget;
use crate::replicator::job::lease::Lease;
use crate::replicator::scheduler::census::CensusBoard;
use crate::store::tuple;
use crate::telemetry::NodeMetrics;

use super::name::NodeName;

use super::child_id::ChildId;
use super::event_bus::{EVENT_BUS, EventBusMsg, ReplicatorEvent, publish};
use super::settings::ReplicatorSettings;

/// Sub-space tag of the collision index (CouchDB 4.x's couch_replicator_jobs.erl: `(LayerPrefix, 54, RepId)`).
pub(crate) const REP_IDS: i64 = 54;
/// Sub-space tag of node membership (our own; CouchDB 4.x had none).
pub const NODES: i64 = 55;
/// Sub-space tag of the transient jobs each user holds (ours; `job/owners.rs`).
pub(crate) const USER_JOBS: i64 = 57;

/// One node's shared context. Cheap to clone.
#[derive(Clone, Debug)]
pub struct NodeCtx {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    jobs: Jobs,
    settings: ReplicatorSettings,
    node: NodeName,
    server_uuid: String,
    prefix: Vec<u8>,
    children: Children,
    metrics: Arc<NodeMetrics>,
    /// Response bytes held by every job's requests together.
    response_budget: Arc<ResponseBudget>,
    /// Renewed by each heartbeat that committed: once it runs out, a neighbour may declare
    /// this node dead and re-enqueue its jobs, so they must have stopped (`job/lease.rs`).
    node_lease: Arc<Lease>,
    /// When each member's row last changed, as this process saw it (clustering and the
    /// job server's balance share it).
    sightings: Arc<Sightings>,
    /// The last count of the cluster's jobs (`/metrics` reads it, the job server takes it).
    census: Arc<CensusBoard>,
}

impl NodeCtx {
    /// A context for `node`; `children` is the tree's lookup table.
    pub fn new(
        jobs: Jobs,
        settings: ReplicatorSettings,
        node: NodeName,
        server_uuid: String,
        prefix: Vec<u8>,
        children: Children,
    ) -> Self {
        // The jobs clock, moved to the cluster's median by the sightings of members' rows.
        let sightings = Arc::new(Sightings::with_clock(
            jobs.corrected_clock().clone(),
            node.clone(),
        ));
        let node_timeout = settings.node_timeout();
        let metrics: Arc<NodeMetrics> = Arc::default();
        let budget = settings.job_defaults.limits.response_budget_bytes;
        Self {
            inner: Arc::new(Inner {
                jobs,
                settings,
                node,
                server_uuid,
                prefix,
                children,
                response_budget: Arc::new(ResponseBudget::new(budget, metrics.clone())),
                metrics,
                node_lease: Arc::new(Lease::new(node_timeout)),
                sightings,
                census: Arc::default(),
            }),
        }
    }

    /// The couch_jobs handle.
    pub fn jobs(&self) -> &Jobs {
        &self.inner.jobs
    }

    /// `[replicator]` settings.
    pub fn settings(&self) -> &ReplicatorSettings {
        &self.inner.settings
    }

    /// This node's name.
    pub fn node(&self) -> &NodeName {
        &self.inner.node
    }

    /// The uuid that goes into replication ids.
    pub fn server_uuid(&self) -> &str {
        &self.inner.server_uuid
    }

    /// The tree's children.
    pub fn children(&self) -> &Children {
        &self.inner.children
    }

    /// The node's lease on its membership (renewed by heartbeats).
    pub(crate) fn node_lease(&self) -> &Arc<Lease> {
        &self.inner.node_lease
    }

    /// This process's sightings of the members' rows.
    pub(crate) fn sightings(&self) -> &Arc<Sightings> {
        &self.inner.sightings
    }

    /// The last count of the cluster's jobs.
    pub fn census(&self) -> &Arc<CensusBoard> {
        &self.inner.census
    }

    /// This node's metrics.
    pub fn metrics(&self) -> &Arc<NodeMetrics> {
        &self.inner.metrics
    }

    /// The node's budget of response bytes, shared by every job.
    pub(crate) fn response_budget(&self) -> &Arc<ResponseBudget> {
        &self.inner.response_budget
    }

    /// A handle on a sibling actor.
    pub(crate) fn child<M: ractor::Message>(&self, id: ChildId<M>) -> ChildHandle<M> {
        self.inner.children.handle(id.name())
    }

    /// Publishes on the node's event bus (dropped if the bus is down).
    pub fn publish(&self, ev: ReplicatorEvent) {
        let bus = self.inner.children.get::<EventBusMsg>(EVENT_BUS.name());
        publish(bus.as_ref(), ev);
    }

    /// The layer prefix the replicator's own keys live under.
    pub fn prefix(&self) -> &[u8] {
        &self.inner.prefix
    }

    /// `prefix ‖ pack((tag, ..))`: a key in one of the replicator's own sub-spaces.
    pub fn key<T: tuple::TuplePack>(&self, t: &T) -> Vec<u8> {
        let mut k = self.inner.prefix.clone();
        tuple::pack_into(t, &mut k);
        k
    }

    /// Current UNIX seconds on the jobs clock.
    pub fn now_secs(&self) -> i64 {
        self.inner.jobs.clock().now_secs()
    }
}
