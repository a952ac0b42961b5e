//! What the couch_jobs chaos test observes: every job row of the type read straight from the
//! serial memory engine (no transaction, no faults), with the key indexes checked against the
//! rows, and the small state-diagram vocabulary the checker speaks.

pub mod model;

use std::collections::{BTreeMap, BTreeSet};

use couch_replicator::jobs::Keys;
use couch_replicator::jobs::job_data::{JobRow, decode_activity};
use couch_replicator::jobs::{JobState, accept::MAX_SCHED_TIME};
use couch_replicator::store::memory::MemoryStore;

/// One job as the checker compares it: state, lock, scheduled time, resubmit flag and the
/// activity versionstamp of a running job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub state: JobState,
    pub jlock: Option<String>,
    pub stime: i64,
    pub resubmit: bool,
    pub vs: Option<Vec<u8>>,
}

impl Seen {
    fn of(row: &JobRow) -> Self {
        Self {
            state: row.state(),
            jlock: row.jlock.clone(),
            stime: row.stime,
            resubmit: row.resubmit,
            vs: row.running_vs().map(|v| v.as_bytes().to_vec()),
        }
    }

    pub fn pending(stime: i64) -> Self {
        Self {
            state: JobState::Pending,
            jlock: None,
            stime,
            resubmit: false,
            vs: None,
        }
    }

    /// Equal but for the activity versionstamp (which every stamp renews).
    pub fn same_but_vs(&self, other: &Seen) -> bool {
        self.state == other.state
            && self.jlock == other.jlock
            && self.stime == other.stime
            && self.resubmit == other.resubmit
    }
}

/// The observed jobs of the type, by id.
pub type Jobs = BTreeMap<String, Seen>;

fn within(key: &[u8], (begin, end): &(Vec<u8>, Vec<u8>)) -> bool {
    key >= begin.as_slice() && key < end.as_slice()
}

/// Reads every row of `ty` and checks the PENDING and ACTIVITY indexes against them: a
/// pending row has exactly its pending key, a running row exactly its activity key, and no
/// index key points at nothing.
pub fn observe(store: &MemoryStore, keys: &Keys, ty: &str) -> Result<Jobs, String> {
    let data = keys.data_range(ty);
    let pending = keys.pending_range(ty, MAX_SCHED_TIME);
    let activity = keys.activity_range(ty);
    let mut rows = BTreeMap::new();
    let mut pending_keys = Vec::new();
    let mut activity_keys = Vec::new();
    for kv in store.dump() {
        if within(&kv.key, &data) {
            let id = keys.decode_data_key(&kv.key).map_err(|e| e.to_string())?;
            let row = JobRow::decode(&kv.value).map_err(|e| format!("{id}: {e}"))?;
            rows.insert(id, row);
        } else if within(&kv.key, &pending) {
            pending_keys.push(
                keys.decode_pending_key(&kv.key)
                    .map_err(|e| e.to_string())?,
            );
        } else if within(&kv.key, &activity) {
            let vs = keys
                .decode_activity_key(&kv.key)
                .map_err(|e| e.to_string())?;
            let (id, _) = decode_activity(&kv.value).map_err(|e| e.to_string())?;
            activity_keys.push((vs.as_bytes().to_vec(), id));
        }
    }
    let mut indexed = BTreeSet::new();
    for (stime, id) in &pending_keys {
        match rows.get(id) {
            Some(row) if row.state() == JobState::Pending && row.stime == *stime => {}
            other => return Err(format!("pending key ({stime}, {id}) for row {other:?}")),
        }
        if !indexed.insert(id.clone()) {
            return Err(format!("{id} has two index keys"));
        }
    }
    for (vs, id) in &activity_keys {
        match rows.get(id) {
            Some(row) if row.running_vs().map(|v| v.as_bytes().to_vec()) == Some(vs.clone()) => {}
            other => return Err(format!("activity key for {id} but row {other:?}")),
        }
        if !indexed.insert(id.clone()) {
            return Err(format!("{id} has two index keys"));
        }
    }
    for (id, row) in &rows {
        if row.state() != JobState::Finished && !indexed.contains(id) {
            return Err(format!("{id} is {:?} but not indexed", row.state()));
        }
    }
    Ok(rows
        .iter()
        .map(|(id, row)| (id.clone(), Seen::of(row)))
        .collect())
}

/// Ids whose observation differs between `a` and `b` (appeared, vanished or changed).
pub fn changed(a: &Jobs, b: &Jobs) -> BTreeSet<String> {
    a.keys()
        .chain(b.keys())
        .filter(|id| a.get(*id) != b.get(*id))
        .cloned()
        .collect()
}
