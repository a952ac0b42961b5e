//! Replication statistics: lock-free counters the pipeline bumps, and the snapshot shape of
//! `_active_tasks` / `_scheduler/jobs` `info` (CouchDB's couch_replicator_scheduler_job.erl task status).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;
use serde_json::Value;

use crate::replication::id::rep_id::RepId;

/// Counters shared by the pipeline's tasks.
#[derive(Debug, Default)]
pub struct Counters {
    /// Revisions asked about in `_revs_diff` (or assumed missing).
    pub revisions_checked: AtomicU64,
    /// Revisions the target was missing.
    pub missing_revisions_found: AtomicU64,
    /// Documents (revisions) fetched from the source.
    pub docs_read: AtomicU64,
    /// Documents written to the target.
    pub docs_written: AtomicU64,
    /// Documents the target rejected or that were skipped.
    pub doc_write_failures: AtomicU64,
    /// Revisions requested through `_bulk_get`.
    pub bulk_get_attempts: AtomicU64,
    /// Revisions obtained through `_bulk_get`.
    pub bulk_get_docs: AtomicU64,
}

impl Counters {
    /// Adds `n` to a counter.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// Seeds counters (from a checkpoint history entry when resuming a session).
    pub fn seed(&self, s: &ReplicationStats) {
        self.revisions_checked.store(s.revisions_checked, Relaxed);
        self.missing_revisions_found
            .store(s.missing_revisions_found, Relaxed);
        self.docs_read.store(s.docs_read, Relaxed);
        self.docs_written.store(s.docs_written, Relaxed);
        self.doc_write_failures.store(s.doc_write_failures, Relaxed);
        self.bulk_get_attempts.store(s.bulk_get_attempts, Relaxed);
        self.bulk_get_docs.store(s.bulk_get_docs, Relaxed);
    }
}

/// A stats snapshot with the `_active_tasks` field names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ReplicationStats {
    /// Full replication id (`base+ext`).
    pub replication_id: RepId,
    /// Source URL, password masked.
    pub source: String,
    /// Target URL, password masked.
    pub target: String,
    /// Continuous replication.
    pub continuous: bool,
    /// Basic-auth user of the source, if any.
    pub user: Option<String>,
    /// Latest sequence seen on the source feed.
    pub source_seq: Value,
    /// Sequence up to which every change has been processed.
    pub through_seq: Value,
    /// Last sequence written to the checkpoint documents.
    pub checkpointed_source_seq: Value,
    /// Checkpoint interval in ms.
    pub checkpoint_interval: u64,
    /// Revisions checked.
    pub revisions_checked: u64,
    /// Missing revisions found.
    pub missing_revisions_found: u64,
    /// Docs read.
    pub docs_read: u64,
    /// Docs written.
    pub docs_written: u64,
    /// Write failures.
    pub doc_write_failures: u64,
    /// Changes left (numeric sequences only; `None` when unknown).
    pub changes_pending: Option<u64>,
    /// Revisions fetched via `_bulk_get`.
    pub bulk_get_docs: u64,
    /// Revisions requested via `_bulk_get`.
    pub bulk_get_attempts: u64,
    /// Unix seconds when this run started.
    pub started_on: u64,
    /// Unix seconds of this snapshot.
    pub updated_on: u64,
    /// Unix seconds since when the run has been behind its source feed (changes seen on it
    /// and not yet processed); `None` while caught up. Set at the first snapshot that finds
    /// it behind, so it changes only when the job falls behind or catches up (an idle job's
    /// snapshots stay equal and wake nobody).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub behind_since: Option<u64>,
    /// CouchDB's one-shot `_replicate` answer (without `ok`), set when the run ends: the
    /// checkpoint document last written, or the source's with `no_changes: true`, or
    /// `{"use_checkpoints": false}`. Not part of the stats shown elsewhere.
    #[serde(skip)]
    pub checkpoint_record: Option<Value>,
}

impl ReplicationStats {
    /// Copies the counters into the snapshot.
    pub fn fill(&mut self, c: &Counters) {
        self.revisions_checked = c.revisions_checked.load(Relaxed);
        self.missing_revisions_found = c.missing_revisions_found.load(Relaxed);
        self.docs_read = c.docs_read.load(Relaxed);
        self.docs_written = c.docs_written.load(Relaxed);
        self.doc_write_failures = c.doc_write_failures.load(Relaxed);
        self.bulk_get_attempts = c.bulk_get_attempts.load(Relaxed);
        self.bulk_get_docs = c.bulk_get_docs.load(Relaxed);
        self.updated_on = unix_now();
        self.changes_pending = match (self.source_seq.as_u64(), self.through_seq.as_u64()) {
            (Some(s), Some(t)) => Some(s.saturating_sub(t)),
            _ => None,
        };
        if self.is_caught_up() {
            self.behind_since = None;
        } else if self.behind_since.is_none() {
            self.behind_since = Some(self.updated_on);
        }
    }

