//! connection_pool: the node's shared HTTP clients and per-endpoint connection budget (CouchDB's
//! `couch_replicator_connection.erl`).
//!
//! The pool owns the node's `Transports`: one reqwest client per endpoint (scheme, host,
//! port, proxy and client settings), shared by every job, handed out by [`PoolMsg::Clients`]
//! (a job asks once at start; requests never wait on this actor). A job's `http_connections`
//! bounds its own requests in flight on top of the shared client. Idle sockets close after
//! `connection_close_interval`, and a client no job uses any more is dropped (closing its
//! sockets) by the sweep once unused that long; a dead job's clients go with it, so its share
//! of the sockets returns to the others.
//!
//! Messages: [`PoolMsg::Acquire`] (an owner actor asks for up to `want` connections to an
//! endpoint and gets what is left of the budget; when nothing is left it still gets one, as
//! CouchDB's callers start a new worker on `all_allocated` so the pool never blocks — the
//! overflow is counted), [`PoolMsg::Release`] (all of an owner's leases), [`PoolMsg::Observe`],
//! and the actor's own [`PoolMsg::Sweep`] tick, which releases the leases of owners that have
//! died (owner death releases) and forgets endpoints idle for `connection_close_interval`
//! (idle close). Endpoints are keyed by scheme, host and port, without credentials.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use std::sync::Arc;

use ractor::{ActorCell, ActorId, ActorRef, ActorStatus, RpcReplyPort};
use supervisors::{BoxError, Observable, Server};
use tokio::time::Instant;

use super::child_id::ChildId;
use crate::replication::http::transport::{TransportUse, Transports};
use crate::telemetry::Series;

/// How often dead owners and idle endpoints are looked for.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// What an owner got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Connections granted (≥ 1).
    pub granted: usize,
    /// True when the budget was exhausted and one connection was granted over it.
    pub overflow: bool,
}

/// Use of one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Usage {
    /// Connections leased.
    pub in_use: usize,
    /// Owners holding a lease.
    pub owners: usize,
    /// Grants beyond the budget so far.
    pub overflows: u64,
}

/// The per-endpoint connection budget, a child of the tree.
pub(crate) const CONNECTION_POOL: ChildId<PoolMsg> = ChildId::new("connection_pool");

/// Messages of the pool.
#[derive(Debug)]
pub enum PoolMsg {
    /// Lease up to `want` connections to `endpoint` for `owner`.
    Acquire {
        /// `scheme://host:port` (see [`endpoint_key`]).
        endpoint: String,
        /// The actor the lease belongs to.
        owner: ActorCell,
        /// How many it would like.
        want: usize,
        /// The answer.
        reply: RpcReplyPort<Lease>,
    },
    /// Release every lease of `owner`.
    Release(ActorId),
    /// The node's shared HTTP clients.
    Clients(RpcReplyPort<Arc<Transports>>),
    /// The pool's state.
    Observe(RpcReplyPort<PoolObservation>),
    /// Timer tick.
    Sweep,
}

/// What [`PoolMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PoolObservation {
    /// Connections per endpoint.
    pub budget: usize,
    /// Idle sockets each shared client keeps per host.
    pub max_idle: usize,
    /// Buffered requests each shared client lets through at once.
    pub max_requests: usize,
    /// Idle time after which an unused endpoint is forgotten.
    pub close_interval: Duration,
    /// The use of every endpoint the pool knows, by [`endpoint_key`] (a forgotten endpoint
    /// is absent).
    pub endpoints: BTreeMap<String, Usage>,
    /// The shared HTTP clients and how many job clients hold each.
    pub clients: Vec<TransportUse>,
    /// Shared clients dropped after being unused for `close_interval`.
    pub clients_closed: u64,
}

