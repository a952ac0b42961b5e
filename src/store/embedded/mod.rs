//! The embedded engine: FoundationDB's transaction semantics in one process, durable on disk
//! with `redb` (docs/architecture.md, "The store contract").
//!
//! - [`EmbeddedStore`] (this file) opens the file, hands out transactions that read from the
//!   latest committed snapshot, and owns the committer thread.
//! - `transaction` runs one optimistic transaction: snapshot reads, read-your-writes,
//!   read-conflict ranges, buffered writes.
//! - `committer` batches commit requests, checks conflicts (`conflicts`), applies a batch
//!   in one redb transaction made durable by one fsync (group commit), assigns versionstamps
//!   and fires watches (`watches`).
//! - `writes` is a transaction's write buffer.
//! - `wal` is the commit log (`<file>.wal`) that makes batches durable between redb
//!   checkpoints; `open` replays it onto redb after a crash.
//!
//! Versions: the committed version is a counter persisted with the data, bumped once per
//! batch that writes; a transaction's read version is the committed version of the snapshot
//! it reads, taken together with that snapshot under one lock.

mod committer;
mod conflicts;
mod transaction;
mod wal;
mod watches;
pub(crate) mod writes;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};

use futures::FutureExt;
use futures::future::BoxFuture;
use redb::{ReadOnlyTable, ReadableDatabase, TableDefinition};
use tokio::sync::oneshot;

use super::{Store, StoreError, Transaction};
use committer::{Committer, Request, apply_effect};
use transaction::EmbeddedTx;
use wal::{LogWriter, Wal};

/// Every user key and value.
pub(crate) const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("data");
/// Engine metadata: `version` = the committed version, 8 bytes big-endian.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(crate) const VERSION_KEY: &str = "version";

/// A committed state: its version and a read-only view of it.
pub(crate) struct Snapshot {
    pub version: u64,
    pub table: ReadOnlyTable<&'static [u8], &'static [u8]>,
}

/// What transactions and the store handle share.
pub(crate) struct Shared {
    /// The latest committed snapshot; `None` once the store is closed.
    current: Mutex<Option<Arc<Snapshot>>>,
    requests: Mutex<Option<mpsc::Sender<Request>>>,
    /// Transactions begun and neither submitted for commit nor dropped: the committer stops
    /// waiting for more requests to join a batch when none is left.
    open: AtomicUsize,
}

impl Shared {
    fn current(&self) -> MutexGuard<'_, Option<Arc<Snapshot>>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn snapshot(&self) -> Result<Arc<Snapshot>, StoreError> {
        self.current().clone().ok_or(StoreError::Closed)
    }

    pub(crate) fn open_transactions(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    pub(crate) fn publish(&self, snapshot: Option<Arc<Snapshot>>) {
        *self.current() = snapshot;
    }

    pub(crate) fn send(&self, request: Request) -> Result<(), StoreError> {
        let requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        match requests.as_ref() {
            Some(tx) => tx.send(request).map_err(|_| StoreError::Closed),
            None => Err(StoreError::Closed),
        }
    }
}

/// The embedded engine. Cheap to clone; clones share the open file and the committer.
#[derive(Clone)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

pub(crate) fn engine_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Engine(e.to_string())
}

