//! The committer: one thread that owns the redb file and turns batches of commit requests
//! into durable commits (group commit).
//!
//! Takes [`Request::Commit`] from transactions and [`Request::Close`] from the store. A batch
//! collects requests until it is as large as the last one and no open transaction may still
//! join (or no request came for a short gap). For each batch it (1)
//! rejects requests whose read-conflict ranges meet writes committed after their read
//! version, including writes of earlier requests accepted into the same batch, (2) applies the
//! accepted ones in order in ONE redb write transaction and makes the batch durable with one
//! fsync: of the commit log ([`super::wal`], synced on its own thread while redb commits
//! without durability), or, every [`CHECKPOINT_BATCHES`], of a durable redb commit that also
//! persists the logged batches before it, (3) publishes the new snapshot and version,
//! acknowledges with versionstamps (commit version ‖ order in batch), then fires watches.
//! Nothing is acknowledged or visible to readers before its batch is durable.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak, mpsc};
use std::time::{Duration, Instant};

use redb::{ReadableTable, Table};
use tokio::sync::oneshot;

use super::conflicts::{History, KeyRange, Written, intersects};
use super::wal::{Effect, LogWriter};
use super::watches::{NewWatch, Registry, Seen};
use super::writes::Mutation;
use super::{DATA, META, Shared, VERSION_KEY, engine_err, open_snapshot};
use crate::store::{CommitStamp, StoreError, apply_atomic_add, commit_stamp, fill_versionstamp};

/// A checkpoint (durable redb commit, then an empty log) after this many logged batches...
const CHECKPOINT_BATCHES: u32 = 256;
/// ...or once the log holds this much.
const CHECKPOINT_BYTES: u64 = 16 << 20;
/// Most requests in one batch (the batch order is 2 bytes).
const MAX_BATCH: usize = 4096;
/// A batch closes as soon as it is as large as the last one and no open transaction is left
/// to join it, or when no request arrived for this long (a busy CPU can delay a writer by
/// more than a few microseconds)...
const ARRIVAL_GAP: Duration = Duration::from_micros(250);
/// ...or when its first request waited this long.
const MAX_LINGER: Duration = Duration::from_millis(1);

pub(crate) type CommitVerdict = Result<Option<CommitStamp>, StoreError>;

pub(crate) struct CommitRequest {
    pub read_version: u64,
    pub reads: Vec<KeyRange>,
    pub ops: Vec<Mutation>,
    pub watches: Vec<NewWatch>,
    pub reply: oneshot::Sender<CommitVerdict>,
}

pub(crate) enum Request {
    Commit(CommitRequest),
    Close(oneshot::Sender<Result<(), StoreError>>),
}

/// A request that passed the conflict check, with what it writes.
struct Accepted {
    request: CommitRequest,
    stamp: Option<CommitStamp>,
    /// Versionstamped keys, filled in order of appearance in `ops`.
    filled_keys: Vec<Vec<u8>>,
    seen: Vec<Option<Vec<u8>>>,
}

pub(crate) struct Committer {
    db: Option<redb::Database>,
    version: u64,
    history: History,
    watches: Registry,
    shared: Weak<Shared>,
    wal: LogWriter,
    /// Batches made durable by the log since the last checkpoint.
    logged: u32,
    /// Size of the last batch: its writers are likely to come back with their next commit.
    expected: usize,
    /// Set when a batch reached redb but not the log: redb is then ahead of what is durable,
    /// so nothing more may be committed on top of it.
    broken: Option<StoreError>,
}

pub(crate) type DataTable<'t> = Table<'t, &'static [u8], &'static [u8]>;

impl Committer {
    pub(crate) fn new(
        db: redb::Database,
        version: u64,
        shared: Weak<Shared>,
        wal: LogWriter,
    ) -> Self {
        Self {
            db: Some(db),
            version,
            history: History::new(version),
            watches: Registry::default(),
            shared,
            wal,
            logged: 0,
            broken: None,
            expected: 1,
        }
    }

