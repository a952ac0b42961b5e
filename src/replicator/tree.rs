//! `replicator_sup`: one node's replicator tree, `rest_for_one` (a crash restarts that child
//! and every child after it; later children call earlier ones through the children table).
//! Read top to bottom, this is the start order; node types decide which children run.

use supervisors::{ChildSpec, Strategy, Supervisor, SupervisorRef};

use crate::jobs::Jobs;

use super::context::{NodeCtx, ids};
use super::error::{ReplicatorError, ReplicatorResult};
use super::event_bus::EventBus;
use super::settings::ReplicatorSettings;

/// Restart intensity of `replicator_sup` (CouchDB 3.x: 10 restarts per second).
const MAX_RESTARTS: u32 = 10;
const PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Builds and starts the tree; returns it with the node context its actors share.
pub async fn start(
    jobs: Jobs,
    settings: ReplicatorSettings,
    node: String,
    server_uuid: String,
    prefix: Vec<u8>,
) -> ReplicatorResult<(SupervisorRef, NodeCtx)> {
    let sup = Supervisor::new(Strategy::RestForOne).intensity(MAX_RESTARTS, PERIOD);
    let ctx = NodeCtx::new(jobs, settings, node, server_uuid, prefix, sup.children());
    let sup = sup
        // 1. Publish/subscribe of replication events; everything below publishes on it.
        .child(ChildSpec::server(ids::EVENT_BUS, EventBus, |_| ()));
    let tree = sup
        .start()
        .await
        .map_err(|e| ReplicatorError::Unavailable(e.to_string()))?;
    Ok((tree, ctx))
}
