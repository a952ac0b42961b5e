//! `replicator_sup`: one node's replicator tree, `rest_for_one` (a crash restarts that child
//! and every child after it; later children call earlier ones through the children table).
//! Read top to bottom, this is the start order; node types decide which children run:
//! every node runs the event bus and clustering, `replication` nodes run the connection
//! pool, the rate limiter, the job server and job_sup; `api_frontend` nodes then run the
//! doc processor and the HTTP API (both after the job server: a job-server crash restarts
//! them too); `replication` nodes end with the whole-server jobs' worker.

use std::time::Duration;

use supervisors::{ChildSpec, DynamicSupervisor, Shutdown, Strategy, Supervisor, SupervisorRef};

use crate::jobs::Jobs;

use super::connection_pool::{CONNECTION_POOL, ConnectionPool};
use super::context::NodeCtx;
use super::event_bus::{EVENT_BUS, EventBus};
use super::frontend::{self, Frontend, FrontendService, HandleRx};
use super::name::NodeName;
use super::rate_limiter_actor::{RATE_LIMITER, RateLimiterServer};
use super::settings::{NodeType, ReplicatorSettings};
use crate::replicator::cluster::actor::{CLUSTERING, Clustering};
use crate::replicator::error::{ReplicatorError, ReplicatorResult};
use crate::replicator::job::actor::{JobArgs, JobMsg};
use crate::replicator::scheduler::job_server::{JOB_SERVER, JobServer, JobServerMsg};
use crate::replicator::scheduler::job_sup::{self, JOB_SHUTDOWN, JobSupRef};
use crate::replicator::server_job::worker;

/// Restart intensity of `replicator_sup` (CouchDB 3.x: 10 restarts per second).
const MAX_RESTARTS: u32 = 10;
const PERIOD: Duration = Duration::from_secs(1);
/// Connections per endpoint across all jobs of the node.
pub(crate) const ENDPOINT_BUDGET: usize = 1000;

/// A started tree: its supervisor, the context its actors share, and its job_sup.
pub struct StartedTree {
    /// `replicator_sup`.
    pub sup: SupervisorRef,
    /// What the actors share.
    pub ctx: NodeCtx,
    /// The dynamic supervisor of job actors (valid across its restarts).
    pub job_sup: JobSupRef,
}

/// Builds and starts the tree; returns it with the node context its actors share.
pub async fn start(
    jobs: Jobs,
    settings: ReplicatorSettings,
    node: NodeName,
    server_uuid: String,
    prefix: Vec<u8>,
    frontend: Frontend,
    handle: HandleRx,
) -> ReplicatorResult<StartedTree> {
    let sup = Supervisor::new(Strategy::RestForOne)
        .intensity(MAX_RESTARTS, PERIOD)
        // A label, not a registered name: one process may run several nodes named alike.
        .label(format!("replicator_sup:{node}"));
    let children = sup.children();
    let exits = children.clone();
    let job_sup = job_sup::spec(move |exit| {
        let _ = exits
            .handle::<JobServerMsg>(JOB_SERVER.name())
            .cast(JobServerMsg::WorkerExited(exit.actor));
    });
    let job_sup_ref = job_sup.handle_in(&children, job_sup::JOB_SUP);
    let ctx = NodeCtx::new(jobs, settings, node, server_uuid, prefix, children);
    let s = ctx.settings().clone();

    // 1. Publish/subscribe of replication events; everything below publishes on it.
    let mut sup = sup.child(ChildSpec::server(EVENT_BUS.name(), EventBus, |_| ()));

    // 2. Membership, health keys, stable/unstable events, dead-neighbour removal.
    sup = sup.child(ChildSpec::server(
        CLUSTERING.name(),
        Clustering::from_ctx(ctx.clone()),
        |_| (),
    ));

    if s.runs(NodeType::Replication) {
        sup = replication_children(sup, &ctx, job_sup, job_sup_ref.clone());
    }
    if s.runs(NodeType::ApiFrontend) {
        sup = frontend_children(sup, &frontend, &handle);
    }
    if s.runs(NodeType::Replication) {
        // 9. Whole-server jobs: it adds replications through the handle, so it comes last.
        let svc = FrontendService {
            name: worker::SERVER_WORKER,
            run: worker::service(),
            handle: handle.clone(),
        };
        sup = sup.child(ChildSpec::server(worker::SERVER_WORKER, svc, |_| ()));
    }

    let tree = sup
        .start()
        .await
        .map_err(|e| ReplicatorError::Unavailable(e.to_string()))?;
    Ok(StartedTree {
        sup: tree,
        ctx,
        job_sup: job_sup_ref,
    })
}

/// Children 3-6, on `replication` nodes.
fn replication_children(
    sup: Supervisor,
    ctx: &NodeCtx,
    job_sup: DynamicSupervisor<JobArgs, JobMsg>,
    job_sup_ref: JobSupRef,
) -> Supervisor {
    let s = ctx.settings();
    // 3. Per-endpoint connection budget; owner death releases.
    let pool = ConnectionPool {
        budget: ENDPOINT_BUDGET,
        // As many idle sockets per endpoint as one job may use at once (its default
        // `http_connections`): enough for the next job's burst, not one per job.
        max_idle: s.job_defaults.http_connections.max(1),
        max_requests: s.max_requests_per_endpoint.max(1),
        close_interval: s.connection_close_interval,
        metrics: ctx.metrics().clone(),
    };
    sup.child(ChildSpec::server(CONNECTION_POOL.name(), pool, |_| ()))
        // 4. AIMD 429 limiter shared by every job's HTTP clients.
        .child(ChildSpec::server(
            RATE_LIMITER.name(),
            RateLimiterServer {
                max_interval: s.rate_limiter_max_interval,
            },
            |_| (),
        ))
        // 5. Acceptors, max_jobs, churn and trimming, transient cleanup, gauges.
        .child(ChildSpec::server(
            JOB_SERVER.name(),
            JobServer {
                ctx: ctx.clone(),
                job_sup: job_sup_ref,
            },
            |_| (),
        ))
        // 6. One actor per running replication; stopping it checkpoints every job.
        .child(
            job_sup
                .into_child_spec(job_sup::JOB_SUP)
                .shutdown(Shutdown::Timeout(JOB_SHUTDOWN + Duration::from_secs(1))),
        )
}

/// Children 7-8, on `api_frontend` nodes: `_replicator` docs -> jobs, then the HTTP API.
fn frontend_children(mut sup: Supervisor, frontend: &Frontend, handle: &HandleRx) -> Supervisor {
    let services = [
        (frontend::DOC_PROCESSOR, frontend.doc_processor_service()),
        (frontend::HTTP, frontend.http.clone()),
    ];
    for (name, run) in services {
        if let Some(run) = run {
            let svc = FrontendService {
                name,
                run,
                handle: handle.clone(),
            };
            sup = sup.child(ChildSpec::server(name, svc, |_| ()));
        }
    }
    sup
}