    pub(crate) fn run(mut self, requests: mpsc::Receiver<Request>) {
        while let Ok(first) = requests.recv() {
            let mut batch = Vec::new();
            let mut close = None;
            match first {
                Request::Commit(r) => batch.push(r),
                Request::Close(done) => close = Some(done),
            }
            // Keep collecting while transactions that may still commit are open: the writers
            // acknowledged by the previous batch are usually about to send their next commit,
            // and one fsync for all of them beats two half-full batches.
            let shared = self.shared.upgrade();
            let deadline = Instant::now() + MAX_LINGER;
            while close.is_none() && batch.len() < MAX_BATCH {
                let next = match requests.try_recv() {
                    Ok(r) => r,
                    Err(mpsc::TryRecvError::Disconnected) => break,
                    Err(mpsc::TryRecvError::Empty) => {
                        let now = Instant::now();
                        // Writers acknowledged by the last batch may not have begun their next
                        // transaction yet, so the open count alone would close too early.
                        let nobody_left = batch.len() >= self.expected
                            && shared.as_ref().is_none_or(|s| s.open_transactions() == 0);
                        if nobody_left {
                            // A request sent just before its sender counted itself off.
                            match requests.try_recv() {
                                Ok(r) => r,
                                Err(_) => break,
                            }
                        } else if now >= deadline {
                            break;
                        } else {
                            match requests.recv_timeout(ARRIVAL_GAP.min(deadline - now)) {
                                Ok(r) => r,
                                Err(_) => break,
                            }
                        }
                    }
                };
                match next {
                    Request::Commit(r) => batch.push(r),
                    Request::Close(done) => close = Some(done),
                }
            }
            if !batch.is_empty() {
                self.expected = batch.len();
                self.process(batch);
            }
            if let Some(done) = close {
                // Requests that raced with the close were never accepted.
                while let Ok(request) = requests.try_recv() {
                    match request {
                        Request::Commit(r) => {
                            let _ = r.reply.send(Err(StoreError::Closed));
                        }
                        Request::Close(other) => {
                            let _ = other.send(Ok(()));
                        }
                    }
                }
                self.shutdown();
                let _ = done.send(Ok(()));
                return;
            }
        }
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Err(e) = self.checkpoint() {
            tracing::error!(error = %e, "embedded store: final checkpoint failed (the log keeps the commits)");
        }
        self.watches.close();
        if let Some(shared) = self.shared.upgrade() {
            shared.publish(None);
        }
        self.db = None;
    }