    /// Whether every change the source feed has shown is processed: the through-sequence
    /// reached the source sequence (by their numbers, which CouchDB's `N-opaque` strings
    /// lead with; equal values otherwise).
    pub fn is_caught_up(&self) -> bool {
        match (seq_number(&self.source_seq), seq_number(&self.through_seq)) {
            (Some(s), Some(t)) => t >= s,
            _ => self.source_seq == self.through_seq,
        }
    }

    /// How long the run has been behind its source at `now` (Unix seconds): 0 while caught
    /// up, else the seconds since it fell behind.
    pub fn lag_seconds(&self, now: u64) -> u64 {
        self.behind_since.map_or(0, |t| now.saturating_sub(t))
    }
}

/// The numeric part of a sequence: a number, or the `N` of CouchDB's `N-opaque` strings.
pub fn seq_number(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.split('-').next().and_then(|n| n.parse().ok()),
        _ => None,
    }
}

/// A sequence as CouchDB shows it in stats: a string as it is, anything else (a PouchDB's
/// integer, the starting `0`) as its JSON text.
pub fn seq_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// CouchDB's replication counters in the order and types CouchDB 3.4.3 shows them: the
/// common part of a job's `info` in `_scheduler/*` and of the `_replication_stats` written
/// into a completed `_replicator` document (each adds its own fields around it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct CouchStats {
    /// Revisions checked.
    pub revisions_checked: u64,
    /// Missing revisions found.
    pub missing_revisions_found: u64,
    /// Documents read.
    pub docs_read: u64,
    /// Documents written.
    pub docs_written: u64,
    /// Changes left, when known.
    pub changes_pending: Option<u64>,
    /// Write failures.
    pub doc_write_failures: u64,
    /// Revisions fetched with `_bulk_get`.
    pub bulk_get_docs: u64,
    /// Revisions asked for with `_bulk_get`.
    pub bulk_get_attempts: u64,
    /// Last checkpointed source sequence (a string, as CouchDB shows sequences).
    pub checkpointed_source_seq: String,
}

impl From<&ReplicationStats> for CouchStats {
    fn from(s: &ReplicationStats) -> Self {
        Self {
            revisions_checked: s.revisions_checked,
            missing_revisions_found: s.missing_revisions_found,
            docs_read: s.docs_read,
            docs_written: s.docs_written,
            changes_pending: s.changes_pending,
            doc_write_failures: s.doc_write_failures,
            bulk_get_docs: s.bulk_get_docs,
            bulk_get_attempts: s.bulk_get_attempts,
            checkpointed_source_seq: seq_text(&s.checkpointed_source_seq),
        }
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn behind_since_marks_falling_behind_and_clears_on_catching_up() {
        let c = Counters::default();
        let mut s = ReplicationStats {
            source_seq: json!("5-g1AAAA"),
            through_seq: json!("5-g1BBBB"),
            ..Default::default()
        };
        s.fill(&c);
        assert!(s.is_caught_up());
        assert_eq!(
            (s.behind_since, s.lag_seconds(s.updated_on + 50)),
            (None, 0)
        );
        // The feed shows a change not yet processed: behind from this snapshot on, and a
        // later snapshot still behind keeps the first time.
        s.source_seq = json!("7-g1CCCC");
        s.fill(&c);
        let fell = s.behind_since.expect("behind");
        s.behind_since = Some(fell - 30);
        s.fill(&c);
        assert_eq!(s.behind_since, Some(fell - 30));
        assert_eq!(s.lag_seconds(fell + 12), 42);
        s.through_seq = json!("7-g1DDDD");
        s.fill(&c);
        assert_eq!((s.behind_since, s.lag_seconds(fell + 100)), (None, 0));
        // PouchDB's integers; opaque sequences compare as values.
        let mut p = ReplicationStats {
            source_seq: json!(12),
            through_seq: json!(11),
            ..Default::default()
        };
        p.fill(&c);
        assert!(!p.is_caught_up() && p.behind_since.is_some());
        p.source_seq = json!("opaque");
        p.through_seq = json!("opaque");
        p.fill(&c);
        assert!(p.is_caught_up() && p.behind_since.is_none());
    }
}
