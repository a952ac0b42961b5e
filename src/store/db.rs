//! [`Db`]: the cheap-to-clone store handle and its transaction retry loop, FoundationDB's
//! `db.run` with the transaction options CouchDB sets (`[fdb_tx_options]`: `timeout`
//! 60000 ms, `retry_limit` 100, `max_retry_delay` 1000 ms) enforced here for every engine,
//! and with idempotent retries after `commit_unknown_result` ([`super::idempotent`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;

use super::idempotent::{TrackedTx, TxIds};
use super::{RetryableError, Store, StoreError, Transaction, Tx, tuple};

/// How [`Db::run`] retries.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts before the last retryable error is returned (CouchDB's `retry_limit` 100).
    pub max_attempts: u32,
    /// First back-off sleep; doubled per attempt up to `max_delay`, with jitter.
    pub initial_delay: Duration,
    /// CouchDB's `max_retry_delay` (1 s).
    pub max_delay: Duration,
    /// The whole run, retries included, fails with [`StoreError::TimedOut`] after this
    /// (CouchDB's `timeout` 60 s; like FDB's option since API 610 it spans retries).
    /// `None` = no limit.
    pub timeout: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 100,
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_secs(1),
            timeout: Some(Duration::from_secs(60)),
        }
    }
}

/// A cheap-to-clone handle on a store, with the transaction retry loop.
#[derive(Clone)]
pub struct Db {
    store: Arc<dyn Store>,
    retry: RetryPolicy,
    txids: Arc<TxIds>,
    stats: Arc<crate::telemetry::StoreStats>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("engine", &self.store.engine_name())
            .finish()
    }
}

/// The layer prefix transaction ids live under by default (the jobs layer's).
fn default_layer_prefix() -> Vec<u8> {
    tuple::pack(&(tuple::Bytes::from(&b"couchdb"[..]),))
}

/// Puts taken-but-not-cleared transaction ids back when an attempt is abandoned.
struct Requeue<'a> {
    txids: &'a TxIds,
    keys: Vec<Vec<u8>>,
}

impl Drop for Requeue<'_> {
    fn drop(&mut self) {
        self.txids.requeue(std::mem::take(&mut self.keys));
    }
}

impl Db {
    /// A handle on `store` with the default [`RetryPolicy`].
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            retry: RetryPolicy::default(),
            txids: Arc::new(TxIds::new(&default_layer_prefix())),
            stats: Arc::default(),
        }
    }

    /// Commit latency and retries of [`Db::run`] on this handle and its clones.
    pub fn stats(&self) -> &crate::telemetry::StoreStats {
        &self.stats
    }

    /// The engine's name and its own counters (see [`Store::counters`]).
    pub fn engine_counters(&self) -> (&'static str, Vec<super::EngineCounter>) {
        (self.store.engine_name(), self.store.counters())
    }

    /// Replaces the retry policy [`Db::run`] uses.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Transaction ids under `layer_prefix ‖ pack((255, id))` instead of the default
    /// `pack(("couchdb",))` prefix.
    pub fn with_txid_prefix(mut self, layer_prefix: &[u8]) -> Self {
        self.txids = Arc::new(TxIds::new(layer_prefix));
        self
    }

    /// The engine's short name, for logs (see [`Store::engine_name`]).
    pub fn engine_name(&self) -> &'static str {
        self.store.engine_name()
    }

    /// Landed transaction ids not cleared yet (each write transaction clears a batch).
    pub fn txid_backlog(&self) -> usize {
        self.txids.backlog()
    }

    /// Starts a transaction that the caller commits itself (no retries, no transaction id).
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(Arc::from(self.store.begin().await?))
    }

    /// Runs `body` in a transaction and commits it, retrying the whole body on retryable
    /// errors (from the body or from the commit), like FoundationDB's `db.run`. The body may
    /// run several times, so it must not have effects outside the transaction that matter.
    ///
    /// A body that wrote anything commits a transaction id with its writes (unless the
    /// engine resolves lost commits itself, [`Store::resolves_lost_commits`]); after
    /// [`StoreError::CommitUnknown`] the retry reads it back and returns the earlier
    /// attempt's result when that commit landed, so a body never applies twice. Bounded by
    /// [`RetryPolicy::max_attempts`] and [`RetryPolicy::timeout`].
    pub async fn run<T, E, F, Fut>(&self, mut body: F) -> Result<T, E>
    where
        F: FnMut(Tx) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: RetryableError,
    {
        let deadline = self.retry.timeout.map(|t| Instant::now() + t);
        // Attempts whose commit outcome is unknown: their id key and their result.
        let mut unknown: Vec<(Vec<u8>, T)> = Vec::new();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let step = self.attempt(&mut body, &mut unknown);
            let result = match deadline {
                Some(d) if Instant::now() >= d => Err(E::from(StoreError::TimedOut)),
                Some(d) => match tokio::time::timeout_at(d, step).await {
                    Ok(result) => result,
                    Err(_) => Err(E::from(StoreError::TimedOut)),
                },
                None => step.await,
            };
            let err = match result {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            if !err.is_retryable() {
                return Err(err);
            }
            if attempt >= self.retry.max_attempts {
                self.stats.failed();
                return Err(err);
            }
            self.stats.retried();
            tokio::time::sleep(self.backoff(attempt)).await;
        }
    }

    /// One attempt: resolve earlier unknown commits, run the body, commit with an id.
    async fn attempt<T, E, F, Fut>(
        &self,
        body: &mut F,
        unknown: &mut Vec<(Vec<u8>, T)>,
    ) -> Result<T, E>
    where
        F: FnMut(Tx) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: RetryableError,
    {
        let tx = Arc::new(TrackedTx::new(self.begin().await?));
        for i in 0..unknown.len() {
            // Conflict-checked: an earlier commit landing after this read makes ours conflict.
            if tx.get(&unknown[i].0, false).await?.is_some() {
                let (key, value) = unknown.swap_remove(i);
                self.txids.requeue([key]);
                return Ok(value);
            }
        }
        let value = body(tx.clone()).await?;
        let started = std::time::Instant::now();
        if !tx.wrote() || self.store.resolves_lost_commits() {
            tx.commit().await?;
            self.stats.committed(started.elapsed());
            return Ok(value);
        }
        let key = self.txids.fresh_key();
        tx.set(&key, b"");
        let mut clearing = Requeue {
            txids: &self.txids,
            keys: self.txids.take_batch(),
        };
        for k in &clearing.keys {
            tx.clear(k);
        }
        match tx.commit().await {
            Ok(_) => {
                self.stats.committed(started.elapsed());
                // Cleared for good: nothing to give back.
                clearing.keys.clear();
                self.txids.requeue([key]);
                Ok(value)
            }
            Err(StoreError::CommitUnknown) => {
                unknown.push((key, value));
                Err(E::from(StoreError::CommitUnknown))
            }
            Err(e) => Err(E::from(e)),
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        // Full jitter keeps retrying transactions from colliding again in lockstep.
        Backoff::new(self.retry.initial_delay, self.retry.max_delay)
            .full_jitter()
            .nth(attempt)
    }
}
