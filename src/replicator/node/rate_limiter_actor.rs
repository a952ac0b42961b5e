//! The `rate_limiter` child ([`RateLimiterMsg`]): the node-wide AIMD 429 rate limiter
//! (CouchDB's couch_replicator_rate_limiter.erl) as an actor around one
//! [`crate::replication::Aimd`].
//!
//! Like CouchDB's limiter process owning public ETS tables, the actor owns a [`Aimd`]
//! table that every HTTP client of every job on the node reads and updates directly through
//! the engine's [`RateLimiter`] hook (a request must not wait for an actor round trip); the
//! actor hands the table out ([`RateLimiterMsg::Table`]), answers [`RateLimiterMsg::Observe`]
//! with the current intervals, and runs the periodic cleanup of
//! entries idle for longer than the maximum interval. A restarted limiter starts with an
//! empty table, as a restarted ETS owner does. Reaching the 25 s maximum makes the engine
//! fail the request with `max_backoff`, which crashes the job (see `job/actor.rs`).
//!
//! Time is tokio's clock (milliseconds since the table was created), so tests step it with
//! paused time.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, Observable, Server};

use super::child_id::ChildId;
use crate::replication::RateLimiter;
use crate::replication::rate_limiter::{Aimd, MAX_INTERVAL_MS, RateInterval};

/// Cleanup period: twice the maximum interval (CouchDB: 50 s).
pub(crate) const CLEANUP_PERIOD: Duration = Duration::from_millis(2 * MAX_INTERVAL_MS);

/// The AIMD 429 limiter, a child of the tree.
pub(crate) const RATE_LIMITER: ChildId<RateLimiterMsg> = ChildId::new("rate_limiter");

/// Messages of the rate limiter.
#[derive(Debug)]
pub enum RateLimiterMsg {
    /// The shared table (what a job passes to its replication as the 429 hook).
    Table(RpcReplyPort<Aimd>),
    /// Periodic cleanup (sent by the actor's own timer).
    Cleanup,
    /// The limiter's state.
    Observe(RpcReplyPort<RateLimiterObservation>),
}

/// What [`RateLimiterMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RateLimiterObservation {
    /// The `max_backoff` ceiling.
    pub max_interval: Duration,
    /// Every `(endpoint, method)` with a non-zero interval, sorted.
    pub intervals: Vec<RateInterval>,
    /// Entries the periodic cleanup dropped since this limiter started.
    pub cleaned: u64,
}

impl Observable for RateLimiterMsg {
    type Observation = RateLimiterObservation;
    fn observe(reply: RpcReplyPort<RateLimiterObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// The rate limiter server.
#[derive(Debug, Clone)]
pub struct RateLimiterServer {
    /// The `max_backoff` ceiling (`rate_limiter_max_interval`).
    pub max_interval: Duration,
}

impl Default for RateLimiterServer {
    /// CouchDB's 25 s ceiling.
    fn default() -> Self {
        Self {
            max_interval: Duration::from_millis(MAX_INTERVAL_MS),
        }
    }
}

/// Its state: the table and the cleanup timer.
pub struct RateLimiterState {
    table: Aimd,
    cleaned: u64,
    _timer: tokio::task::JoinHandle<()>,
}

impl Drop for RateLimiterState {
    fn drop(&mut self) {
        self._timer.abort();
    }
}

impl Server for RateLimiterServer {
    type Msg = RateLimiterMsg;
    type State = RateLimiterState;
    type Args = ();

    async fn init(
        &self,
        myself: ActorRef<RateLimiterMsg>,
        _: (),
    ) -> Result<RateLimiterState, BoxError> {
        let timer = tokio::spawn(async move {
            let mut tick = tokio::time::interval(CLEANUP_PERIOD);
            tick.tick().await;
            loop {
                tick.tick().await;
                if myself.send_message(RateLimiterMsg::Cleanup).is_err() {
                    return;
                }
            }
        });
        Ok(RateLimiterState {
            table: Aimd::with_max_interval(self.max_interval),
            cleaned: 0,
            _timer: timer,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<RateLimiterMsg>,
        msg: RateLimiterMsg,
        state: &mut RateLimiterState,
    ) -> Result<(), BoxError> {
        match msg {
            RateLimiterMsg::Table(reply) => {
                let _ = reply.send(state.table.clone());
            }
            RateLimiterMsg::Cleanup => {
                let n = state.table.cleanup();
                state.cleaned += n as u64;
                if n > 0 {
                    tracing::debug!(removed = n, "rate limiter cleanup");
                }
            }
            RateLimiterMsg::Observe(reply) => {
                let _ = reply.send(RateLimiterObservation {
                    max_interval: state.table.max_interval(),
                    intervals: state.table.intervals(),
                    cleaned: state.cleaned,
                });
            }
        }
        Ok(())
    }
}
