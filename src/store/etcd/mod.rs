//! The etcd engine: the store contract on an etcd v3 cluster (3.4 or later), so that several
//! `serve` processes on several machines share one couch_jobs store.
//!
//! How the contract maps onto etcd (docs/decisions/2026-11-26-etcd-store.md has the why):
//! - A transaction reads at one etcd revision `R`: [`EtcdStore::begin`] sends nothing; the
//!   first read goes out in one read-only (linearizable) `Txn` with the first reads of every
//!   transaction that began meanwhile (`read_version.rs`), and its revision is `R`; later
//!   reads are plain serializable `Range`s at `R`. A `Range` with an explicit revision is
//!   never sent inside a `Txn` (etcd issue 18667 makes members diverge on 3.4.23).
//! - With `EtcdConfig::local_reads` (the default) the first read only fetches `R` and the
//!   clock's mod revision, and every read is served by `replica.rs`, a copy of the prefix
//!   that one watch keeps, once it has applied that mod revision.
//! - A commit is one `Txn` whose compares check everything the transaction read
//!   (`conflicts.rs`): `MOD == seen` per key read (0 when absent) and `MOD < R+1` over each
//!   range read, whose rows each add their own `MOD == seen` (a range compare misses deletes).
//! - Writes (`plan.rs`): the transaction's mutation log folds into one final operation per key
//!   plus merged `DeleteRange`s, split around the keys written after a clear (etcd refuses a
//!   key written twice in one `Txn`). Atomic adds are computed from the key's current value
//!   under a `MOD ==` compare and recomputed when only that compare failed.
//! - Versionstamps come from a counter at the clock key that every writing commit advances
//!   under a `MOD ==` compare, so stamps are unique and in commit order.
//! - `committer.rs` batches one process's concurrent commits into one `Txn` when their read
//!   and write sets are disjoint, the way FoundationDB's commit proxies batch.
//! - `watches.rs` wait for a key to change from the transaction's read revision (or its
//!   commit revision for keys it wrote): served by the replica's stream when it has one
//!   (`key_watchers.rs`), else a native etcd watch, re-armed after a compaction or a lost
//!   stream.
//! - Errors (`errors.rs`): compacted revision → `TooOld`; too many operations or too large a
//!   request → `TooLarge`. A commit whose answer was lost (unavailable, timeout, lost
//!   connection) is resolved from etcd (`resolve.rs`, through the clock's nonce): landed,
//!   or `Unavailable` (retryable, it did not land), or `TimedOut` when etcd cannot tell;
//!   so `Db::run` writes no transaction ids on this engine.

mod committer;
mod config;
mod conflicts;
mod errors;
mod key_watchers;
mod plan;
mod read_version;
mod replica;
mod resolve;
mod tip;
mod tls_channel;
mod transaction;
mod watches;

pub use config::EtcdConfig;
#[cfg(any(test, feature = "internals"))]
pub use config::{DEFAULT_PIPELINE, DEFAULT_READ_PIPELINE};

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use etcd_client::{Client, GetOptions, GetResponse, KvClient};
use futures::FutureExt;
use futures::future::BoxFuture;

use self::committer::Committer;
use self::errors::read_error;
use self::read_version::ReadVersions;
use self::transaction::EtcdTx;
use super::{EngineCounter, Store, StoreError, Transaction};

/// etcd's default `--max-txn-ops`: compares, success and failure operations each.
pub const MAX_TXN_OPS: usize = 128;
/// What we send at most in one request: etcd's default `--max-request-bytes` is 1.5 MiB;
/// the margin covers the protobuf framing we do not count exactly.
pub const MAX_REQUEST_BYTES: usize = 1_400_000;

/// Where the store's keys live inside etcd: `prefix ‖ "d" ‖ key` for data, `prefix ‖ "c"`
/// for the clock, so that one etcd can hold several clusters under distinct prefixes.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    data: Vec<u8>,
    clock: Vec<u8>,
}

impl Keys {
    fn new(prefix: &[u8]) -> Self {
        let mut data = prefix.to_vec();
        data.push(b'd');
        let mut clock = prefix.to_vec();
        clock.push(b'c');
        Self { data, clock }
    }

    /// The etcd key of a store key.
    pub(crate) fn data(&self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() + key.len());
        out.extend_from_slice(&self.data);
        out.extend_from_slice(key);
        out
    }

    /// The store key of an etcd key under the data prefix.
    pub(crate) fn strip<'a>(&self, key: &'a [u8]) -> Option<&'a [u8]> {
        key.strip_prefix(self.data.as_slice())
    }

    pub(crate) fn clock(&self) -> &[u8] {
        &self.clock
    }
}

