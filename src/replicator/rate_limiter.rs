//! rate_limiter: the node-wide AIMD 429 limiter (CouchDB's couch_replicator_rate_limiter.erl) as an actor around
//! [`super::aimd::AimdTable`].
//!
//! Like CouchDB's limiter process owning public ETS tables, the actor owns a [`SharedAimd`]
//! table that every HTTP client of every job on the node reads and updates directly through
//! the engine's [`RateLimiter`] hook (a request must not wait for an actor round trip); the
//! actor hands the table out ([`RateLimiterMsg::Table`]), answers [`RateLimiterMsg::Observe`]
//! with the current intervals, and runs the periodic cleanup of
//! entries idle for longer than the maximum interval. A restarted limiter starts with an
//! empty table, as a restarted ETS owner does. Reaching the 25 s maximum makes the engine
//! fail the request with `max_backoff`, which crashes the job (see `job.rs`).
//!
//! Time is tokio's clock (milliseconds since the table was created), so tests step it with
//! paused time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use supervisors::{BoxError, Observable, Server};
use tokio::time::Instant;

use crate::replication::RateLimiter;
use crate::replication::rate_limit::RateKey as EngineKey;

use super::aimd::{AimdTable, MAX_INTERVAL_MS, RateKey};

/// Cleanup period: twice the maximum interval (CouchDB: 50 s).
pub const CLEANUP_PERIOD: Duration = Duration::from_millis(2 * MAX_INTERVAL_MS);
/// Offset so no update ever happens at "time 0" (the table treats 0 as "never updated").
const EPOCH_OFFSET_MS: u64 = 1_000_000;

/// The shared AIMD table, usable as the engine's 429 hook.
#[derive(Debug, Clone)]
pub struct SharedAimd {
    table: Arc<Mutex<AimdTable>>,
    epoch: Instant,
    max_interval: Duration,
}

impl Default for SharedAimd {
    fn default() -> Self {
        Self {
            table: Arc::default(),
            epoch: Instant::now(),
            max_interval: Duration::from_millis(MAX_INTERVAL_MS),
        }
    }
}

impl SharedAimd {
    /// An empty table whose requests fail with `max_backoff` once they would wait `max`
    /// (capped at CouchDB's 25 s, which the table never exceeds).
    pub fn with_max_interval(max: Duration) -> Self {
        Self {
            max_interval: max.min(Duration::from_millis(MAX_INTERVAL_MS)),
            ..Self::default()
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + EPOCH_OFFSET_MS
    }

    fn with<R>(&self, f: impl FnOnce(&mut AimdTable, u64) -> R) -> R {
        let now = self.now_ms();
        // Every operation is a single map update, so a poisoned table is still consistent.
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut t, now)
    }

    /// The current interval of `(endpoint, method)` in ms.
    pub fn interval_ms(&self, endpoint: &str, method: &str) -> u64 {
        self.with(|t, _| t.interval(&RateKey::new(endpoint, method)))
    }

    /// Drops idle entries; returns how many.
    pub fn cleanup(&self) -> usize {
        self.with(|t, now| t.cleanup(now))
    }

    /// How many keys have an interval.
    pub fn len(&self) -> usize {
        self.with(|t, _| t.len())
    }

    /// No key has an interval.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every `(endpoint, method)` with an interval, sorted.
    pub fn intervals(&self) -> Vec<RateInterval> {
        let mut out: Vec<RateInterval> = self.with(|t, _| {
            t.intervals()
                .map(|(k, ms)| RateInterval {
                    endpoint: k.endpoint.clone(),
                    method: k.method.clone(),
                    interval: Duration::from_millis(ms),
                })
                .collect()
        });
        out.sort_by(|a, b| (&a.endpoint, &a.method).cmp(&(&b.endpoint, &b.method)));
        out
    }
}

/// The current wait before requests of one method to one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RateInterval {
    /// The database URL, without credentials.
    pub endpoint: String,
    /// The HTTP method.
    pub method: String,
    /// The wait before each request.
    pub interval: Duration,
}

fn key(k: &EngineKey) -> RateKey {
    RateKey::new(k.0.clone(), k.1.clone())
}

impl RateLimiter for SharedAimd {
    fn interval(&self, k: &EngineKey) -> Duration {
        let stale = self.max_interval.as_millis() as u64;
        Duration::from_millis(self.with(|t, now| t.interval_at(&key(k), now, stale)))
    }

    fn failure(&self, k: &EngineKey) -> Duration {
        Duration::from_millis(self.with(|t, now| t.failure(&key(k), now)))
    }

    fn success(&self, k: &EngineKey) {
        self.with(|t, now| t.success(&key(k), now));
    }

    fn max_interval(&self) -> Duration {
        self.max_interval
    }
}

/// Messages of the rate limiter.
#[derive(Debug)]
pub enum RateLimiterMsg {
    /// The shared table (what a job passes to its replication as the 429 hook).
    Table(RpcReplyPort<SharedAimd>),
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
    table: SharedAimd,
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
            table: SharedAimd::with_max_interval(self.max_interval),
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
                    max_interval: state.table.max_interval,
                    intervals: state.table.intervals(),
                    cleaned: state.cleaned,
                });
            }
        }
        Ok(())
    }
}
