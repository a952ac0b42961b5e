//! One optimistic transaction of the embedded engine.
//!
//! Reads go to the snapshot the transaction began on, overlaid with its own buffered writes;
//! non-snapshot reads record read-conflict ranges. `commit` hands the conflict ranges, the
//! mutation log and the watches to the committer and waits for its verdict. A transaction
//! that wrote nothing and watches nothing commits without the committer.

use std::cmp::Ordering;
use std::sync::atomic::{self, AtomicBool};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::committer::{CommitRequest, CommitVerdict, Request};
use super::conflicts::KeyRange;
use super::watches::{NewWatch, Seen, WatchSignal};
use super::writes::{Lookup, WriteBuffer, unreadable};
use super::{Shared, Snapshot, engine_err};
use crate::store::{
    CommitStamp, KeyValue, RangeOptions, StoreError, Transaction, Watch, apply_atomic_add,
};

struct State {
    /// `None` once committed.
    snapshot: Option<Arc<Snapshot>>,
    writes: WriteBuffer,
    reads: Vec<KeyRange>,
    watches: Vec<(Vec<u8>, oneshot::Sender<WatchSignal>)>,
}

/// A snapshot row: key and value.
type Row = (Vec<u8>, Vec<u8>);

pub(crate) struct EmbeddedTx {
    shared: Arc<Shared>,
    read_version: u64,
    state: Mutex<State>,
    /// Counted in `Shared::open` until submitted or dropped.
    counted: AtomicBool,
}

fn key_after(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    k
}

fn finished() -> StoreError {
    StoreError::Invalid("transaction already committed".into())
}

fn snapshot_get(snapshot: &Snapshot, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(snapshot
        .table
        .get(key)
        .map_err(engine_err)?
        .map(|v| v.value().to_vec()))
}

impl EmbeddedTx {
    pub(crate) fn new(shared: Arc<Shared>, snapshot: Arc<Snapshot>) -> Self {
        shared.open.fetch_add(1, atomic::Ordering::AcqRel);
        Self {
            counted: AtomicBool::new(true),
            shared,
            read_version: snapshot.version,
            state: Mutex::new(State {
                snapshot: Some(snapshot),
                writes: WriteBuffer::default(),
                reads: Vec::new(),
                watches: Vec::new(),
            }),
        }
    }

