//! The FoundationDB engine (cargo feature `fdb`): a thin adapter from our [`Store`] /
//! [`Transaction`] contract onto the `foundationdb` crate, because the contract *is*
//! FoundationDB's and the adapter should add nothing of its own.
//!
//! - [`boot_network`] starts the client's network thread once per process (FDB allows one);
//!   [`stop_network`] stops it before the process exits.
//! - [`FdbStore`] opens a cluster and hands out [`FdbTx`] transactions.
//! - Retries: [`crate::store::Db::run`] plays the part of FDB's `db.run`: every FDB error is
//!   mapped by [`super::fdb_errors::classify`] with FDB's own "retryable" and
//!   "maybe committed" predicates, so the loop retries exactly what FDB's loop would (1020,
//!   1007, 1021/1039 and 1031 become [`StoreError::Conflict`], [`StoreError::TooOld`],
//!   [`StoreError::CommitUnknown`] and [`StoreError::TimedOut`]).
//! - Transaction options: every transaction gets CouchDB's `[fdb_tx_options]`
//!   ([`FdbTxOptions`]: timeout, retry limit, max retry delay, size limit), the same limits
//!   [`crate::store::RetryPolicy`] enforces for the other engines.
//! - Reads and writes map one to one: snapshot flag, `add_conflict_range(Read)`,
//!   `MutationType::{Add, SetVersionstampedKey, SetVersionstampedValue}`, `watch`. The
//!   commit's versionstamp comes from `get_versionstamp`, requested before the commit.
//!
//! The FDB client library (`libfdb_c`) must be installed where this runs; building only needs
//! the headers the crate embeds.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use foundationdb::options::{ConflictRangeType, MutationType, StreamingMode, TransactionOption};
use foundationdb::{FdbError, RangeOption};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::fdb_errors::classify;
use super::{CommitStamp, KeyValue, RangeOptions, Store, StoreError, Transaction, Watch};

/// Maps an FDB error onto the contract's errors with FDB's own predicates.
pub(crate) fn map_error(e: FdbError) -> StoreError {
    classify(
        e.code(),
        e.message(),
        e.is_retryable(),
        e.is_maybe_committed(),
    )
}

/// The transaction options set on every transaction (CouchDB's `[fdb_tx_options]`
/// defaults). `timeout` and the retry limit span retries (API version ≥ 610).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdbTxOptions {
    /// `timeout`: a transaction with its retries fails with 1031 after this (FDB counts
    /// whole milliseconds, at most `i32::MAX`).
    pub timeout: Duration,
    /// `retry_limit`: retries before the last error is returned.
    pub retry_limit: i32,
    /// `max_retry_delay`: the ceiling of FDB's own retry backoff (whole milliseconds).
    pub max_retry_delay: Duration,
    /// At most 10,000,000 (FDB's own ceiling).
    pub size_limit: i32,
}

impl Default for FdbTxOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            retry_limit: 100,
            max_retry_delay: Duration::from_secs(1),
            size_limit: 10_000_000,
        }
    }
}

/// FDB's options take milliseconds as an `i32`; longer times are capped.
fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

impl FdbTxOptions {
    fn apply(&self, tx: &foundationdb::Transaction) -> Result<(), StoreError> {
        for option in [
            TransactionOption::Timeout(millis(self.timeout)),
            TransactionOption::RetryLimit(self.retry_limit),
            TransactionOption::MaxRetryDelay(millis(self.max_retry_delay)),
            TransactionOption::SizeLimit(self.size_limit),
        ] {
            tx.set_option(option).map_err(map_error)?;
        }
        Ok(())
    }
}

/// The running network thread, kept until [`stop_network`].
static NETWORK: OnceLock<Mutex<Option<foundationdb::api::NetworkAutoStop>>> = OnceLock::new();
/// The outcome of the one allowed network start.
static BOOTED: OnceLock<Result<(), StoreError>> = OnceLock::new();

/// Starts FDB's client network thread; later calls return the first call's outcome (the C
/// client allows one start per process).
pub fn boot_network() -> Result<(), StoreError> {
    BOOTED
        .get_or_init(|| {
            let builder = foundationdb::api::FdbApiBuilder::default()
                .build()
                .map_err(map_error)?;
            // SAFETY: the returned guard must be dropped (which stops the network) before the
            // process exits; it is kept in NETWORK and dropped by `stop_network`. A process
            // that exits without calling it only skips a clean client shutdown.
            let guard = unsafe { builder.boot() }.map_err(map_error)?;
            NETWORK.get_or_init(|| Mutex::new(Some(guard)));
            Ok(())
        })
        .clone()
}

/// Stops the network thread started by [`boot_network`]. No FDB call works afterwards, and
/// the network cannot be started again in this process.
pub fn stop_network() {
    if let Some(network) = NETWORK.get() {
        let guard = network.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(guard);
    }
}

/// A FoundationDB cluster as a [`Store`]. Cheap to clone.
#[derive(Clone)]
pub struct FdbStore {
    db: Arc<foundationdb::Database>,
    options: FdbTxOptions,
}

impl std::fmt::Debug for FdbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdbStore").finish_non_exhaustive()
    }
}

impl FdbStore {
    /// Opens the cluster named by `cluster_file` (the default cluster file when `None`).
    /// [`boot_network`] must have succeeded first.
    pub fn open(cluster_file: Option<&str>) -> Result<Self, StoreError> {
        if BOOTED.get().is_none() {
            return Err(StoreError::Invalid(
                "boot_network must run before FdbStore::open".into(),
            ));
        }
        let db = foundationdb::Database::new(cluster_file).map_err(map_error)?;
        Ok(Self {
            db: Arc::new(db),
            options: FdbTxOptions::default(),
        })
    }
}

