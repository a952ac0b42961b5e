//! One transaction on etcd: reads at the transaction's revision overlaid with its own
//! buffered writes (the embedded engine's write buffer), non-snapshot reads recorded in the
//! read set, and a commit handed to the committer. Range reads are `transaction/range.rs`.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use etcd_client::GetOptions;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::committer::Committer;
use super::conflicts::ReadSet;
use super::read_version::{Group, ReadVersions, Version, with_response};
use super::replica::{Page, Snapshot, Spec};
use super::{MAX_TXN_OPS, Shared};
use crate::store::embedded::writes::{Lookup, WriteBuffer, unreadable};
use crate::store::{CommitStamp, KeyValue, RangeOptions, StoreError, Transaction, Watch};

mod range;

struct State {
    done: bool,
    writes: WriteBuffer,
    reads: ReadSet,
    /// Declared read-conflict ranges (store keys) and the revision each conflicts after,
    /// resolved at commit.
    declared: Vec<(Vec<u8>, Vec<u8>, i64)>,
    /// What reads (snapshot ones too) saw of the store at `R`.
    observed: Observed,
    /// Watched store keys and where to send the revision to watch from.
    watches: Vec<(Vec<u8>, oneshot::Sender<i64>)>,
}

pub(crate) struct EtcdTx {
    shared: Arc<Shared>,
    committer: Committer,
    versions: ReadVersions,
    /// The read revision `R`, set by the first read (or by [`EtcdTx::revision`]).
    revision: OnceLock<i64>,
    /// The clock's mod revision at `R`, set with it.
    clock_mod: OnceLock<i64>,
    /// The replica's rows at `R` (`None`: it could not serve them, read from etcd).
    pinned: OnceLock<Option<Snapshot>>,
    /// Held while the first read is in flight, so that a concurrent read that could not
    /// join its group waits for `R`.
    first: tokio::sync::Mutex<()>,
    /// A revision the process knew when the transaction began (at most the current one).
    floor: i64,
    /// The first reads, while queued for the batcher (a new group per attempt).
    group: Mutex<Arc<Group>>,
    state: Mutex<State>,
}

fn finished() -> StoreError {
    StoreError::Invalid("transaction already committed".into())
}

fn key_after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

