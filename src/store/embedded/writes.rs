//! A transaction's buffered writes: the ordered mutation log that the committer applies, and
//! the read-your-writes index that reads consult before the snapshot.
//!
//! Called only from the owning [`super::transaction::EmbeddedTx`] under its lock.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::store::{StoreError, apply_atomic_add, split_versionstamp_operand};

/// FoundationDB's limits, so that code tested here also fits FoundationDB.
pub(crate) const MAX_KEY: usize = 10_000;
pub(crate) const MAX_VALUE: usize = 100_000;
pub(crate) const MAX_TX_BYTES: usize = 10_000_000;

/// One buffered write, applied in order at commit.
#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    Set(Vec<u8>, Vec<u8>),
    Clear(Vec<u8>),
    ClearRange(Vec<u8>, Vec<u8>),
    Add(Vec<u8>, i64),
    /// Key operand in wire form (placeholder + offset), value.
    VersionstampedKey(Vec<u8>, Vec<u8>),
    /// Key, value operand in wire form.
    VersionstampedValue(Vec<u8>, Vec<u8>),
}

/// What the transaction's own writes say about one key.
#[derive(Debug, Clone)]
enum Pending {
    Value(Vec<u8>),
    Cleared,
    /// Atomic adds on a base the transaction has not read.
    Add(i64),
    /// Written with a versionstamped value: unknown until commit (FDB error 1036 on read).
    Unreadable,
}

/// The answer of the write buffer for one key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The transaction's writes decide the value.
    Known(Option<Vec<u8>>),
    /// Read the snapshot, then apply this pending add (if any).
    Base(Option<i64>),
    Unreadable,
}

impl Lookup {
    /// Completes a [`Lookup::Base`] answer with the snapshot's value.
    pub(crate) fn resolve(self, base: Option<Vec<u8>>) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Lookup::Known(v) => Ok(v),
            Lookup::Base(None) => Ok(base),
            Lookup::Base(Some(delta)) => Ok(Some(apply_atomic_add(base.as_deref(), delta))),
            Lookup::Unreadable => Err(unreadable()),
        }
    }
}

pub(crate) fn unreadable() -> StoreError {
    StoreError::Invalid(
        "key written with a versionstamped value is unreadable before commit (FDB 1036)".into(),
    )
}

#[derive(Debug, Default)]
pub(crate) struct WriteBuffer {
    ops: Vec<Mutation>,
    entries: BTreeMap<Vec<u8>, Pending>,
    cleared: Vec<(Vec<u8>, Vec<u8>)>,
    bytes: usize,
    invalid: Option<StoreError>,
}