    /// Leaves `Shared::open` (once): the transaction will not send a commit any more.
    fn uncount(&self) {
        if self.counted.swap(false, atomic::Ordering::AcqRel) {
            self.shared.open.fetch_sub(1, atomic::Ordering::AcqRel);
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read_key(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        let mut state = self.state();
        let snap = state.snapshot.clone().ok_or_else(finished)?;
        let lookup = state.writes.lookup(key);
        let value = match lookup {
            Lookup::Known(v) => v,
            Lookup::Unreadable => return Err(unreadable()),
            base => base.resolve(snapshot_get(&snap, key)?)?,
        };
        // Like FoundationDB, a read answered from the transaction's own writes still conflicts.
        if !snapshot {
            state.reads.push((key.to_vec(), key_after(key)));
        }
        Ok(value)
    }

    fn read_range(
        &self,
        begin: &[u8],
        end: &[u8],
        options: RangeOptions,
    ) -> Result<Vec<KeyValue>, StoreError> {
        let mut state = self.state();
        let snap = state.snapshot.clone().ok_or_else(finished)?;
        if begin >= end {
            return Ok(Vec::new());
        }
        let limit = options.limit.unwrap_or(usize::MAX);
        let mut rows = Vec::new();
        if limit > 0 {
            let own = state.writes.keys_in(begin, end, options.reverse);
            let mut own = own.into_iter().peekable();
            let range = snap.table.range::<&[u8]>(begin..end).map_err(engine_err)?;
            let mut base: Box<dyn Iterator<Item = _>> = if options.reverse {
                Box::new(range.rev())
            } else {
                Box::new(range)
            };
            let mut next_base = || -> Result<Option<Row>, StoreError> {
                match base.next() {
                    None => Ok(None),
                    Some(Err(e)) => Err(engine_err(e)),
                    Some(Ok((k, v))) => Ok(Some((k.value().to_vec(), v.value().to_vec()))),
                }
            };
            let mut pending_base = next_base()?;
            while rows.len() < limit {
                let order = match (&pending_base, own.peek()) {
                    (None, None) => break,
                    (Some(_), None) => Ordering::Less,
                    (None, Some(_)) => Ordering::Greater,
                    (Some((bk, _)), Some(ok)) => {
                        let o = bk.as_slice().cmp(ok.as_slice());
                        if options.reverse { o.reverse() } else { o }
                    }
                };
                match order {
                    Ordering::Less => {
                        if let Some((k, v)) = pending_base.take()
                            && !state.writes.hides(&k)
                        {
                            rows.push(KeyValue { key: k, value: v });
                        }
                        pending_base = next_base()?;
                    }
                    Ordering::Greater | Ordering::Equal => {
                        let Some(key) = own.next() else { break };
                        let base_value = if order == Ordering::Equal {
                            let taken = pending_base.take().map(|(_, v)| v);
                            pending_base = next_base()?;
                            taken
                        } else {
                            None
                        };
                        let value = match state.writes.lookup(&key) {
                            Lookup::Known(v) => v,
                            Lookup::Unreadable => return Err(unreadable()),
                            Lookup::Base(None) => base_value,
                            Lookup::Base(Some(d)) => {
                                Some(apply_atomic_add(base_value.as_deref(), d))
                            }
                        };
                        if let Some(value) = value {
                            rows.push(KeyValue { key, value });
                        }
                    }
                }
            }
        }
        if !options.snapshot
            && let Some(covered) = read_conflict_range(begin, end, &rows, limit, options.reverse)
        {
            state.reads.push(covered);
        }
        Ok(rows)
    }

    /// Seals the transaction and builds its commit request (`None`: nothing to send).
    #[allow(clippy::type_complexity)]
    fn finish_commit(
        &self,
    ) -> Result<Option<(CommitRequest, oneshot::Receiver<CommitVerdict>)>, StoreError> {
        let mut state = self.state();
        let snap = state.snapshot.clone().ok_or_else(finished)?;
        state.writes.check()?;
        let watches = std::mem::take(&mut state.watches);
        let mut new_watches = Vec::with_capacity(watches.len());
        for (key, fire) in watches {
            let seen = if state.writes.touches(&key) {
                Seen::OwnWrite
            } else {
                Seen::Value(snapshot_get(&snap, &key)?)
            };
            new_watches.push(NewWatch { key, seen, fire });
        }
        state.snapshot = None;
        if state.writes.is_empty() && new_watches.is_empty() {
            return Ok(None);
        }
        let (reply, verdict) = oneshot::channel();
        let request = CommitRequest {
            read_version: self.read_version,
            reads: std::mem::take(&mut state.reads),
            ops: state.writes.take_ops(),
            watches: new_watches,
            reply,
        };
        Ok(Some((request, verdict)))
    }
}

impl Transaction for EmbeddedTx {
    fn get<'a>(
        &'a self,
        key: &'a [u8],
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        futures::future::ready(self.read_key(key, snapshot)).boxed()
    }

    fn get_range<'a>(
        &'a self,
        begin: &'a [u8],
        end: &'a [u8],
        options: RangeOptions,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>, StoreError>> {
        futures::future::ready(self.read_range(begin, end, options)).boxed()
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.state().writes.set(key, value);
    }

    fn clear(&self, key: &[u8]) {
        self.state().writes.clear(key);
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.state().writes.clear_range(begin, end);
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.state().writes.add(key, delta);
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.state().writes.set_versionstamped_key(key, value);
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.state().writes.set_versionstamped_value(key, value);
    }

    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) {
        if begin < end {
            self.state().reads.push((begin.to_vec(), end.to_vec()));
        }
    }

    fn watch(&self, key: &[u8]) -> Watch {
        let (fire, fired) = oneshot::channel();
        self.state().watches.push((key.to_vec(), fire));
        async move {
            match fired.await {
                Ok(signal) => signal,
                Err(_) => Err(StoreError::Invalid(
                    "the watch's transaction was not committed".into(),
                )),
            }
        }
        .boxed()
    }

    fn commit(&self) -> BoxFuture<'_, Result<Option<CommitStamp>, StoreError>> {
        async move {
            let prepared = self.finish_commit();
            let sent = match prepared {
                Ok(Some((request, verdict))) => {
                    // Counted off only once the request is queued, so the committer never
                    // sees zero open transactions while this one is about to join a batch.
                    let sent = self.shared.send(Request::Commit(request));
                    self.uncount();
                    sent.map(|()| Some(verdict))
                }
                other => {
                    self.uncount();
                    other.map(|_| None)
                }
            };
            match sent? {
                Some(verdict) => verdict.await.map_err(|_| StoreError::Closed)?,
                None => Ok(None),
            }
        }
        .boxed()
    }
}

impl Drop for EmbeddedTx {
    fn drop(&mut self) {
        self.uncount();
    }
}

/// The keys a non-snapshot range read depended on: the whole range, or up to the last row
/// returned when the limit cut it short (FDB records the same). `None` when empty.
fn read_conflict_range(
    begin: &[u8],
    end: &[u8],
    rows: &[KeyValue],
    limit: usize,
    reverse: bool,
) -> Option<(Vec<u8>, Vec<u8>)> {
    let covered = match rows.last() {
        Some(last) if rows.len() >= limit => {
            if reverse {
                (last.key.clone(), end.to_vec())
            } else {
                (begin.to_vec(), key_after(&last.key))
            }
        }
        _ if limit == 0 => return None,
        _ => (begin.to_vec(), end.to_vec()),
    };
    (covered.0 < covered.1).then_some(covered)
}
