//! The serial in-memory reference engine.
//!
//! Transactions run one at a time: `begin` waits for a store-wide lock that the transaction
//! holds until it commits or is dropped, so every history is trivially serializable and no
//! transaction ever conflicts. Writes go straight to the map with an undo log, so reads see
//! the transaction's own writes and a dropped transaction leaves no trace.
//!
//! It is the model the concurrent engines are checked against and a fast stand-in for unit
//! tests that do not care about concurrency. Do not hold two of its transactions open in one
//! task: the second `begin` waits for the first to finish.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::{OwnedMutexGuard, oneshot};

use super::{
    CommitStamp, KeyValue, RangeOptions, Store, StoreError, Transaction, Watch, apply_atomic_add,
    commit_stamp, fill_versionstamp,
};

#[derive(Default)]
struct State {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    version: u64,
    watches: Vec<PendingWatch>,
}

struct PendingWatch {
    key: Vec<u8>,
    seen: Option<Vec<u8>>,
    fire: oneshot::Sender<()>,
}

/// The serial reference engine. Cheap to clone; clones share the data.
#[derive(Clone, Default)]
pub struct MemoryStore {
    turn: Arc<tokio::sync::Mutex<()>>,
    state: Arc<Mutex<State>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key and value, in order (for tests and model checks).
    pub fn dump(&self) -> Vec<KeyValue> {
        lock(&self.state)
            .data
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves consistent data (every write is one map op).
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Store for MemoryStore {
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn Transaction>, StoreError>> {
        async move {
            let turn = self.turn.clone().lock_owned().await;
            let version = lock(&self.state).version + 1;
            let tx: Box<dyn Transaction> = Box::new(MemoryTx {
                state: self.state.clone(),
                inner: Mutex::new(TxInner {
                    turn: Some(turn),
                    undo: Vec::new(),
                    wrote: false,
                    watches: Vec::new(),
                    committed: false,
                }),
                stamp: commit_stamp(version, 0),
            });
            Ok(tx)
        }
        .boxed()
    }

    fn engine_name(&self) -> &'static str {
        "memory"
    }
}

struct TxInner {
    turn: Option<OwnedMutexGuard<()>>,
    undo: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    wrote: bool,
    watches: Vec<PendingWatch>,
    committed: bool,
}

struct MemoryTx {
    state: Arc<Mutex<State>>,
    inner: Mutex<TxInner>,
    // Serial execution means the commit version is known when the transaction starts.
    stamp: CommitStamp,
}

impl MemoryTx {
    fn inner(&self) -> MutexGuard<'_, TxInner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self, key: &[u8], value: Option<Vec<u8>>) {
        let mut inner = self.inner();
        if inner.turn.is_none() {
            return;
        }
        let mut state = lock(&self.state);
        let old = match value {
            Some(v) => state.data.insert(key.to_vec(), v),
            None => state.data.remove(key),
        };
        inner.undo.push((key.to_vec(), old));
        inner.wrote = true;
    }
}