/// The clock key's value: the counter every writing commit advances by one (the
/// versionstamps), and the nonce of the `Txn` that wrote it, which tells a committer whose
/// `Txn`'s outcome was lost whether that `Txn` is the one that took the counter
/// (`resolve.rs`). Stores written before the nonce existed hold the counter alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Clock {
    pub(crate) counter: u64,
    pub(crate) nonce: u64,
}

impl Clock {
    pub(crate) fn decode(value: &[u8]) -> Self {
        let word = |at: usize| {
            let bytes = value
                .get(at..at + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok());
            bytes.map_or(0, u64::from_be_bytes)
        };
        Self {
            counter: word(0),
            nonce: word(8),
        }
    }

    /// The value that follows this one, written by a `Txn` with a fresh (non-zero) nonce.
    pub(crate) fn next(self) -> Self {
        Self {
            counter: self.counter + 1,
            nonce: rand::random::<u64>() | 1,
        }
    }

    /// The stored bytes; `None` for the clock never written. Nonce 0 is the counter alone,
    /// as stores written before the nonce hold it.
    pub(crate) fn encode(self) -> Option<Vec<u8>> {
        if self == Self::default() {
            return None;
        }
        let mut v = self.counter.to_be_bytes().to_vec();
        if self.nonce != 0 {
            v.extend_from_slice(&self.nonce.to_be_bytes());
        }
        Some(v)
    }
}

/// What the engine did, for benchmarks and logs.
#[derive(Debug, Default)]
pub struct EtcdStats {
    /// Commit `Txn`s sent.
    pub txns: AtomicU64,
    /// Transactions those `Txn`s committed (more than `txns` when batches formed).
    pub committed: AtomicU64,
    /// `Txn`s that failed on a read conflict.
    pub conflicts: AtomicU64,
    /// `Txn`s rebuilt because only the clock or an added key had moved.
    pub rebuilds: AtomicU64,
    /// Read-version `Txn`s sent, each carrying the first reads of the transactions that
    /// began while the one before was in flight.
    pub read_versions: AtomicU64,
    /// Reads sent on their own: a transaction's later reads at its revision, and the
    /// committer's reads of the clock.
    pub reads: AtomicU64,
    /// Write operations (puts and deletes, the clock's included) in the commit `Txn`s sent.
    pub writes: AtomicU64,
    /// Compares in the commit `Txn`s sent.
    pub compares: AtomicU64,
    /// Commit `Txn`s whose answer was lost, resolved from etcd (`resolve.rs`).
    pub lost: AtomicU64,
    /// Reads the local replica served.
    pub local_reads: AtomicU64,
    /// Transactions whose read version the replica could not serve (they read from etcd).
    pub replica_misses: AtomicU64,
    /// Microseconds transactions waited for the replica to apply their read version.
    pub replica_wait_us: AtomicU64,
    /// Store watches the local replica served.
    pub replica_watches: AtomicU64,
    /// Store watches sent to etcd as watches of their own (the replica could not tell).
    pub native_watches: AtomicU64,
}

impl EtcdStats {
    /// Every counter, named for `/metrics`.
    pub fn counters(&self) -> Vec<EngineCounter> {
        let counter = |name, help, value: &AtomicU64| EngineCounter {
            name,
            help,
            value: value.load(Ordering::Relaxed),
        };
        vec![
            counter("txns", "commit Txns sent to etcd", &self.txns),
            counter(
                "committed",
                "transactions those Txns committed",
                &self.committed,
            ),
            counter(
                "conflicts",
                "transactions that failed a read compare",
                &self.conflicts,
            ),
            counter(
                "rebuilds",
                "commit Txns rebuilt on a moved clock or added key",
                &self.rebuilds,
            ),
            counter(
                "read_versions",
                "read-version Txns sent",
                &self.read_versions,
            ),
            counter("reads", "reads sent to etcd on their own", &self.reads),
            counter(
                "writes",
                "puts and deletes in the commit Txns",
                &self.writes,
            ),
            counter("compares", "compares in the commit Txns", &self.compares),
            counter(
                "lost",
                "commit Txns whose answer was lost, resolved from etcd",
                &self.lost,
            ),
            counter(
                "local_reads",
                "reads the local replica served",
                &self.local_reads,
            ),
            counter(
                "replica_misses",
                "transactions that read from etcd, the replica behind",
                &self.replica_misses,
            ),
            counter(
                "replica_watches",
                "store watches the local replica served",
                &self.replica_watches,
            ),
            counter(
                "native_watches",
                "store watches sent to etcd as watches of their own",
                &self.native_watches,
            ),
            counter(
                "replica_wait_us",
                "microseconds transactions waited for the replica",
                &self.replica_wait_us,
            ),
        ]
    }

