//! The transactional ordered key-value contract that couch_jobs is built on.
//!
//! The contract *is* FoundationDB's (docs/architecture.md, "The store contract"): serializable interactive
//! transactions that are retried on conflict, ordered keys, `get`/`get_range` (limit, reverse,
//! snapshot), `set`/`clear`/`clear_range`, atomic `add`, versionstamped keys and values (a
//! 10-byte commit version + batch order, unique and increasing per commit), explicit read
//! conflict ranges and watches that fire after a commit changes a key.
//!
//! Engines implement [`Store`] and [`Transaction`]; everything above uses the cheap-to-clone
//! [`Db`] handle and its [`Db::run`] retry loop. Keys are built with the FDB tuple layer
//! ([`foundationdb_tuple`]), re-exported here as [`tuple`](mod@tuple).
//!
//! Versionstamped operations take their operand in FDB's wire form: the key (or value)
//! contains a 10-byte placeholder and ends with a 4-byte little-endian offset of that
//! placeholder, which is what [`tuple::pack_with_versionstamp`] produces. The engine replaces
//! the placeholder with the commit's versionstamp and drops the offset.

mod db;
pub mod embedded;
pub mod etcd;
// Fault injection for the crate's tests; production code never wraps a store in it.
#[cfg(any(test, feature = "internals"))]
pub mod faulty;
#[cfg(feature = "fdb")]
pub mod fdb;
// The FDB adapter's error mapping, which the fault injector shares.
#[cfg(any(feature = "fdb", test, feature = "internals"))]
pub(crate) mod fdb_errors;
mod idempotent;
pub mod memory;

pub use db::{Db, RetryPolicy};
#[cfg(any(test, feature = "internals"))]
pub use idempotent::TX_IDS;

use std::sync::Arc;

use futures::future::BoxFuture;

pub use foundationdb_tuple as tuple;

/// The 10 bytes FoundationDB assigns to a commit: 8-byte big-endian commit version followed by
/// a 2-byte big-endian order within the commit batch. Byte-wise order is commit order.
pub type CommitStamp = [u8; 10];

/// One key and its value, as returned by range reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyValue {
    /// The key, in the store's byte order.
    pub key: Vec<u8>,
    /// The value stored under `key`.
    pub value: Vec<u8>,
}

/// How a range read behaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeOptions {
    /// At most this many rows (`None` = all).
    pub limit: Option<usize>,
    /// Return rows from the end of the range backwards (the limit then keeps the last rows).
    pub reverse: bool,
    /// Snapshot read: adds no read-conflict range, so it never causes a conflict.
    pub snapshot: bool,
}

impl RangeOptions {
    /// A serializable (conflict-checked) read of the whole range.
    pub fn all() -> Self {
        Self::default()
    }

    /// Returns at most `limit` rows.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Reads the range from its end backwards.
    pub fn reverse(mut self) -> Self {
        self.reverse = true;
        self
    }

    /// Reads without adding a read-conflict range, so the read never makes the transaction conflict.
    pub fn snapshot(mut self) -> Self {
        self.snapshot = true;
        self
    }
}

/// What can go wrong in the store. [`StoreError::is_retryable`] tells the retry loop which
/// errors mean "run the transaction again".
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// Another transaction committed a write to something this one read (FDB 1020).
    #[error("transaction conflict (not committed)")]
    Conflict,
    /// The transaction's read version is too old to be served any more (FDB 1007).
    #[error("transaction too old")]
    TooOld,
    /// The commit may or may not have been applied (FDB 1021 `commit_unknown_result`).
    /// Retryable, but only by a loop that can tell whether the first attempt landed:
    /// [`Db::run`] does, with a transaction id written in the same commit.
    #[error("commit result unknown (it may or may not have been applied)")]
    CommitUnknown,
    /// The transaction ran past its timeout (FDB 1031 `transaction_timed_out`, or
    /// [`RetryPolicy::timeout`] in [`Db::run`]). Not retried; a commit it interrupted may
    /// or may not have been applied.
    #[error("transaction timed out")]
    TimedOut,
    /// The transaction writes more than the engine accepts in one commit (FDB 2101).
    #[error("transaction too large: {0}")]
    TooLarge(String),
    /// A key or value the contract does not allow (bad versionstamp offset, too big, ...).
    #[error("invalid operation: {0}")]
    Invalid(String),
    /// The store cannot be reached now (etcd without a leader or quorum, connection lost)
    /// before anything was sent that could commit. Retryable.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store was closed, or its committer is gone.
    #[error("store closed")]
    Closed,
    /// The engine failed (I/O, corrupt file, ...). Not retryable.
    #[error("store engine error: {0}")]
    Engine(String),
    /// An error from FoundationDB itself.
    #[error("foundationdb error {code}: {message}")]
    Fdb {
        /// FoundationDB's numeric error code.
        code: i32,
        /// FoundationDB's description of the error.
        message: String,
        /// Whether FoundationDB marks the error as retryable (its `on_error` would retry).
        retryable: bool,
    },
}

