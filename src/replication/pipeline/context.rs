//! What a replication needs from its host ([`Context`]: the node's uuid, its 429 limiter,
//! shared transports, metrics and the in-flight byte cap) and the two HTTP clients built from
//! it for a replication's endpoints.

use std::sync::Arc;

use crate::replication::endpoint::database::Endpoint;
use crate::replication::error::Result;
use crate::replication::http::budget::{DEFAULT_RESPONSE_BUDGET_BYTES, ResponseBudget};
use crate::replication::http::client::{ClientConfig, HttpClient};
use crate::replication::http::session_cache::SessionCache;
use crate::replication::http::transport::Transports;
use crate::replication::options::spec::ReplicationSpec;
use crate::replication::rate_limiter::{Aimd, RateLimiter};
use crate::telemetry::NodeMetrics;

/// What a replication needs from its host.
#[derive(Clone)]
pub struct Context {
    /// The replicator node's uuid (part of the replication id).
    pub server_uuid: String,
    /// The 429 hook.
    pub limiter: Arc<dyn RateLimiter>,
    /// Shared per-endpoint clients (a node's connection pool); `None`: each replication
    /// opens its own connections.
    pub transports: Option<Arc<Transports>>,
    /// The host's metrics (requests, checkpoints, workers, documents).
    pub metrics: Arc<NodeMetrics>,
    /// The most bytes of fetched documents one replication holds in flight (see
    /// `pipeline::in_flight::InFlight`).
    pub in_flight_bytes: u64,
    /// The host's budget of response bytes held while reading, shared by its replications.
    pub response_budget: Arc<ResponseBudget>,
}

/// [`Context::in_flight_bytes`] by default: 64 MiB, a few hundred batches of small documents
/// (more than any link needs) but few of large ones.
pub const DEFAULT_IN_FLIGHT_BYTES: u64 = 64 << 20;

impl Default for Context {
    fn default() -> Self {
        let metrics: Arc<NodeMetrics> = Arc::default();
        Self {
            server_uuid: "couch-replicator-standalone".into(),
            limiter: Arc::new(Aimd::new()),
            transports: None,
            response_budget: Arc::new(ResponseBudget::new(
                DEFAULT_RESPONSE_BUDGET_BYTES,
                metrics.clone(),
            )),
            metrics,
            in_flight_bytes: DEFAULT_IN_FLIGHT_BYTES,
        }
    }
}

/// The clients of a replication's source and target, on the host's shared transports when
/// it has them, else on their own connections.
pub(crate) fn clients(
    spec: &ReplicationSpec,
    ctx: &Context,
) -> Result<(Arc<HttpClient>, Arc<HttpClient>)> {
    let o = &spec.options;
    let cfg = |proxy: &Option<String>, conns: usize| ClientConfig {
        connection_timeout: o.connection_timeout,
        request_timeout: o.request_timeout,
        retries_per_request: o.retries_per_request,
        http_connections: conns,
        proxy: proxy.clone(),
        tcp_nodelay: o.tcp_nodelay,
        metrics: ctx.metrics.clone(),
        tls: o.tls.clone(),
        auth: o.auth,
        limits: o.limits,
        budget: ctx.response_budget.clone(),
    };
    // Without shared transports, source and target still share their logins: on one server
    // as one user they log in once, not twice at the same moment (two first logins at once
    // on a CouchDB without a cookie secret yet cost a refusal and a new login).
    let sessions = SessionCache::default();
    let client = |ep: &Endpoint, cfg: ClientConfig| match &ctx.transports {
        Some(t) => HttpClient::shared(ep.clone(), cfg, ctx.limiter.clone(), t),
        None => HttpClient::new(ep.clone(), cfg, ctx.limiter.clone()).map(|mut c| {
            c.share_sessions(&sessions);
            c
        }),
    };
    // The changes feed holds one source connection: never fewer than 2 (CouchDB's couch_replicator_scheduler_job.erl start-up).
    let src = client(
        &spec.source,
        cfg(&o.source_proxy, o.http_connections.max(2)),
    )?;
    let tgt = client(&spec.target, cfg(&o.target_proxy, o.http_connections))?;
    Ok((Arc::new(src), Arc::new(tgt)))
}