/// What the transaction's reads found at `R`, snapshot reads included: the mod revision of
/// each key read (0 = absent) and the spans read completely, so that a declared conflict on
/// a key already read needs no read at commit (couch_jobs' `accept` declares one on the
/// pending key its snapshot range read returned).
#[derive(Default)]
struct Observed {
    keys: std::collections::BTreeMap<Vec<u8>, i64>,
    spans: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Observed {
    /// The mod revision `key` (a store key) had at `R`, if a read saw it.
    fn get(&self, key: &[u8]) -> Option<i64> {
        if let Some(m) = self.keys.get(key) {
            return Some(*m);
        }
        let in_span = self
            .spans
            .iter()
            .any(|(b, e)| b.as_slice() <= key && key < e.as_slice());
        in_span.then_some(0)
    }
}

impl EtcdTx {
    pub(crate) fn new(shared: Arc<Shared>, committer: Committer, versions: ReadVersions) -> Self {
        let floor = shared.latest();
        Self {
            shared,
            committer,
            versions,
            floor,
            revision: OnceLock::new(),
            clock_mod: OnceLock::new(),
            pinned: OnceLock::new(),
            first: tokio::sync::Mutex::new(()),
            group: Mutex::default(),
            state: Mutex::new(State {
                done: false,
                writes: WriteBuffer::default(),
                reads: ReadSet::default(),
                declared: Vec::new(),
                observed: Observed::default(),
                watches: Vec::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The read revision `R`, fetched now if nothing was read yet.
    async fn revision(&self) -> Result<i64, StoreError> {
        if let Some(r) = self.revision.get() {
            return Ok(*r);
        }
        if let Ok(joined) = self.versions.join(&self.group(), None).await {
            return Ok(self.set_version(joined?.0));
        }
        let _first = self.first.lock().await;
        if let Some(r) = self.revision.get() {
            return Ok(*r);
        }
        let version = self.versions.get(&self.new_group()).await?;
        Ok(self.set_version(version))
    }

    /// Fixes `R` (the first version set wins) and returns it.
    fn set_version(&self, version: Version) -> i64 {
        let r = *self.revision.get_or_init(|| version.revision);
        if r == version.revision {
            let _ = self.clock_mod.set(version.clock_mod);
        }
        r
    }

    /// The replica's rows at `R` (fetching `R` first), once per transaction; `None` without
    /// a replica or when it cannot serve `R`.
    async fn snapshot(&self) -> Result<Option<&Snapshot>, StoreError> {
        let Some(replica) = &self.shared.replica else {
            return Ok(None);
        };
        if let Some(pinned) = self.pinned.get() {
            return Ok(pinned.as_ref());
        }
        let r = self.revision().await?;
        let clock_mod = self.clock_mod.get().copied().unwrap_or(r);
        let started = std::time::Instant::now();
        let pinned = replica.pin(r, clock_mod).await;
        let waited = started.elapsed().as_micros() as u64;
        let stats = &self.shared.stats;
        stats
            .replica_wait_us
            .fetch_add(waited, std::sync::atomic::Ordering::Relaxed);
        if pinned.is_none() {
            stats
                .replica_misses
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(self.pinned.get_or_init(|| pinned).as_ref())
    }

    fn group(&self) -> Arc<Group> {
        self.group.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn new_group(&self) -> Arc<Group> {
        let group = Arc::new(Group::default());
        *self.group.lock().unwrap_or_else(|p| p.into_inner()) = group.clone();
        group
    }

    /// A `Range` at `R`: from the replica when it serves `R`. Without a replica, the first
    /// read of the transaction goes through the batcher and fixes `R`; the later ones are
    /// plain reads at `R`.
    async fn read(&self, spec: Spec) -> Result<Page, StoreError> {
        if let Some(snapshot) = self.snapshot().await? {
            let local = &self.shared.stats.local_reads;
            local.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(snapshot.read(&spec));
        }
        let rows = spec.limit.max(1);
        let options = spec.options();
        if let Some(r) = self.revision.get() {
            let at = options.with_revision(*r);
            return self.shared.read_at(spec.key, at).await.map(Page::from);
        }
        // Join the transaction's queued first reads, if any.
        let read = Some(Box::new((spec.key, options, rows)));
        let (key, options) = match self.versions.join(&self.group(), read).await {
            Ok(joined) => {
                let (version, resp) = with_response(joined?)?;
                self.set_version(version);
                return Ok(resp.into());
            }
            Err(Some(read)) => (read.0, read.1),
            Err(None) => return Err(StoreError::Closed),
        };
        let _first = self.first.lock().await;
        if let Some(r) = self.revision.get() {
            let at = options.with_revision(*r);
            return self.shared.read_at(key, at).await.map(Page::from);
        }
        let (version, resp) = self
            .versions
            .first_read(&self.new_group(), key, options, rows)
            .await?;
        self.set_version(version);
        Ok(resp.into())
    }

    async fn read_key(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        let lookup = {
            let mut state = self.state();
            if state.done {
                return Err(finished());
            }
            let lookup = state.writes.lookup(key);
            if let Lookup::Known(v) = lookup {
                // Answered by our own writes; it still conflicts, like FoundationDB.
                if !snapshot {
                    let k = self.shared.keys.data(key);
                    state.reads.range(k.clone(), key_after(&k));
                }
                return Ok(v);
            }
            lookup
        };
        if matches!(lookup, Lookup::Unreadable) {
            return Err(unreadable());
        }
        let etcd_key = self.shared.keys.data(key);
        let spec = Spec {
            key: etcd_key.clone(),
            end: None,
            limit: 1,
            reverse: false,
        };
        let page = self.read(spec).await?;
        let kv = page.rows.into_iter().next();
        let seen = kv.as_ref().map_or(0, |kv| kv.mod_revision);
        let mut state = self.state();
        state.observed.keys.entry(key.to_vec()).or_insert(seen);
        if !snapshot {
            state.reads.key(etcd_key, seen);
        }
        drop(state);
        lookup.resolve(kv.map(|kv| kv.value))
    }

    /// Resolves declared read-conflict ranges: the range compare, and each row in it at the
    /// range's revision (read now, unless the range is one key a read already saw at that
    /// revision: its `MOD == seen` then catches every write to it).
    async fn resolve_declared(
        &self,
        declared: Vec<(Vec<u8>, Vec<u8>, i64)>,
        observed: Observed,
    ) -> Result<ReadSet, StoreError> {
        let mut extra = ReadSet::default();
        let keys = &self.shared.keys;
        let at_r = self.revision.get().copied();
        for (b, e, revision) in declared {
            if e == key_after(&b)
                && at_r == Some(revision)
                && let Some(seen) = observed.get(&b)
            {
                extra.key(keys.data(&b), seen);
                continue;
            }
            let options = GetOptions::new()
                .with_range(keys.data(&e))
                .with_revision(revision)
                .with_keys_only()
                .with_limit(MAX_TXN_OPS as i64 + 1);
            let resp = self.shared.read_at(keys.data(&b), options).await?;
            for kv in resp.kvs() {
                extra.key(kv.key().to_vec(), kv.mod_revision());
            }
            extra.range_since(keys.data(&b), keys.data(&e), revision);
        }
        Ok(extra)
    }

    async fn finish_commit(&self) -> Result<Option<CommitStamp>, StoreError> {
        let (ops, mut reads, declared, observed, watches) = {
            let mut state = self.state();
            if state.done {
                return Err(finished());
            }
            state.done = true;
            state.writes.check()?;
            let watches: Vec<_> = std::mem::take(&mut state.watches)
                .into_iter()
                .map(|(key, fire)| (state.writes.touches(&key), key, fire))
                .collect();
            (
                state.writes.take_ops(),
                std::mem::take(&mut state.reads),
                std::mem::take(&mut state.declared),
                std::mem::take(&mut state.observed),
                watches,
            )
        };
        // Watches on keys this transaction does not write start after its reads: they need
        // `R`, fetched now if it read nothing.
        let untouched = watches.iter().any(|(touched, _, _)| !touched);
        let watch_from = if untouched {
            self.revision().await? + 1
        } else {
            0
        };
        if ops.is_empty() {
            // Read-only: nothing to check (as in FoundationDB).
            for (_, _, fire) in watches {
                let _ = fire.send(watch_from);
            }
            return Ok(None);
        }
        if !declared.is_empty() {
            let extra = self.resolve_declared(declared, observed).await?;
            reads.merge(extra);
        }
        // Range checks exist only after a read, which fixed `R`.
        let revision = self.revision.get().copied().unwrap_or(0);
        let committed = self
            .committer
            .commit(&self.shared.keys, revision, reads, ops)
            .await?;
        for (touched, _, fire) in watches {
            let from = if touched {
                committed.revision + 1
            } else {
                watch_from
            };
            let _ = fire.send(from);
        }
        Ok(Some(committed.stamp))
    }
}

impl Transaction for EtcdTx {
    fn get<'a>(
        &'a self,
        key: &'a [u8],
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        self.read_key(key, snapshot).boxed()
    }

    fn get_range<'a>(
        &'a self,
        begin: &'a [u8],
        end: &'a [u8],
        options: RangeOptions,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>, StoreError>> {
        self.read_range(begin, end, options).boxed()
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
            // Before the first read there is no `R` yet: conflict with anything written
            // after a revision the process knew when the transaction began (a commit that
            // lands after `begin` must conflict, as it does on the embedded engine).
            let since = self.revision.get().copied().unwrap_or(self.floor);
            let range = (begin.to_vec(), end.to_vec(), since);
            self.state().declared.push(range);
        }
    }

    fn watch(&self, key: &[u8]) -> Watch {
        let (fire, start) = oneshot::channel();
        self.state().watches.push((key.to_vec(), fire));
        let shared = self.shared.clone();
        let etcd_key = shared.keys.data(key);
        async move {
            let from = start.await.map_err(|_| {
                StoreError::Invalid("the watch's transaction was not committed".into())
            })?;
            super::watches::wait(&shared, etcd_key, from).await
        }
        .boxed()
    }

    fn commit(&self) -> BoxFuture<'_, Result<Option<CommitStamp>, StoreError>> {
        self.finish_commit().boxed()
    }
}
