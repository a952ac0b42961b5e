//! `_revs_diff` on the target: which of the changed revisions it lacks, and their possible
//! ancestors (for `atts_since`). Also the statistical skipping of CouchDB 3.3: while nearly
//! every revision turns out missing (an initial copy), skip the call and assume all missing.

use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::replication::changes::reader::Change;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req};

/// A document's revisions the target is missing.
#[derive(Debug, Clone, PartialEq)]
pub struct Missing {
    /// Document id.
    pub id: String,
    /// Missing revisions.
    pub revs: Vec<String>,
    /// Revisions the target has that may be ancestors (for `atts_since`).
    pub possible_ancestors: Vec<String>,
}

#[derive(Deserialize)]
struct DiffEntry {
    #[serde(default)]
    missing: Vec<String>,
    #[serde(default)]
    possible_ancestors: Vec<String>,
}

/// Asks the target which revisions of `changes` it is missing.
pub async fn revs_diff(target: &HttpClient, changes: &[Change]) -> Result<Vec<Missing>> {
    let mut body = Map::with_capacity(changes.len());
    for c in changes {
        let entry = body
            .entry(c.id.clone())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = entry {
            a.extend(c.revs.iter().map(|r| Value::String(r.clone())));
        }
    }
    let resp = target
        .send(&Req::json(
            Method::POST,
            "_revs_diff",
            Value::Object(body).to_string(),
        ))
        .await?;
    if !resp.status.is_success() {
        return Err(ReplicationError::HttpRequestFailed(format!(
            "{}: _revs_diff answered {}",
            target.endpoint(),
            resp.status
        )));
    }
    let mut map: HashMap<String, DiffEntry> = resp.json("_revs_diff")?;
    // Keep the feed's order so writes follow the source's sequence order.
    let mut out = Vec::new();
    for c in changes {
        if let Some(e) = map.remove(&c.id)
            && !e.missing.is_empty()
        {
            out.push(Missing {
                id: c.id.clone(),
                revs: e.missing,
                possible_ancestors: e.possible_ancestors,
            });
        }
    }
    Ok(out)
}

/// Everything in the batch, assumed missing (used when `_revs_diff` is skipped).
pub fn all_missing(changes: &[Change]) -> Vec<Missing> {
    changes
        .iter()
        .map(|c| Missing {
            id: c.id.clone(),
            revs: c.revs.clone(),
            possible_ancestors: Vec::new(),
        })
        .collect()
}

/// What the target held when the replication started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetAtStart {
    /// This run created it (201): it holds nothing of the source's.
    Created,
    /// It existed without documents or deletions.
    Empty,
    /// It held something.
    Holding,
}

/// CouchDB 3.3's `_revs_diff` skipping: an exponential moving average (decay 0.4) of the
/// missing fraction; skip while it is above 0.95, but call at least every 37 s.
#[derive(Debug)]
pub struct DiffSkipper {
    avg: f64,
    last_call: Option<Instant>,
}

impl Default for DiffSkipper {
    fn default() -> Self {
        Self {
            avg: 0.0,
            last_call: None,
        }
    }
}

impl DiffSkipper {
    const DECAY: f64 = 0.4;
    const THRESHOLD: f64 = 0.95;
    const MAX_GAP: Duration = Duration::from_secs(37);

    /// A skipper for a target as the start-up found it. A target that held nothing (no
    /// documents, no deletions) should lack every revision, so once the first diff confirms
    /// it, batches skip `_revs_diff` at once instead of after the six the moving average
    /// needs, saving a round trip each (what decides over a long link); only the batches
    /// already under way when the first diff answers call it too. A target this run created
    /// is not even asked: its first wave goes straight to the source (a round trip and a
    /// connection's handshake sooner, see docs/decisions/2026-11-27-wan-first-wave.md). A
    /// document someone else wrote there meanwhile is written again, which `new_edits=false`
    /// makes a no-op, and the 37 s check still runs.
    pub fn for_target(target: TargetAtStart) -> Self {
        match target {
            TargetAtStart::Created => Self {
                avg: 1.0,
                last_call: Some(Instant::now()),
            },
            TargetAtStart::Empty => Self {
                avg: 1.0,
                last_call: None,
            },
            TargetAtStart::Holding => Self::default(),
        }
    }

    /// Whether the next batch should call `_revs_diff`.
    pub fn should_call(&self) -> bool {
        self.avg <= Self::THRESHOLD || self.last_call.is_none_or(|t| t.elapsed() >= Self::MAX_GAP)
    }

    /// Records a `_revs_diff` result: `missing` of `checked` revisions were missing.
    pub fn record(&mut self, checked: u64, missing: u64) {
        if checked == 0 {
            return;
        }
        let frac = missing as f64 / checked as f64;
        self.avg = Self::DECAY * frac + (1.0 - Self::DECAY) * self.avg;
        self.last_call = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipping_starts_only_after_a_run_of_all_missing() {
        let mut s = DiffSkipper::default();
        assert!(s.should_call());
        for _ in 0..3 {
            s.record(100, 100);
        }
        assert!(s.should_call(), "average still below 0.95 after 3 batches");
        for _ in 0..5 {
            s.record(100, 100);
        }
        assert!(!s.should_call());
        s.record(100, 0);
        assert!(s.should_call());
    }

    #[test]
    fn an_empty_target_skips_once_the_first_diff_confirms_it() {
        let mut s = DiffSkipper::for_target(TargetAtStart::Empty);
        assert!(s.should_call(), "the first batch checks the guess");
        s.record(100, 100);
        assert!(!s.should_call(), "skips from the second diff on");
        s.record(100, 0);
        assert!(
            s.should_call(),
            "a diff finding revisions present ends the skipping"
        );
    }

    #[test]
    fn a_created_target_is_not_asked_until_the_periodic_check() {
        let mut s = DiffSkipper::for_target(TargetAtStart::Created);
        assert!(
            !s.should_call(),
            "the first wave goes straight to the source"
        );
        s.last_call = Some(Instant::now() - DiffSkipper::MAX_GAP);
        assert!(s.should_call(), "the 37 s check still runs");
        s.record(100, 0);
        assert!(s.should_call(), "revisions found present end the skipping");
    }
}