impl StoreError {
    /// Whether running the transaction again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Conflict
            | StoreError::TooOld
            | StoreError::CommitUnknown
            | StoreError::Unavailable(_) => true,
            StoreError::Fdb { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

/// Errors returned from a [`Db::run`] closure must say whether they are a retryable store
/// error, so that layers above can use their own error types inside transactions.
pub trait RetryableError: From<StoreError> {
    /// Whether [`Db::run`] should run the transaction again after this error.
    fn is_retryable(&self) -> bool;
}

impl RetryableError for StoreError {
    fn is_retryable(&self) -> bool {
        StoreError::is_retryable(self)
    }
}

/// A future that resolves once a watched key changed after the watching transaction committed
/// (or with an error if the store closed). Dropping it cancels the watch.
pub type Watch = BoxFuture<'static, Result<(), StoreError>>;

/// One interactive transaction. Reads see the database as of the transaction's read version
/// plus the transaction's own writes; writes are buffered until [`Transaction::commit`].
pub trait Transaction: Send + Sync {
    /// The value of `key`, or `None`. A non-snapshot read adds `key` to the read-conflict set.
    fn get<'a>(
        &'a self,
        key: &'a [u8],
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>>;

    /// Rows with `begin <= key < end`, in key order (or reversed), at most `limit`. A
    /// non-snapshot read adds the part of the range it actually covered to the conflict set.
    fn get_range<'a>(
        &'a self,
        begin: &'a [u8],
        end: &'a [u8],
        options: RangeOptions,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>, StoreError>>;

    /// Writes `value` under `key` (buffered until commit; a blind write adds no read conflict).
    fn set(&self, key: &[u8], value: &[u8]);
    /// Removes `key` if present (buffered until commit).
    fn clear(&self, key: &[u8]);
    /// Clears every key with `begin <= key < end`.
    fn clear_range(&self, begin: &[u8], end: &[u8]);
    /// Adds `delta` to the little-endian 64-bit integer at `key` (missing = 0) without reading
    /// it: a blind write that never conflicts.
    fn atomic_add(&self, key: &[u8], delta: i64);
    /// Writes `value` under a key whose placeholder is replaced by the commit's versionstamp.
    /// `key` ends with the 4-byte little-endian placeholder offset.
    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]);
    /// Writes a value whose placeholder is replaced by the commit's versionstamp. `value` ends
    /// with the 4-byte little-endian placeholder offset.
    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]);
    /// Makes the transaction conflict with any later-committed write in `begin..end`.
    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]);
    /// Watches `key`: the returned future resolves after this transaction commits and a later
    /// commit changes the key's value (or at once if it already has).
    fn watch(&self, key: &[u8]) -> Watch;
    /// Commits. Returns the commit's stamp, or `None` for a transaction that wrote nothing.
    fn commit(&self) -> BoxFuture<'_, Result<Option<CommitStamp>, StoreError>>;

    /// Conflicts on exactly `key`.
    fn add_read_conflict_key(&self, key: &[u8]) {
        let mut end = key.to_vec();
        end.push(0);
        self.add_read_conflict_range(key, &end);
    }
}

/// One of an engine's own counters (requests it sent, conflicts it met, ...), which the node
/// exposes as `couch_replicator_store_{engine}_{name}_total` on `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineCounter {
    /// A Prometheus name part: lower case and underscores.
    pub name: &'static str,
    /// What it counts, one line.
    pub help: &'static str,
    /// Its value since the store was opened.
    pub value: u64,
}

