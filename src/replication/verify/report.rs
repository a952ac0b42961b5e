//! The verification report: what was checked, what the target lacks or holds differently,
//! and the first ids of each (so a huge gap does not make a huge report). Workers fill
//! [`Tally`]s; [`Progress`] is the live count a progress bar reads.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// How many ids of each kind a report names.
pub const FIRST_IDS: usize = 10;

/// A leaf revision the target lacks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MissingDoc {
    /// Document id.
    pub id: String,
    /// The leaf revisions the target lacks.
    pub revs: Vec<String>,
}

/// A leaf revision both sides hold, with different content (`--deep`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DifferentLeaf {
    /// Document id.
    pub id: String,
    /// The leaf revision.
    pub rev: String,
    /// What differs: `body`, `attachment NAME: ...`, or why the target could not show it.
    pub reason: String,
}

/// The outcome of one verification.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VerifyReport {
    /// True when every selected leaf is on the target (and, when deep, the same there).
    pub complete: bool,
    /// Source database (password masked).
    pub source: String,
    /// Target database (password masked).
    pub target: String,
    /// Whether bodies and attachments were compared too.
    pub deep: bool,
    /// Documents read from the source's changes feed.
    pub docs_checked: u64,
    /// Leaf revisions of those documents (deleted and conflicting ones included).
    pub leaves_checked: u64,
    /// Documents with at least one leaf missing from the target.
    pub docs_missing: u64,
    /// Leaf revisions missing from the target.
    pub leaves_missing: u64,
    /// Leaf revisions compared body to body (`--deep`).
    pub leaves_compared: u64,
    /// Leaf revisions whose body or attachments differ (`--deep`).
    pub leaves_different: u64,
    /// The first documents with missing leaves (at most [`FIRST_IDS`]).
    pub first_missing: Vec<MissingDoc>,
    /// The first differing leaves (at most [`FIRST_IDS`]).
    pub first_different: Vec<DifferentLeaf>,
}

impl VerifyReport {
    /// Adds a worker's tally; the first ids stay in the order workers finish their batches.
    pub(crate) fn absorb(&mut self, t: Tally) {
        self.docs_checked += t.docs;
        self.leaves_checked += t.leaves;
        self.docs_missing += t.docs_missing;
        self.leaves_missing += t.leaves_missing;
        self.leaves_compared += t.compared;
        self.leaves_different += t.leaves_different;
        let room = FIRST_IDS.saturating_sub(self.first_missing.len());
        self.first_missing.extend(t.missing.into_iter().take(room));
        let room = FIRST_IDS.saturating_sub(self.first_different.len());
        self.first_different
            .extend(t.different.into_iter().take(room));
    }

    /// Sets `complete` from the counts.
    pub(crate) fn conclude(&mut self) {
        self.complete = self.leaves_missing == 0 && self.leaves_different == 0;
    }

    /// A few lines for a terminal.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{verdict}: {src} -> {tgt}\n  {} documents, {} leaf revisions checked{deep}\n  \
             {} leaf revisions missing in {} documents\n",
            self.docs_checked,
            self.leaves_checked,
            self.leaves_missing,
            self.docs_missing,
            verdict = if self.complete {
                "complete"
            } else {
                "INCOMPLETE"
            },
            src = self.source,
            tgt = self.target,
            deep = if self.deep {
                format!(", {} compared body to body", self.leaves_compared)
            } else {
                String::new()
            },
        );
        if self.deep {
            s.push_str(&format!(
                "  {} leaf revisions different\n",
                self.leaves_different
            ));
        }
        for m in &self.first_missing {
            s.push_str(&format!("  missing   {} {}\n", m.id, m.revs.join(",")));
        }
        for d in &self.first_different {
            s.push_str(&format!("  different {} {}: {}\n", d.id, d.rev, d.reason));
        }
        s
    }
}

/// What a worker found: counts, and the first [`FIRST_IDS`] ids of each kind.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub docs: u64,
    pub leaves: u64,
    pub docs_missing: u64,
    pub leaves_missing: u64,
    pub compared: u64,
    pub leaves_different: u64,
    pub missing: Vec<MissingDoc>,
    pub different: Vec<DifferentLeaf>,
}

impl Tally {
    /// Adds another tally, keeping at most [`FIRST_IDS`] ids of each kind.
    pub(crate) fn merge(&mut self, t: Tally) {
        self.docs += t.docs;
        self.leaves += t.leaves;
        self.docs_missing += t.docs_missing;
        self.leaves_missing += t.leaves_missing;
        self.compared += t.compared;
        self.leaves_different += t.leaves_different;
        let room = FIRST_IDS.saturating_sub(self.missing.len());
        self.missing.extend(t.missing.into_iter().take(room));
        let room = FIRST_IDS.saturating_sub(self.different.len());
        self.different.extend(t.different.into_iter().take(room));
    }
}

/// Live counts for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    /// Documents checked so far.
    pub docs: AtomicU64,
    /// Leaf revisions checked so far.
    pub leaves: AtomicU64,
    /// Leaf revisions found missing or different so far.
    pub problems: AtomicU64,
    /// Documents the source holds (deleted ones included), once known; 0 when unknown or
    /// when a filter selects an unknown part of them.
    pub total: AtomicU64,
}

impl Progress {
    pub(crate) fn record(&self, t: &Tally) {
        self.docs.fetch_add(t.docs, Ordering::Relaxed);
        self.leaves.fetch_add(t.leaves, Ordering::Relaxed);
        self.problems
            .fetch_add(t.leaves_missing + t.leaves_different, Ordering::Relaxed);
    }
}