impl EmbeddedStore {
    /// Opens the store at `path`, creating the file if it does not exist. Blocks while redb
    /// opens (and, after a crash, repairs) the file: call it from `spawn_blocking` if that
    /// matters to the caller.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let db = redb::Database::create(path.as_ref()).map_err(engine_err)?;
        let (mut wal, records) = Wal::open(Wal::path_for(path.as_ref()))?;
        let version = {
            let w = db.begin_write().map_err(engine_err)?;
            let version = {
                let mut data = w.open_table(DATA).map_err(engine_err)?;
                let mut meta = w.open_table(META).map_err(engine_err)?;
                let durable = read_version(&meta)?;
                // Batches acknowledged after the last checkpoint live only in the log.
                let mut version = durable;
                for record in records.iter().filter(|r| r.version > durable) {
                    for effect in &record.effects {
                        apply_effect(&mut data, effect)?;
                    }
                    version = record.version;
                }
                if version > durable {
                    tracing::info!(
                        from = durable,
                        to = version,
                        "embedded store: replayed commit log"
                    );
                    meta.insert(VERSION_KEY, version.to_be_bytes().as_slice())
                        .map_err(engine_err)?;
                }
                version
            };
            w.commit().map_err(engine_err)?;
            version
        };
        wal.reset()?;
        let snapshot = open_snapshot(&db, version)?;
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            current: Mutex::new(Some(Arc::new(snapshot))),
            requests: Mutex::new(Some(tx)),
            open: AtomicUsize::new(0),
        });
        let committer =
            Committer::new(db, version, Arc::downgrade(&shared), LogWriter::start(wal)?);
        std::thread::Builder::new()
            .name("store-committer".into())
            .spawn(move || committer.run(rx))
            .map_err(engine_err)?;
        Ok(Self { shared })
    }

    /// Closes the store: commits already requested finish, later ones and new transactions
    /// get [`StoreError::Closed`], watches resolve with [`StoreError::Closed`], and the file is
    /// released once the transactions still alive are dropped.
    pub async fn close(&self) -> Result<(), StoreError> {
        let (done, closed) = oneshot::channel();
        let sent = self.shared.send(Request::Close(done));
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match sent {
            Ok(()) => closed.await.map_err(|_| StoreError::Closed)?,
            Err(_) => Ok(()),
        }
    }
}

pub(crate) fn read_version(
    meta: &impl redb::ReadableTable<&'static str, &'static [u8]>,
) -> Result<u64, StoreError> {
    match meta.get(VERSION_KEY).map_err(engine_err)? {
        None => Ok(0),
        Some(v) => {
            let bytes: [u8; 8] = v
                .value()
                .try_into()
                .map_err(|_| StoreError::Engine("corrupt store: version is not 8 bytes".into()))?;
            Ok(u64::from_be_bytes(bytes))
        }
    }
}

pub(crate) fn open_snapshot(db: &redb::Database, version: u64) -> Result<Snapshot, StoreError> {
    let read = db.begin_read().map_err(engine_err)?;
    let table = read.open_table(DATA).map_err(engine_err)?;
    Ok(Snapshot { version, table })
}

impl Store for EmbeddedStore {
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn Transaction>, StoreError>> {
        let result = self.shared.snapshot().map(|snapshot| {
            let tx: Box<dyn Transaction> = Box::new(EmbeddedTx::new(self.shared.clone(), snapshot));
            tx
        });
        futures::future::ready(result).boxed()
    }

    fn engine_name(&self) -> &'static str {
        "embedded"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Db;

    /// A leaked count would make every batch wait for a transaction that never comes.
    #[tokio::test]
    async fn open_transactions_are_counted_until_submitted_or_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("s.redb")).unwrap();
        let db = Db::new(Arc::new(store.clone()));
        let open = || store.shared.open_transactions();
        let (a, b, c) = (
            db.begin().await.unwrap(),
            db.begin().await.unwrap(),
            db.begin().await.unwrap(),
        );
        assert_eq!(open(), 3);
        a.set(b"k", b"v");
        a.commit().await.unwrap();
        assert_eq!(open(), 2, "a submitted commit no longer counts");
        assert_eq!(b.commit().await.unwrap(), None);
        assert_eq!(open(), 1, "a read-only commit no longer counts");
        drop(a);
        drop(b);
        assert_eq!(open(), 1);
        c.set(b"k", b"w");
        drop(c);
        assert_eq!(open(), 0, "a dropped transaction no longer counts");
        let failed = db.begin().await.unwrap();
        failed.commit().await.unwrap();
        assert!(failed.commit().await.is_err(), "second commit fails");
        assert_eq!(open(), 0, "counted off once");
        store.close().await.unwrap();
    }
}