impl Transaction for MemoryTx {
    fn get<'a>(
        &'a self,
        key: &'a [u8],
        _snapshot: bool,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        let value = lock(&self.state).data.get(key).cloned();
        futures::future::ready(Ok(value)).boxed()
    }

    fn get_range<'a>(
        &'a self,
        begin: &'a [u8],
        end: &'a [u8],
        options: RangeOptions,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>, StoreError>> {
        let rows = if begin >= end {
            Vec::new()
        } else {
            let state = lock(&self.state);
            let range = state
                .data
                .range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)));
            let limit = options.limit.unwrap_or(usize::MAX);
            let to_kv = |(k, v): (&Vec<u8>, &Vec<u8>)| KeyValue {
                key: k.clone(),
                value: v.clone(),
            };
            if options.reverse {
                range.rev().take(limit).map(to_kv).collect()
            } else {
                range.take(limit).map(to_kv).collect()
            }
        };
        futures::future::ready(Ok(rows)).boxed()
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.write(key, Some(value.to_vec()));
    }

    fn clear(&self, key: &[u8]) {
        self.write(key, None);
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        if begin >= end {
            return;
        }
        let keys: Vec<Vec<u8>> = lock(&self.state)
            .data
            .range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.write(&key, None);
        }
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        let existing = lock(&self.state).data.get(key).cloned();
        self.write(key, Some(apply_atomic_add(existing.as_deref(), delta)));
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        match fill_versionstamp(key, &self.stamp) {
            Ok(key) => self.write(&key, Some(value.to_vec())),
            Err(e) => tracing::error!(error = %e, "memory store: bad versionstamped key ignored"),
        }
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        match fill_versionstamp(value, &self.stamp) {
            Ok(value) => self.write(key, Some(value)),
            Err(e) => {
                tracing::error!(error = %e, "memory store: bad versionstamped value ignored")
            }
        }
    }

    fn add_read_conflict_range(&self, _begin: &[u8], _end: &[u8]) {}

    fn watch(&self, key: &[u8]) -> Watch {
        let (fire, fired) = oneshot::channel();
        let seen = lock(&self.state).data.get(key).cloned();
        self.inner().watches.push(PendingWatch {
            key: key.to_vec(),
            seen,
            fire,
        });
        async move {
            fired.await.map_err(|_| {
                StoreError::Invalid("the watch's transaction was not committed".into())
            })
        }
        .boxed()
    }

    fn commit(&self) -> BoxFuture<'_, Result<Option<CommitStamp>, StoreError>> {
        let mut inner = self.inner();
        let result = if inner.turn.is_none() {
            Err(StoreError::Invalid("transaction already finished".into()))
        } else {
            let mut state = lock(&self.state);
            if inner.wrote {
                state.version += 1;
            }
            state.watches.append(&mut inner.watches);
            let State { data, watches, .. } = &mut *state;
            let (fired, waiting): (Vec<_>, Vec<_>) = std::mem::take(watches)
                .into_iter()
                .partition(|w| data.get(&w.key) != w.seen.as_ref());
            *watches = waiting;
            for w in fired {
                let _ = w.fire.send(());
            }
            inner.undo.clear();
            inner.committed = true;
            inner.turn = None;
            Ok(inner.wrote.then_some(self.stamp))
        };
        futures::future::ready(result).boxed()
    }
}

impl Drop for MemoryTx {
    fn drop(&mut self) {
        let inner = self
            .inner
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if inner.committed {
            return;
        }
        let mut state = lock(&self.state);
        while let Some((key, old)) = inner.undo.pop() {
            match old {
                Some(v) => state.data.insert(key, v),
                None => state.data.remove(&key),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Db, tuple};

    #[tokio::test]
    async fn dropped_transaction_leaves_no_trace() {
        let store = MemoryStore::new();
        let db = Db::new(Arc::new(store.clone()));
        let tx = db.begin().await.unwrap();
        tx.set(b"a", b"1");
        tx.clear_range(b"", b"\xff");
        assert_eq!(tx.get(b"a", false).await.unwrap(), None);
        drop(tx);
        assert!(store.dump().is_empty());
        db.run(|tx| async move {
            tx.set(b"a", b"1");
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
        // The row, and the transaction id `Db::run` commits with every write.
        assert_eq!(store.dump().len(), 2);
        assert!(store.dump().iter().any(|kv| kv.key == b"a"));
    }

    #[tokio::test]
    async fn versionstamps_increase_and_watches_fire() {
        let store = MemoryStore::new();
        let db = Db::new(Arc::new(store.clone()));
        let mut stamps = Vec::new();
        for i in 0..3u8 {
            let key = tuple::pack_with_versionstamp(&("vs", tuple::Versionstamp::incomplete(0)));
            let tx = db.begin().await.unwrap();
            tx.set_versionstamped_key(&key, &[i]);
            stamps.push(tx.commit().await.unwrap().unwrap());
        }
        let rows = store.dump();
        assert_eq!(rows.len(), 3);
        assert!(rows.windows(2).all(|w| w[0].key < w[1].key));
        assert!(stamps.windows(2).all(|w| w[0] < w[1]));

        let watch = {
            let tx = db.begin().await.unwrap();
            let w = tx.watch(b"w");
            tx.commit().await.unwrap();
            w
        };
        let fired = tokio::spawn(watch);
        db.run(|tx| async move {
            tx.atomic_add(b"w", 1);
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
        fired.await.unwrap().unwrap();
    }
}