    /// Requests sent to etcd (commits, read versions, reads; not watches).
    pub fn requests(&self) -> u64 {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        get(&self.txns) + get(&self.read_versions) + get(&self.reads)
    }

    /// A one-line summary: every counter of [`EtcdStats::counters`], value then name.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .counters()
            .iter()
            .map(|c| format!("{} {}", c.value, c.name))
            .collect();
        parts.join(", ")
    }
}

pub(crate) struct Shared {
    pub(crate) stats: EtcdStats,
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    /// The clock and added keys as the committer predicts them.
    pub(crate) tip: tip::Tip,
    /// Commit `Txn`s in flight at most.
    pub(crate) pipeline: usize,
    /// First-read `Txn`s in flight at most.
    pub(crate) read_pipeline: usize,
    /// The newest revision any answer carried (a revision that existed before now).
    latest: AtomicI64,
    /// The local replica reads are served from, when enabled (`EtcdConfig::local_reads`).
    pub(crate) replica: Option<Arc<replica::Replica>>,
}

impl Shared {
    pub(crate) fn kv(&self) -> KvClient {
        self.client.kv_client()
    }

    /// The newest revision an answer carried so far.
    pub(crate) fn latest(&self) -> i64 {
        self.latest.load(Ordering::Relaxed)
    }

    /// Notes the revision in an answer's header.
    pub(crate) fn saw(&self, header: Option<&etcd_client::ResponseHeader>) {
        if let Some(h) = header {
            self.latest.fetch_max(h.revision(), Ordering::Relaxed);
        }
    }

    /// A read at an explicit revision (never inside a `Txn`). Served by whichever member the
    /// client picked without a quorum round (`serializable`): the state at a revision is the
    /// same on every member that has applied it; a member that has not yet refuses with
    /// "future revision", and the read goes linearizable.
    pub(crate) async fn read_at(
        &self,
        key: Vec<u8>,
        options: GetOptions,
    ) -> Result<GetResponse, StoreError> {
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        match self
            .kv()
            .get(key.clone(), Some(options.clone().with_serializable()))
            .await
        {
            Ok(resp) => {
                self.saw(resp.header());
                Ok(resp)
            }
            Err(e) if errors::is_future_revision(&e) => {
                let resp = self
                    .kv()
                    .get(key, Some(options))
                    .await
                    .map_err(read_error)?;
                self.saw(resp.header());
                Ok(resp)
            }
            Err(e) => Err(read_error(e)),
        }
    }
}

/// An etcd cluster as a [`Store`]. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    shared: Arc<Shared>,
    committer: Committer,
    versions: ReadVersions,
    /// Stops the replica's task with the last handle.
    _replica: Option<Arc<replica::ReplicaTask>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster and checks it answers (one read of the clock key).
    pub async fn connect(config: &EtcdConfig) -> Result<Self, StoreError> {
        let client = config.client().await?;
        let keys = Keys::new(config.prefix.as_bytes());
        let (replica, task) = match config.local_reads {
            true => {
                let (replica, task) =
                    replica::Replica::start(client.clone(), config.prefix.as_bytes().to_vec());
                (Some(replica), Some(Arc::new(task)))
            }
            false => (None, None),
        };
        let shared = Arc::new(Shared {
            stats: EtcdStats::default(),
            client,
            keys,
            tip: tip::Tip::default(),
            pipeline: config.pipeline,
            read_pipeline: config.read_pipeline,
            latest: AtomicI64::new(0),
            replica,
        });
        read_version::read_version(&shared).await?;
        Ok(Self {
            committer: Committer::start(shared.clone()),
            versions: ReadVersions::start(shared.clone()),
            shared,
            _replica: task,
        })
    }
}

impl EtcdStore {
    /// Counters of what this store handle (and its clones) did.
    pub fn stats(&self) -> &EtcdStats {
        &self.shared.stats
    }

    /// Times the local replica loaded the prefix: 1 once started, one more after each
    /// compaction that removed revisions its watch had not applied (0 without a replica).
    pub fn replica_loads(&self) -> u64 {
        let loads = self.shared.replica.as_ref().map(|r| &r.loads);
        loads.map_or(0, |l| l.load(Ordering::Relaxed))
    }
}

impl Store for EtcdStore {
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn Transaction>, StoreError>> {
        async move {
            // No request: the read version comes with the first read (`read_version.rs`).
            let tx: Box<dyn Transaction> = Box::new(EtcdTx::new(
                self.shared.clone(),
                self.committer.clone(),
                self.versions.clone(),
            ));
            Ok(tx)
        }
        .boxed()
    }

    fn engine_name(&self) -> &'static str {
        "etcd"
    }

    fn resolves_lost_commits(&self) -> bool {
        true
    }

    fn counters(&self) -> Vec<EngineCounter> {
        self.shared.stats.counters()
    }
}