    /// Makes every logged batch durable in redb and empties the log.
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        if self.broken.is_some() || self.logged == 0 {
            return Ok(());
        }
        let db = self.db.as_ref().ok_or(StoreError::Closed)?;
        // An empty durable commit persists the non-durable ones before it.
        let write = db.begin_write().map_err(engine_err)?;
        write.commit().map_err(engine_err)?;
        self.logged = 0;
        self.wal.reset()
    }

    fn process(&mut self, batch: Vec<CommitRequest>) {
        if let Some(e) = &self.broken {
            for request in batch {
                let _ = request.reply.send(Err(e.clone()));
            }
            return;
        }
        let now = Instant::now();
        self.history.trim(now);
        let version = self.version + 1;
        let (accepted, batch_writes, wrote) = self.admit(batch, version);
        if accepted.is_empty() {
            return;
        }
        let mut accepted = accepted;
        let outcome = if wrote {
            self.write_batch(version, &mut accepted, &batch_writes)
                .inspect_err(|e| tracing::error!(error = %e, "embedded store: commit batch failed"))
        } else {
            self.read_latest(&mut accepted)
        };
        let current = match outcome {
            Ok(current) => current,
            Err(e) => {
                for a in accepted {
                    let _ = a.request.reply.send(Err(e.clone()));
                }
                return;
            }
        };
        if wrote {
            self.publish(version, now, batch_writes);
        }
        for a in accepted {
            let Accepted {
                request,
                stamp,
                seen,
                ..
            } = a;
            for (watch, seen) in request.watches.into_iter().zip(seen) {
                self.watches.add(watch.key, seen, watch.fire);
            }
            let _ = request.reply.send(Ok(stamp));
        }
        self.watches.settle(current);
    }

    /// Conflict-checks each request of the batch in order (against commits after its read
    /// version, and against the writes of requests admitted before it in this batch) and
    /// stamps the writers. Rejected requests are answered here. Returns the admitted
    /// requests, the batch's writes, and whether any of them writes.
    fn admit(
        &mut self,
        batch: Vec<CommitRequest>,
        version: u64,
    ) -> (Vec<Accepted>, Vec<Written>, bool) {
        let mut batch_writes: Vec<Written> = Vec::new();
        let mut accepted: Vec<Accepted> = Vec::with_capacity(batch.len());
        let mut order: u16 = 0;
        for request in batch {
            let verdict = self
                .history
                .check(request.read_version, &request.reads)
                .and_then(|()| {
                    if intersects(&request.reads, &batch_writes) {
                        Err(StoreError::Conflict)
                    } else {
                        Ok(())
                    }
                });
            if let Err(e) = verdict {
                let _ = request.reply.send(Err(e));
                continue;
            }
            if request.ops.is_empty() {
                accepted.push(Accepted {
                    request,
                    stamp: None,
                    filled_keys: Vec::new(),
                    seen: Vec::new(),
                });
                continue;
            }
            let stamp = commit_stamp(version, order);
            match writes_of(&request.ops, &stamp) {
                Ok((writes, filled_keys)) => {
                    order += 1;
                    batch_writes.extend(writes);
                    accepted.push(Accepted {
                        request,
                        stamp: Some(stamp),
                        filled_keys,
                        seen: Vec::new(),
                    });
                }
                Err(e) => {
                    let _ = request.reply.send(Err(e));
                }
            }
        }
        (accepted, batch_writes, order > 0)
    }

    /// Makes `version` the committed one: its writes join the conflict history and readers
    /// get a snapshot at it.
    fn publish(&mut self, version: u64, now: Instant, batch_writes: Vec<Written>) {
        self.version = version;
        self.history.push(version, now, batch_writes);
        if let (Some(db), Some(shared)) = (&self.db, self.shared.upgrade()) {
            match open_snapshot(db, version) {
                Ok(snapshot) => shared.publish(Some(Arc::new(snapshot))),
                // Readers keep the previous snapshot: still consistent, since conflicts
                // are checked against their (older) read version.
                Err(e) => tracing::error!(error = %e, "embedded store: no new snapshot"),
            }
        }
    }

    /// Applies the accepted requests in one redb write transaction and makes it durable: by
    /// the log, or, every [`CHECKPOINT_BATCHES`], by a durable redb commit that also covers
    /// the logged batches before it. Returns the committed values of the watched keys the
    /// batch may have changed.
    #[allow(clippy::type_complexity)]
    fn write_batch(
        &mut self,
        version: u64,
        accepted: &mut [Accepted],
        batch_writes: &[Written],
    ) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>, StoreError> {
        let db = self.db.as_ref().ok_or(StoreError::Closed)?;
        let checkpoint =
            self.logged + 1 >= CHECKPOINT_BATCHES || self.wal.bytes >= CHECKPOINT_BYTES;
        let mut write = db.begin_write().map_err(engine_err)?;
        if !checkpoint {
            write
                .set_durability(redb::Durability::None)
                .map_err(engine_err)?;
        }
        let mut effects = Vec::new();
        let current = {
            let mut table = write.open_table(DATA).map_err(engine_err)?;
            for a in accepted.iter_mut() {
                if let Some(stamp) = &a.stamp {
                    apply(
                        &mut table,
                        &a.request.ops,
                        &a.filled_keys,
                        stamp,
                        &mut effects,
                    )?;
                }
                a.seen = seen_values(&table, &a.request.watches)?;
            }
            let mut keys = BTreeSet::new();
            self.watches.touched(batch_writes.iter(), &mut keys);
            for a in accepted.iter() {
                keys.extend(a.request.watches.iter().map(|w| w.key.clone()));
            }
            let mut current = Vec::with_capacity(keys.len());
            for key in keys {
                let value = get(&table, &key)?;
                current.push((key, value));
            }
            let mut meta = write.open_table(META).map_err(engine_err)?;
            meta.insert(VERSION_KEY, version.to_be_bytes().as_slice())
                .map_err(engine_err)?;
            current
        };
        if checkpoint {
            write.commit().map_err(engine_err)?;
            self.logged = 0;
            if let Err(e) = self.wal.reset() {
                // Harmless: replay skips records the durable redb state already holds.
                tracing::warn!(error = %e, "embedded store: commit log not emptied");
            }
            return Ok(current);
        }
        // The log syncs the batch while redb commits it (without durability) here.
        let logged = self.wal.append(version, effects);
        let committed = write.commit().map_err(engine_err);
        let result = committed.and_then(|()| logged.wait(&mut self.wal));
        if let Err(e) = result {
            // redb and the log may now disagree about this version: stop committing.
            self.broken = Some(e.clone());
            return Err(e);
        }
        self.logged += 1;
        Ok(current)
    }

    /// For a batch without writes: the values its watches compare against.
    #[allow(clippy::type_complexity)]
    fn read_latest(
        &self,
        accepted: &mut [Accepted],
    ) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>, StoreError> {
        let shared = self.shared.upgrade().ok_or(StoreError::Closed)?;
        let snapshot = shared.snapshot()?;
        let mut current = Vec::new();
        for a in accepted.iter_mut() {
            a.seen = seen_values(&snapshot.table, &a.request.watches)?;
            for w in &a.request.watches {
                current.push((w.key.clone(), get(&snapshot.table, &w.key)?));
            }
        }
        Ok(current)
    }
}