impl Store for FdbStore {
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn Transaction>, StoreError>> {
        let result = self.db.create_trx().map_err(map_error).and_then(|tx| {
            self.options.apply(&tx)?;
            let tx: Box<dyn Transaction> = Box::new(FdbTx::new(tx));
            Ok(tx)
        });
        futures::future::ready(result).boxed()
    }

    fn engine_name(&self) -> &'static str {
        "foundationdb"
    }
}

struct TxState {
    /// `None` once the commit started.
    tx: Option<foundationdb::Transaction>,
    wrote: bool,
    /// The first failure of a call that cannot return one; reported by `commit`.
    deferred: Option<StoreError>,
}

/// One FDB transaction behind the contract. FDB futures do not borrow the transaction, so the
/// lock is held only while a call is issued, never across an await.
pub struct FdbTx {
    state: Mutex<TxState>,
}

fn finished() -> StoreError {
    StoreError::Invalid("transaction already committed".into())
}

impl FdbTx {
    fn new(tx: foundationdb::Transaction) -> Self {
        Self {
            state: Mutex::new(TxState {
                tx: Some(tx),
                wrote: false,
                deferred: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, TxState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Issues a write; a write after the commit started is an error reported by nothing (the
    /// commit already ran), as in FDB where it would be ignored with `used_during_commit`.
    fn write(&self, op: impl FnOnce(&foundationdb::Transaction)) {
        let mut state = self.state();
        match state.tx.as_ref() {
            Some(tx) => {
                op(tx);
                state.wrote = true;
            }
            None => tracing::warn!("foundationdb: write after commit ignored"),
        }
    }

    async fn read_range(
        &self,
        begin: &[u8],
        end: &[u8],
        options: RangeOptions,
    ) -> Result<Vec<KeyValue>, StoreError> {
        // FDB reads a limit of 0 as "no limit" and rejects inverted ranges: both are empty here.
        if begin >= end || options.limit == Some(0) {
            return Ok(Vec::new());
        }
        let mut next = Some(RangeOption {
            limit: options.limit,
            reverse: options.reverse,
            mode: StreamingMode::Iterator,
            ..RangeOption::from((begin, end))
        });
        let mut rows = Vec::new();
        let mut iteration = 1;
        while let Some(range) = next.take() {
            let fetch = {
                let state = self.state();
                let tx = state.tx.as_ref().ok_or_else(finished)?;
                tx.get_range(&range, iteration, options.snapshot)
            };
            let values = fetch.await.map_err(map_error)?;
            rows.extend(values.iter().map(|kv| KeyValue {
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
            }));
            next = range.next_range(&values);
            iteration += 1;
        }
        Ok(rows)
    }

    async fn finish_commit(&self) -> Result<Option<CommitStamp>, StoreError> {
        let (tx, wrote) = {
            let mut state = self.state();
            if let Some(e) = state.deferred.take() {
                return Err(e);
            }
            (state.tx.take().ok_or_else(finished)?, state.wrote)
        };
        // Requested before the commit; it resolves once the commit is done.
        let stamp = wrote.then(|| tx.get_versionstamp());
        tx.commit()
            .await
            .map_err(|e| map_error(FdbError::from(e)))?;
        let Some(stamp) = stamp else {
            return Ok(None);
        };
        // The commit succeeded: failing now would make `Db::run` commit the body twice.
        match stamp.await {
            Ok(bytes) => match <CommitStamp>::try_from(&bytes[..]) {
                Ok(stamp) => Ok(Some(stamp)),
                Err(_) => {
                    tracing::warn!(len = bytes.len(), "foundationdb: odd versionstamp length");
                    Ok(None)
                }
            },
            Err(e) => {
                // FDB turns writes that change nothing into a read-only commit (no stamp).
                tracing::debug!(error = %e, "foundationdb: commit has no versionstamp");
                Ok(None)
            }
        }
    }
}

impl Transaction for FdbTx {
    fn get<'a>(
        &'a self,
        key: &'a [u8],
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        let fetch = {
            let state = self.state();
            state.tx.as_ref().map(|tx| tx.get(key, snapshot))
        };
        async move {
            let fetch = fetch.ok_or_else(finished)?;
            let value = fetch.await.map_err(map_error)?;
            Ok(value.map(|v| v.to_vec()))
        }
        .boxed()
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
        self.write(|tx| tx.set(key, value));
    }

    fn clear(&self, key: &[u8]) {
        self.write(|tx| tx.clear(key));
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        if begin < end {
            self.write(|tx| tx.clear_range(begin, end));
        }
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.write(|tx| tx.atomic_op(key, &delta.to_le_bytes(), MutationType::Add));
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.write(|tx| tx.atomic_op(key, value, MutationType::SetVersionstampedKey));
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.write(|tx| tx.atomic_op(key, value, MutationType::SetVersionstampedValue));
    }

    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) {
        if begin >= end {
            return;
        }
        let mut state = self.state();
        let result = match state.tx.as_ref() {
            Some(tx) => tx
                .add_conflict_range(begin, end, ConflictRangeType::Read)
                .map_err(map_error),
            None => Err(finished()),
        };
        if let Err(e) = result
            && state.deferred.is_none()
        {
            state.deferred = Some(e);
        }
    }

    fn watch(&self, key: &[u8]) -> Watch {
        let watch = {
            let state = self.state();
            state.tx.as_ref().map(|tx| tx.watch(key))
        };
        async move {
            match watch {
                Some(watch) => watch.await.map_err(map_error),
                None => Err(finished()),
            }
        }
        .boxed()
    }

    fn commit(&self) -> BoxFuture<'_, Result<Option<CommitStamp>, StoreError>> {
        self.finish_commit().boxed()
    }
}
