//! A transaction's read set as the compares of its commit `Txn`, and how to tell which
//! compare failed (etcd only says that one did).
//!
//! etcd checks state, not history: `MOD == seen` proves a key unchanged since it was read
//! (0 = still absent), and `MOD < R+1` over a range proves nothing in it was created or
//! updated after the read revision `R`, but a deleted key leaves nothing to compare, so each
//! row a range read returned also gets its own `MOD == seen`. Explicit read-conflict ranges
//! are resolved the same way at commit (their rows read at `R`).

use std::collections::BTreeMap;

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, TxnOp, TxnOpResponse};

/// What the commit must find unchanged, in etcd keys.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReadSet {
    /// Keys read, with the mod revision seen (0 = absent).
    keys: BTreeMap<Vec<u8>, i64>,
    /// Ranges read (or declared): nothing in them may be newer than the read revision (or
    /// than the revision given with the range).
    ranges: Vec<(Vec<u8>, Vec<u8>, Option<i64>)>,
}

fn key_after(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    k
}

impl ReadSet {
    /// A key read from the store with its mod revision (0 = absent).
    pub(crate) fn key(&mut self, key: Vec<u8>, seen: i64) {
        self.keys.entry(key).or_insert(seen);
    }

    /// A range (or a key whose mod revision was not read): no write after the read revision.
    pub(crate) fn range(&mut self, begin: Vec<u8>, end: Vec<u8>) {
        if begin < end {
            self.ranges.push((begin, end, None));
        }
    }

    /// A range in which nothing may be newer than `revision`.
    pub(crate) fn range_since(&mut self, begin: Vec<u8>, end: Vec<u8>, revision: i64) {
        if begin < end {
            self.ranges.push((begin, end, Some(revision)));
        }
    }

    /// Adds `other`'s checks (a key keeps the revision seen first).
    pub(crate) fn merge(&mut self, other: ReadSet) {
        for (key, seen) in other.keys {
            self.key(key, seen);
        }
        self.ranges.extend(other.ranges);
    }

    /// The checks, for a transaction that read at `revision`.
    pub(crate) fn checks(&self, revision: i64) -> Vec<Check> {
        let keys = self.keys.iter().map(|(key, seen)| Check::Key {
            key: key.clone(),
            seen: *seen,
        });
        let ranges = self.ranges.iter().map(|(begin, end, since)| Check::Range {
            begin: begin.clone(),
            end: end.clone(),
            revision: since.unwrap_or(revision),
        });
        keys.chain(ranges).collect()
    }

    /// Key spans covered, for the committer's disjointness check.
    pub(crate) fn spans(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let keys = self.keys.keys().map(|k| (k.clone(), key_after(k)));
        let ranges = self.ranges.iter().map(|(b, e, _)| (b.clone(), e.clone()));
        keys.chain(ranges).collect()
    }
}

/// One compare of a commit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Check {
    /// The key's mod revision is still `seen` (0 = still absent).
    Key { key: Vec<u8>, seen: i64 },
    /// Nothing in `begin..end` was written after `revision`.
    Range {
        begin: Vec<u8>,
        end: Vec<u8>,
        revision: i64,
    },
}

impl Check {
    pub(crate) fn compare(&self) -> Compare {
        match self {
            Check::Key { key, seen } => Compare::mod_revision(key.clone(), CompareOp::Equal, *seen),
            Check::Range {
                begin,
                end,
                revision,
            } => Compare::mod_revision(begin.clone(), CompareOp::Less, revision + 1)
                .with_range(end.clone()),
        }
    }

    /// A read (no revision: it runs inside a `Txn`) of what the compare looks at: the key's
    /// mod revision, or the newest mod revision in the range.
    pub(crate) fn probe(&self) -> TxnOp {
        match self {
            Check::Key { key, .. } => {
                TxnOp::get(key.clone(), Some(GetOptions::new().with_keys_only()))
            }
            Check::Range { begin, end, .. } => TxnOp::get(
                begin.clone(),
                Some(
                    GetOptions::new()
                        .with_range(end.clone())
                        .with_sort(SortTarget::Mod, SortOrder::Descend)
                        .with_limit(1)
                        .with_keys_only(),
                ),
            ),
        }
    }

    /// Whether the compare held, from the response of [`Check::probe`].
    pub(crate) fn holds(&self, probe: &TxnOpResponse) -> bool {
        let TxnOpResponse::Get(get) = probe else {
            return false;
        };
        let newest = get.kvs().first().map_or(0, |kv| kv.mod_revision());
        match self {
            Check::Key { seen, .. } => newest == *seen,
            Check::Range { revision, .. } => newest <= *revision,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            Check::Key { key, .. } => key.len() + 16,
            Check::Range { begin, end, .. } => begin.len() + end.len() + 16,
        }
    }
}

/// Whether two sets of half-open spans intersect.
pub(crate) fn overlap(a: &[(Vec<u8>, Vec<u8>)], b: &[(Vec<u8>, Vec<u8>)]) -> bool {
    a.iter()
        .any(|(ab, ae)| b.iter().any(|(bb, be)| ab < be && bb < ae))
}

pub(crate) fn point(key: &[u8]) -> (Vec<u8>, Vec<u8>) {
    (key.to_vec(), key_after(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_overlap_half_open() {
        let a = vec![(b"a".to_vec(), b"c".to_vec())];
        assert!(overlap(&a, &[point(b"b")]));
        assert!(!overlap(&a, &[point(b"c")]));
        assert!(!overlap(&a, &[(b"0".to_vec(), b"a".to_vec())]));
    }

    #[test]
    fn a_key_read_twice_keeps_the_first_revision() {
        let mut reads = ReadSet::default();
        reads.key(b"k".to_vec(), 5);
        reads.key(b"k".to_vec(), 9);
        reads.range(b"b".to_vec(), b"a".to_vec());
        assert_eq!(reads.checks(10).len(), 1);
    }
}
