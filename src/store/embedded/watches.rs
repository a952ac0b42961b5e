//! Watch registry: which keys committed transactions watch and the value each watcher saw.
//!
//! Owned by the committer thread. After every durable batch the committer reports the new
//! values of the watched keys it touched ([`Registry::touched`]), and [`Registry::settle`]
//! fires the watchers whose value changed. Watches are not persisted: a restart drops them.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use tokio::sync::oneshot;

use super::conflicts::Written;
use crate::store::StoreError;

/// What a watch future receives: `Ok` when the key changed, `Err` when the store closed.
pub(crate) type WatchSignal = Result<(), StoreError>;

/// A watch as the transaction hands it to the committer.
pub(crate) struct NewWatch {
    pub key: Vec<u8>,
    pub seen: Seen,
    pub fire: oneshot::Sender<WatchSignal>,
}

/// The value the watcher saw.
pub(crate) enum Seen {
    Value(Option<Vec<u8>>),
    /// The transaction wrote the key: the watcher saw what its commit left there.
    OwnWrite,
}

struct Waiter {
    seen: Option<Vec<u8>>,
    fire: oneshot::Sender<WatchSignal>,
}

#[derive(Default)]
pub(crate) struct Registry {
    keys: BTreeMap<Vec<u8>, Vec<Waiter>>,
    batches: u64,
}

impl Registry {
    /// The watched keys that `writes` may have changed.
    pub(crate) fn touched<'a>(
        &self,
        writes: impl Iterator<Item = &'a Written>,
        out: &mut BTreeSet<Vec<u8>>,
    ) {
        if self.keys.is_empty() {
            return;
        }
        for w in writes {
            match w {
                Written::Key(k) => {
                    if self.keys.contains_key(k) {
                        out.insert(k.clone());
                    }
                }
                Written::Range(b, e) => {
                    for k in self
                        .keys
                        .range::<[u8], _>((
                            Bound::Included(b.as_slice()),
                            Bound::Excluded(e.as_slice()),
                        ))
                        .map(|(k, _)| k)
                    {
                        out.insert(k.clone());
                    }
                }
            }
        }
    }

    /// Registers a committed transaction's watch with the value it saw.
    pub(crate) fn add(
        &mut self,
        key: Vec<u8>,
        seen: Option<Vec<u8>>,
        fire: oneshot::Sender<WatchSignal>,
    ) {
        self.keys
            .entry(key)
            .or_default()
            .push(Waiter { seen, fire });
    }

    /// Fires every watcher of the given keys whose value is no longer what it saw; forgets
    /// cancelled watches. Call only once the values are durable.
    pub(crate) fn settle(&mut self, current: Vec<(Vec<u8>, Option<Vec<u8>>)>) {
        for (key, value) in current {
            let Some(waiters) = self.keys.get_mut(&key) else {
                continue;
            };
            let mut keep = Vec::with_capacity(waiters.len());
            for w in waiters.drain(..) {
                if w.fire.is_closed() {
                    continue;
                }
                if w.seen != value {
                    let _ = w.fire.send(Ok(()));
                } else {
                    keep.push(w);
                }
            }
            if keep.is_empty() {
                self.keys.remove(&key);
            } else {
                *waiters = keep;
            }
        }
        self.batches += 1;
        if self.batches % 1024 == 0 {
            self.keys.retain(|_, ws| {
                ws.retain(|w| !w.fire.is_closed());
                !ws.is_empty()
            });
        }
    }

    /// Resolves every watch with [`StoreError::Closed`].
    pub(crate) fn close(&mut self) {
        for (_, waiters) in std::mem::take(&mut self.keys) {
            for w in waiters {
                let _ = w.fire.send(Err(StoreError::Closed));
            }
        }
    }
}