/// An engine: a source of transactions.
pub trait Store: Send + Sync + 'static {
    /// Starts a transaction at the current read version.
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn Transaction>, StoreError>>;
    /// A short name for logs ("embedded", "memory", "foundationdb", "etcd").
    fn engine_name(&self) -> &'static str;
    /// Whether the engine learns by itself what became of a commit whose answer was lost,
    /// and so never returns [`StoreError::CommitUnknown`]: [`Db::run`] then writes no
    /// transaction id. `false` unless an engine says so.
    fn resolves_lost_commits(&self) -> bool {
        false
    }
    /// The engine's own counters (none unless an engine keeps some).
    fn counters(&self) -> Vec<EngineCounter> {
        Vec::new()
    }
}

/// A transaction handle that can be moved into async closures.
pub type Tx = Arc<dyn Transaction>;

/// The first key after every key that starts with `prefix` (FDB's `strinc`), or `None` when the
/// prefix is empty or all `0xFF`.
pub fn strinc(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last != 0xFF {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

/// Splits a versionstamp-operand (`bytes ‖ offset_le32`) into the bytes and the placeholder
/// offset, checking the placeholder fits. Engines share this to validate the wire form.
pub fn split_versionstamp_operand(operand: &[u8]) -> Result<(&[u8], usize), StoreError> {
    if operand.len() < 4 {
        return Err(StoreError::Invalid(
            "versionstamp operand shorter than its 4-byte offset".into(),
        ));
    }
    let (bytes, offset) = operand.split_at(operand.len() - 4);
    let offset = u32::from_le_bytes([offset[0], offset[1], offset[2], offset[3]]) as usize;
    if offset.checked_add(10).is_none_or(|end| end > bytes.len()) {
        return Err(StoreError::Invalid(format!(
            "versionstamp offset {offset} does not fit in {} bytes",
            bytes.len()
        )));
    }
    Ok((bytes, offset))
}

/// Fills a validated versionstamp operand with `stamp`.
pub(crate) fn fill_versionstamp(
    operand: &[u8],
    stamp: &CommitStamp,
) -> Result<Vec<u8>, StoreError> {
    let (bytes, offset) = split_versionstamp_operand(operand)?;
    let mut out = bytes.to_vec();
    out[offset..offset + 10].copy_from_slice(stamp);
    Ok(out)
}

/// Builds a [`CommitStamp`] from a commit version and the order within its batch.
pub(crate) fn commit_stamp(version: u64, order: u16) -> CommitStamp {
    let mut stamp = [0u8; 10];
    stamp[..8].copy_from_slice(&version.to_be_bytes());
    stamp[8..].copy_from_slice(&order.to_be_bytes());
    stamp
}

/// Applies an atomic add to an existing little-endian value (FDB semantics: the operand's
/// length decides the width; a shorter existing value is zero-extended, a longer one truncated).
pub fn apply_atomic_add(existing: Option<&[u8]>, delta: i64) -> Vec<u8> {
    let mut current = [0u8; 8];
    if let Some(bytes) = existing {
        let n = bytes.len().min(8);
        current[..n].copy_from_slice(&bytes[..n]);
    }
    let sum = i64::from_le_bytes(current).wrapping_add(delta);
    sum.to_le_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strinc_skips_trailing_ff() {
        assert_eq!(strinc(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(strinc(&[1, 0xFF, 0xFF]), Some(vec![2]));
        assert_eq!(strinc(&[0xFF]), None);
        assert_eq!(strinc(b""), None);
    }

    #[test]
    fn versionstamp_operand_is_validated() {
        let mut op = vec![9u8; 12];
        op.extend_from_slice(&2u32.to_le_bytes());
        let filled = fill_versionstamp(&op, &commit_stamp(7, 3)).unwrap();
        assert_eq!(filled.len(), 12);
        assert_eq!(&filled[2..12], &commit_stamp(7, 3));
        let mut bad = vec![0u8; 12];
        bad.extend_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            split_versionstamp_operand(&bad),
            Err(StoreError::Invalid(_))
        ));
        assert!(split_versionstamp_operand(&[1, 2]).is_err());
    }

    #[test]
    fn atomic_add_is_little_endian_and_wraps() {
        assert_eq!(apply_atomic_add(None, 1), 1i64.to_le_bytes().to_vec());
        let five = 5i64.to_le_bytes();
        assert_eq!(apply_atomic_add(Some(&five), -7), (-2i64).to_le_bytes());
        assert_eq!(apply_atomic_add(Some(&[1]), 1), 2i64.to_le_bytes());
    }

    #[test]
    fn commit_stamps_order_bytewise() {
        assert!(commit_stamp(1, 65535) < commit_stamp(2, 0));
        assert!(commit_stamp(2, 0) < commit_stamp(2, 1));
    }
}