fn get(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(table
        .get(key)
        .map_err(engine_err)?
        .map(|v| v.value().to_vec()))
}

/// The value each watch saw: its own write as now committed, or what it read.
fn seen_values(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    watches: &[NewWatch],
) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    watches
        .iter()
        .map(|w| match &w.seen {
            Seen::Value(v) => Ok(v.clone()),
            Seen::OwnWrite => get(table, &w.key),
        })
        .collect()
}

/// What `ops` write, for conflict checks, and the filled versionstamped keys.
fn writes_of(
    ops: &[Mutation],
    stamp: &CommitStamp,
) -> Result<(Vec<Written>, Vec<Vec<u8>>), StoreError> {
    let mut writes = Vec::with_capacity(ops.len());
    let mut filled = Vec::new();
    for op in ops {
        writes.push(match op {
            Mutation::Set(k, _)
            | Mutation::Clear(k)
            | Mutation::Add(k, _)
            | Mutation::VersionstampedValue(k, _) => Written::Key(k.clone()),
            Mutation::ClearRange(b, e) => Written::Range(b.clone(), e.clone()),
            Mutation::VersionstampedKey(operand, _) => {
                let key = fill_versionstamp(operand, stamp)?;
                filled.push(key.clone());
                Written::Key(key)
            }
        });
    }
    Ok((writes, filled))
}

/// Applies `ops` to `table`, recording their physical effects for the log.
fn apply(
    table: &mut DataTable<'_>,
    ops: &[Mutation],
    filled_keys: &[Vec<u8>],
    stamp: &CommitStamp,
    effects: &mut Vec<Effect>,
) -> Result<(), StoreError> {
    let mut filled = filled_keys.iter();
    for op in ops {
        let effect = match op {
            Mutation::Set(k, v) => Effect::Put(k.clone(), v.clone()),
            Mutation::Clear(k) => Effect::Delete(k.clone()),
            Mutation::ClearRange(b, e) => Effect::DeleteRange(b.clone(), e.clone()),
            Mutation::Add(k, delta) => Effect::Put(
                k.clone(),
                apply_atomic_add(get(table, k)?.as_deref(), *delta),
            ),
            Mutation::VersionstampedKey(_, v) => {
                let key = filled
                    .next()
                    .ok_or_else(|| StoreError::Engine("versionstamped key not filled".into()))?;
                Effect::Put(key.clone(), v.clone())
            }
            Mutation::VersionstampedValue(k, operand) => {
                Effect::Put(k.clone(), fill_versionstamp(operand, stamp)?)
            }
        };
        apply_effect(table, &effect)?;
        effects.push(effect);
    }
    Ok(())
}

/// Applies one physical effect (at commit, and when replaying the log at open).
pub(crate) fn apply_effect(table: &mut DataTable<'_>, effect: &Effect) -> Result<(), StoreError> {
    match effect {
        Effect::Put(k, v) => {
            table
                .insert(k.as_slice(), v.as_slice())
                .map_err(engine_err)?;
        }
        Effect::Delete(k) => {
            table.remove(k.as_slice()).map_err(engine_err)?;
        }
        Effect::DeleteRange(b, e) => {
            table
                .retain_in::<&[u8], _>(b.as_slice()..e.as_slice(), |_, _| false)
                .map_err(engine_err)?;
        }
    }
    Ok(())
}
