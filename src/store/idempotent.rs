//! Transaction ids that make [`Db::run`](super::Db::run) retries safe after
//! `commit_unknown_result`.
//!
//! CouchDB's FDB layer does the same (apache/couchdb `src/fabric/src/fabric2_fdb.erl`,
//! `transactional/1`, and `src/fabric/src/fabric2_txids.erl`): every transaction that writes
//! also writes a key named by a fresh transaction id; after an unknown commit result the
//! retry first reads that key, and if it is there the earlier attempt committed and its saved
//! result is returned instead of running the body again. The read is conflict-checked, so an
//! earlier commit that lands after the retry's read version makes the retry conflict instead
//! of applying twice. Ids of commits known to have landed are queued and cleared (blind
//! clears, so no conflicts) by the next write transaction of the same [`Db`](super::Db)
//! handle, as fabric2_txids clears them in batches.
//!
//! [`TrackedTx`] is how the loop learns whether a body wrote anything: read-only
//! transactions get no id, so reads stay free.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::{CommitStamp, KeyValue, RangeOptions, StoreError, Transaction, Watch, tuple};

/// The sub-space of transaction ids under the layer prefix (fabric2's `?TX_IDS`).
pub const TX_IDS: i64 = 255;

/// How many landed ids one write transaction clears at most.
const CLEAR_BATCH: usize = 64;

/// Where transaction ids live and which ones wait to be cleared.
#[derive(Debug)]
pub struct TxIds {
    prefix: Vec<u8>,
    landed: Mutex<Vec<Vec<u8>>>,
}

impl TxIds {
    /// Ids under `layer_prefix ‖ pack((255, id))`.
    pub fn new(layer_prefix: &[u8]) -> Self {
        let mut prefix = layer_prefix.to_vec();
        prefix.extend_from_slice(&tuple::pack(&(TX_IDS,)));
        Self {
            prefix,
            landed: Mutex::new(Vec::new()),
        }
    }

    /// A fresh, never reused id key.
    pub fn fresh_key(&self) -> Vec<u8> {
        let id = uuid::Uuid::new_v4();
        let mut key = self.prefix.clone();
        key.extend_from_slice(&tuple::pack(&(tuple::Bytes::from(&id.as_bytes()[..]),)));
        key
    }

    fn landed(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.landed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ids to clear in the next write transaction (given back by [`TxIds::requeue`] if that
    /// transaction does not commit).
    pub fn take_batch(&self) -> Vec<Vec<u8>> {
        let mut landed = self.landed();
        let keep = landed.len().saturating_sub(CLEAR_BATCH);
        landed.split_off(keep)
    }

    /// Queues ids whose commit landed (or whose clearing did not commit) for clearing.
    pub fn requeue(&self, keys: impl IntoIterator<Item = Vec<u8>>) {
        self.landed().extend(keys);
    }

    /// How many landed ids wait to be cleared (for tests).
    pub fn backlog(&self) -> usize {
        self.landed().len()
    }
}

/// A transaction that remembers whether it was written to, forwarding everything else.
pub struct TrackedTx {
    inner: Arc<dyn Transaction>,
    wrote: AtomicBool,
}

impl TrackedTx {
    pub fn new(inner: Arc<dyn Transaction>) -> Self {
        Self {
            inner,
            wrote: AtomicBool::new(false),
        }
    }

    pub fn wrote(&self) -> bool {
        self.wrote.load(Ordering::Relaxed)
    }

    fn mark(&self) {
        self.wrote.store(true, Ordering::Relaxed);
    }
}

impl Transaction for TrackedTx {
    fn get<'a>(
        &'a self,
        key: &'a [u8],
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        self.inner.get(key, snapshot)
    }

    fn get_range<'a>(
        &'a self,
        begin: &'a [u8],
        end: &'a [u8],
        options: RangeOptions,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>, StoreError>> {
        self.inner.get_range(begin, end, options)
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.mark();
        self.inner.set(key, value);
    }

    fn clear(&self, key: &[u8]) {
        self.mark();
        self.inner.clear(key);
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.mark();
        self.inner.clear_range(begin, end);
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.mark();
        self.inner.atomic_add(key, delta);
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.mark();
        self.inner.set_versionstamped_key(key, value);
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.mark();
        self.inner.set_versionstamped_value(key, value);
    }

    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) {
        self.inner.add_read_conflict_range(begin, end);
    }

    fn watch(&self, key: &[u8]) -> Watch {
        self.inner.watch(key)
    }

    fn commit(&self) -> BoxFuture<'_, Result<Option<CommitStamp>, StoreError>> {
        self.inner.commit()
    }
}