impl Observable for PoolMsg {
    type Observation = PoolObservation;
    fn observe(reply: RpcReplyPort<PoolObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// The key of an endpoint URL: scheme, host and port, never credentials or path.
pub fn endpoint_key(url: &url::Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or(""),
        url.port_or_known_default().unwrap_or(0)
    )
}

/// The pool server: `budget` connections per endpoint, idle endpoints forgotten after
/// `close_interval`.
#[derive(Debug, Clone)]
pub struct ConnectionPool {
    /// Connections per endpoint.
    pub budget: usize,
    /// Idle sockets each shared client keeps per host; a socket handed back beyond this is
    /// closed at once. Without a cap, the peaks of many jobs starting together leave hundreds
    /// of idle sockets open for `close_interval`.
    pub max_idle: usize,
    /// Buffered requests in flight per shared client, across jobs (continuous feeds are not
    /// counted): what bounds the sockets a burst of job starts opens.
    pub max_requests: usize,
    /// Idle time after which an unused endpoint's entry is closed.
    pub close_interval: Duration,
    /// Where acquires, releases and owner deaths are counted.
    pub metrics: std::sync::Arc<crate::telemetry::NodeMetrics>,
}

struct Endpoint {
    leases: HashMap<ActorId, (ActorCell, usize)>,
    overflows: u64,
    idle_since: Instant,
}

impl Endpoint {
    fn in_use(&self) -> usize {
        self.leases.values().map(|(_, n)| n).sum()
    }
}

/// The pool's state.
pub struct PoolState {
    endpoints: HashMap<String, Endpoint>,
    transports: Arc<Transports>,
    clients_closed: u64,
    timer: tokio::task::JoinHandle<()>,
}

impl Drop for PoolState {
    fn drop(&mut self) {
        self.timer.abort();
    }
}

impl PoolState {
    /// Releases every lease of `owner`; whether it held any.
    fn release(&mut self, owner: ActorId) -> bool {
        let now = Instant::now();
        let mut held = false;
        for ep in self.endpoints.values_mut() {
            if ep.leases.remove(&owner).is_some() {
                held = true;
                if ep.leases.is_empty() {
                    ep.idle_since = now;
                }
            }
        }
        held
    }
}

impl Server for ConnectionPool {
    type Msg = PoolMsg;
    type State = PoolState;
    type Args = ();

    async fn init(&self, myself: ActorRef<PoolMsg>, _: ()) -> Result<PoolState, BoxError> {
        let timer = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_PERIOD);
            tick.tick().await;
            loop {
                tick.tick().await;
                if myself.send_message(PoolMsg::Sweep).is_err() {
                    return;
                }
            }
        });
        Ok(PoolState {
            endpoints: HashMap::new(),
            transports: Arc::new(Transports::new(
                self.close_interval,
                self.max_idle,
                self.max_requests,
            )),
            clients_closed: 0,
            timer,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<PoolMsg>,
        msg: PoolMsg,
        state: &mut PoolState,
    ) -> Result<(), BoxError> {
        match msg {
            PoolMsg::Acquire {
                endpoint,
                owner,
                want,
                reply,
            } => {
                let _ = reply.send(self.acquire(state, endpoint, owner, want));
            }
            PoolMsg::Release(owner) => {
                if state.release(owner) {
                    self.metrics.inc(Series::ConnectionReleases);
                }
            }
            PoolMsg::Clients(reply) => {
                let _ = reply.send(state.transports.clone());
            }
            PoolMsg::Observe(reply) => {
                let _ = reply.send(self.observation(state));
            }
            PoolMsg::Sweep => self.sweep(state),
        }
        Ok(())
    }
}

impl ConnectionPool {
    /// Grants what is left of the endpoint's budget, or one connection over it.
    fn acquire(
        &self,
        state: &mut PoolState,
        endpoint: String,
        owner: ActorCell,
        want: usize,
    ) -> Lease {
        let ep = state.endpoints.entry(endpoint).or_insert_with(|| Endpoint {
            leases: HashMap::new(),
            overflows: 0,
            idle_since: Instant::now(),
        });
        let left = self.budget.saturating_sub(ep.in_use());
        let lease = if left == 0 {
            ep.overflows += 1;
            Lease {
                granted: 1,
                overflow: true,
            }
        } else {
            Lease {
                granted: want.max(1).min(left),
                overflow: false,
            }
        };
        let id = owner.get_id();
        let slot = ep.leases.entry(id).or_insert((owner, 0));
        slot.1 += lease.granted;
        self.metrics.inc(Series::ConnectionAcquires);
        lease
    }

    fn observation(&self, state: &PoolState) -> PoolObservation {
        let endpoints = state.endpoints.iter().map(|(key, ep)| {
            let usage = Usage {
                in_use: ep.in_use(),
                owners: ep.leases.len(),
                overflows: ep.overflows,
            };
            (key.clone(), usage)
        });
        PoolObservation {
            budget: self.budget,
            max_idle: self.max_idle,
            max_requests: self.max_requests,
            close_interval: self.close_interval,
            endpoints: endpoints.collect(),
            clients: state.transports.usage(),
            clients_closed: state.clients_closed,
        }
    }

    /// Releases dead owners' leases, drops unused clients, forgets idle endpoints.
    fn sweep(&self, state: &mut PoolState) {
        let dead: Vec<ActorId> = state
            .endpoints
            .values()
            .flat_map(|ep| ep.leases.values())
            .filter(|(cell, _)| cell.get_status() >= ActorStatus::Stopping)
            .map(|(cell, _)| cell.get_id())
            .collect();
        for owner in dead {
            self.metrics.inc(Series::ConnectionOwnerCrashes);
            tracing::debug!(%owner, "connection owner died; releasing its connections");
            state.release(owner);
        }
        state.clients_closed += state.transports.sweep() as u64;
        let close = self.close_interval;
        state
            .endpoints
            .retain(|_, ep| !ep.leases.is_empty() || ep.idle_since.elapsed() < close);
    }
}
