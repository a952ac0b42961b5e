//! Conflict detection: the recent-writes history the committer checks each transaction's
//! read-conflict ranges against.
//!
//! Owned by the committer thread only. A transaction conflicts when one of its read ranges
//! intersects a write committed at a version above its read version; a transaction older than
//! the retained history cannot be checked and gets [`StoreError::TooOld`] (FDB 1007).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::store::StoreError;

/// How long writes stay checkable (FoundationDB's 5 s MVCC window).
pub(crate) const HISTORY_WINDOW: Duration = Duration::from_secs(5);
/// Bound on the history's memory, whatever the commit rate.
const HISTORY_MAX_BYTES: usize = 64 << 20;

/// A half-open key range `begin..end`.
pub(crate) type KeyRange = (Vec<u8>, Vec<u8>);

/// What one committed transaction wrote.
#[derive(Debug, Clone)]
pub(crate) enum Written {
    Key(Vec<u8>),
    Range(Vec<u8>, Vec<u8>),
}

impl Written {
    fn bytes(&self) -> usize {
        match self {
            Written::Key(k) => k.len() + 16,
            Written::Range(b, e) => b.len() + e.len() + 16,
        }
    }

    /// Whether this write falls inside the read range `begin..end`.
    pub(crate) fn hits(&self, (begin, end): &KeyRange) -> bool {
        match self {
            Written::Key(k) => begin <= k && k < end,
            Written::Range(b, e) => b < end && begin < e,
        }
    }
}

/// Whether any of `reads` intersects any of `writes`.
pub(crate) fn intersects(reads: &[KeyRange], writes: &[Written]) -> bool {
    writes.iter().any(|w| reads.iter().any(|r| w.hits(r)))
}

struct Entry {
    version: u64,
    at: Instant,
    writes: Vec<Written>,
    bytes: usize,
}

/// Writes of recent commit batches, newest last.
pub(crate) struct History {
    entries: VecDeque<Entry>,
    bytes: usize,
    /// Highest version whose writes were dropped: reads below it cannot be checked.
    forgotten: u64,
}

impl History {
    /// A history that starts at `version` (nothing before it is checkable, e.g. after a
    /// restart, but no transaction can have an older read version then).
    pub(crate) fn new(version: u64) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            forgotten: version,
        }
    }

    /// Checks a transaction that read at `read_version` with `reads`.
    pub(crate) fn check(&self, read_version: u64, reads: &[KeyRange]) -> Result<(), StoreError> {
        if reads.is_empty() {
            return Ok(());
        }
        if read_version < self.forgotten {
            return Err(StoreError::TooOld);
        }
        for entry in self.entries.iter().rev() {
            if entry.version <= read_version {
                break;
            }
            if intersects(reads, &entry.writes) {
                return Err(StoreError::Conflict);
            }
        }
        Ok(())
    }

    pub(crate) fn push(&mut self, version: u64, at: Instant, writes: Vec<Written>) {
        if writes.is_empty() {
            return;
        }
        let bytes = writes.iter().map(Written::bytes).sum();
        self.bytes += bytes;
        self.entries.push_back(Entry {
            version,
            at,
            writes,
            bytes,
        });
    }

    /// Drops batches older than the window (or beyond the memory bound).
    pub(crate) fn trim(&mut self, now: Instant) {
        while let Some(front) = self.entries.front() {
            let expired = now.saturating_duration_since(front.at) > HISTORY_WINDOW;
            if !expired && self.bytes <= HISTORY_MAX_BYTES {
                break;
            }
            self.bytes -= front.bytes;
            self.forgotten = self.forgotten.max(front.version);
            self.entries.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(b: &[u8], e: &[u8]) -> KeyRange {
        (b.to_vec(), e.to_vec())
    }

    #[test]
    fn reads_conflict_only_with_later_intersecting_writes() {
        let t0 = Instant::now();
        let mut h = History::new(1);
        h.push(2, t0, vec![Written::Key(b"b".to_vec())]);
        h.push(3, t0, vec![Written::Range(b"m".to_vec(), b"p".to_vec())]);
        assert_eq!(h.check(1, &[r(b"a", b"c")]), Err(StoreError::Conflict));
        assert_eq!(h.check(2, &[r(b"a", b"c")]), Ok(()));
        assert_eq!(h.check(2, &[r(b"o", b"q")]), Err(StoreError::Conflict));
        assert_eq!(h.check(2, &[r(b"p", b"q")]), Ok(()));
        assert_eq!(h.check(1, &[r(b"c", b"m")]), Ok(()));
        assert_eq!(h.check(0, &[]), Ok(()));
        assert_eq!(h.check(0, &[r(b"x", b"y")]), Err(StoreError::TooOld));
    }

    #[test]
    fn trimmed_history_makes_old_readers_too_old() {
        let t0 = Instant::now();
        let mut h = History::new(0);
        h.push(1, t0, vec![Written::Key(b"k".to_vec())]);
        h.push(
            2,
            t0 + Duration::from_secs(4),
            vec![Written::Key(b"k".to_vec())],
        );
        h.trim(t0 + Duration::from_secs(6));
        assert_eq!(h.check(0, &[r(b"z", b"zz")]), Err(StoreError::TooOld));
        assert_eq!(h.check(1, &[r(b"k", b"l")]), Err(StoreError::Conflict));
        assert_eq!(h.check(2, &[r(b"k", b"l")]), Ok(()));
    }
}