impl WriteBuffer {
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The first invalid write, reported at commit like FoundationDB does.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        if let Some(e) = &self.invalid {
            return Err(e.clone());
        }
        if self.bytes > MAX_TX_BYTES {
            return Err(StoreError::TooLarge(format!(
                "{} bytes written, limit {MAX_TX_BYTES}",
                self.bytes
            )));
        }
        Ok(())
    }

    pub(crate) fn take_ops(&mut self) -> Vec<Mutation> {
        std::mem::take(&mut self.ops)
    }

    fn reject(&mut self, error: StoreError) {
        if self.invalid.is_none() {
            self.invalid = Some(error);
        }
    }

    fn key_ok(&mut self, key: &[u8]) -> bool {
        if key.len() > MAX_KEY {
            self.reject(StoreError::Invalid(format!(
                "key of {} bytes exceeds {MAX_KEY}",
                key.len()
            )));
            return false;
        }
        true
    }

    fn value_ok(&mut self, value: &[u8]) -> bool {
        if value.len() > MAX_VALUE {
            self.reject(StoreError::Invalid(format!(
                "value of {} bytes exceeds {MAX_VALUE}",
                value.len()
            )));
            return false;
        }
        true
    }

    fn in_cleared(&self, key: &[u8]) -> bool {
        self.cleared
            .iter()
            .any(|(b, e)| b.as_slice() <= key && key < e.as_slice())
    }

    pub(crate) fn set(&mut self, key: &[u8], value: &[u8]) {
        if !self.key_ok(key) || !self.value_ok(value) {
            return;
        }
        self.bytes += key.len() + value.len();
        self.entries
            .insert(key.to_vec(), Pending::Value(value.to_vec()));
        self.ops.push(Mutation::Set(key.to_vec(), value.to_vec()));
    }

    pub(crate) fn clear(&mut self, key: &[u8]) {
        if !self.key_ok(key) {
            return;
        }
        self.bytes += key.len();
        self.entries.insert(key.to_vec(), Pending::Cleared);
        self.ops.push(Mutation::Clear(key.to_vec()));
    }

    pub(crate) fn clear_range(&mut self, begin: &[u8], end: &[u8]) {
        if begin >= end || !self.key_ok(begin) || !self.key_ok(end) {
            return;
        }
        self.bytes += begin.len() + end.len();
        let inside: Vec<Vec<u8>> = self
            .entries
            .range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)))
            .map(|(k, _)| k.clone())
            .collect();
        for key in inside {
            self.entries.remove(&key);
        }
        self.cleared.push((begin.to_vec(), end.to_vec()));
        self.ops
            .push(Mutation::ClearRange(begin.to_vec(), end.to_vec()));
    }

    pub(crate) fn add(&mut self, key: &[u8], delta: i64) {
        if !self.key_ok(key) {
            return;
        }
        self.bytes += key.len() + 8;
        let next = match self.entries.get(key) {
            Some(Pending::Value(v)) => Pending::Value(apply_atomic_add(Some(v), delta)),
            Some(Pending::Cleared) => Pending::Value(apply_atomic_add(None, delta)),
            Some(Pending::Add(d)) => Pending::Add(d.wrapping_add(delta)),
            Some(Pending::Unreadable) => Pending::Unreadable,
            None if self.in_cleared(key) => Pending::Value(apply_atomic_add(None, delta)),
            None => Pending::Add(delta),
        };
        self.entries.insert(key.to_vec(), next);
        self.ops.push(Mutation::Add(key.to_vec(), delta));
    }

    pub(crate) fn set_versionstamped_key(&mut self, key: &[u8], value: &[u8]) {
        if let Err(e) = split_versionstamp_operand(key) {
            self.reject(e);
            return;
        }
        if !self.key_ok(&key[..key.len() - 4]) || !self.value_ok(value) {
            return;
        }
        self.bytes += key.len() + value.len();
        // The final key is unknown until commit, so reads cannot see it (as in FoundationDB).
        self.ops
            .push(Mutation::VersionstampedKey(key.to_vec(), value.to_vec()));
    }

    pub(crate) fn set_versionstamped_value(&mut self, key: &[u8], value: &[u8]) {
        if let Err(e) = split_versionstamp_operand(value) {
            self.reject(e);
            return;
        }
        if !self.key_ok(key) || !self.value_ok(&value[..value.len() - 4]) {
            return;
        }
        self.bytes += key.len() + value.len();
        self.entries.insert(key.to_vec(), Pending::Unreadable);
        self.ops
            .push(Mutation::VersionstampedValue(key.to_vec(), value.to_vec()));
    }

    /// What the buffered writes say about `key`.
    pub(crate) fn lookup(&self, key: &[u8]) -> Lookup {
        match self.entries.get(key) {
            Some(Pending::Value(v)) => Lookup::Known(Some(v.clone())),
            Some(Pending::Cleared) => Lookup::Known(None),
            Some(Pending::Add(d)) => Lookup::Base(Some(*d)),
            Some(Pending::Unreadable) => Lookup::Unreadable,
            None if self.in_cleared(key) => Lookup::Known(None),
            None => Lookup::Base(None),
        }
    }

    /// Whether the transaction wrote `key` (so a watch compares against the committed value).
    pub(crate) fn touches(&self, key: &[u8]) -> bool {
        self.entries.contains_key(key) || self.in_cleared(key)
    }

    /// Keys in `begin..end` that the buffer decides, in key order (reversed if asked).
    pub(crate) fn keys_in(&self, begin: &[u8], end: &[u8], reverse: bool) -> Vec<Vec<u8>> {
        let range = self
            .entries
            .range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)))
            .map(|(k, _)| k.clone());
        if reverse {
            range.rev().collect()
        } else {
            range.collect()
        }
    }

    /// Whether a snapshot row at `key` that the buffer does not decide is hidden by a clear.
    pub(crate) fn hides(&self, key: &[u8]) -> bool {
        self.in_cleared(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clear_range_then_set_and_add() {
        let mut w = WriteBuffer::default();
        w.set(b"a", b"1");
        w.add(b"c", 2);
        w.clear_range(b"a", b"z");
        assert_eq!(w.lookup(b"a"), Lookup::Known(None));
        assert_eq!(w.lookup(b"b"), Lookup::Known(None));
        w.set(b"b", b"2");
        w.add(b"c", 5);
        assert_eq!(w.lookup(b"b"), Lookup::Known(Some(b"2".to_vec())));
        assert_eq!(
            w.lookup(b"c"),
            Lookup::Known(Some(5i64.to_le_bytes().to_vec()))
        );
        assert_eq!(w.lookup(b"zz"), Lookup::Base(None));
        w.add(b"zz", 1);
        w.add(b"zz", 2);
        assert_eq!(w.lookup(b"zz"), Lookup::Base(Some(3)));
        assert_eq!(w.take_ops().len(), 7);
    }

    #[test]
    fn invalid_writes_fail_the_commit() {
        let mut w = WriteBuffer::default();
        w.set_versionstamped_key(b"ab", b"v");
        assert!(matches!(w.check(), Err(StoreError::Invalid(_))));
        let mut w = WriteBuffer::default();
        w.set(&vec![0; MAX_KEY + 1], b"v");
        assert!(w.check().is_err());
        let mut w = WriteBuffer::default();
        let mut op = b"key".to_vec();
        op.extend_from_slice(&[0; 10]);
        op.extend_from_slice(&3u32.to_le_bytes());
        w.set_versionstamped_value(b"k", &op);
        assert!(w.check().is_ok());
        assert_eq!(w.lookup(b"k"), Lookup::Unreadable);
    }
}
