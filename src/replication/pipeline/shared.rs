//! What the changes reader, the workers and the run loop share for one replication
//! ([`Shared`]): both endpoint clients, the counters, the [`Tracker`] that keeps the
//! checkpoint behind every batch still in flight, the highest source sequence seen, and the
//! adaptive window with its bounds (how many batches and bytes may be in flight).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use super::fetch::BulkGetGate;
use super::revs_diff::DiffSkipper;
use super::stats::Counters;
use crate::replication::changes::reader::Batch;
use crate::replication::http::client::HttpClient;
use crate::replication::options::spec::{ReplicationOptions, ReplicationSpec};
use crate::replication::pipeline::in_flight::{InFlight, InFlightLimits, InFlightStats};
use crate::telemetry::NodeMetrics;

/// Orders batches so the checkpoint never passes one still in flight.
#[derive(Debug)]
pub(crate) struct Tracker {
    pending: BTreeMap<u64, (Value, bool)>,
    through: Value,
}

impl Tracker {
    /// A tracker whose through-sequence starts at `since` (the start point).
    pub(crate) fn new(since: Value) -> Self {
        Self {
            pending: BTreeMap::new(),
            through: since,
        }
    }

    fn register(&mut self, index: u64, seq: Value) {
        self.pending.insert(index, (seq, false));
    }

    /// Batch `index` is written: the checkpoint may pass it once every earlier one is.
    pub(super) fn complete(&mut self, index: u64) {
        if let Some(e) = self.pending.get_mut(&index) {
            e.1 = true;
        }
        while let Some(entry) = self.pending.first_entry() {
            if !entry.get().1 {
                break;
            }
            self.through = entry.remove().0;
        }
    }
}

/// What the changes reader, the workers and the run loop share for one replication.
pub(crate) struct Shared {
    pub(crate) src: Arc<HttpClient>,
    pub(crate) tgt: Arc<HttpClient>,
    pub(crate) spec: ReplicationSpec,
    pub(crate) counters: Arc<Counters>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) tracker: Mutex<Tracker>,
    pub(crate) skipper: Mutex<DiffSkipper>,
    pub(crate) bulk_get: Mutex<BulkGetGate>,
    /// Whether attachments are fetched as stored (multipart, `att_encoding_info`) and written
    /// so: false only from a CouchDB source to a target that would not keep them encoded.
    pub(crate) keep_encoding: bool,
    pub(crate) source_seq: Mutex<Value>,
    /// Told of every batch registered or completed, so the run loop publishes stats after
    /// progress instead of polling: an idle job then wakes nobody.
    pub(crate) moved: tokio::sync::Notify,
    /// How many batches and bytes may be in flight (see [`InFlight`]), and who waits for it.
    pub(crate) in_flight: Mutex<InFlight>,
    pub(crate) in_flight_moved: tokio::sync::Notify,
    /// The window's statistics as of the last batch done (what the handle shows).
    pub(crate) in_flight_stats: Arc<Mutex<InFlightStats>>,
}

/// A replication's window (see [`InFlight`]) for options `o`, `bytes` in flight at most, and
/// the source's database info `src_info`.
pub(crate) fn new_in_flight(o: &ReplicationOptions, bytes: u64, src_info: &Value) -> InFlight {
    InFlight::new(in_flight_limits(o, bytes), doc_size_hint(src_info))
}

/// The window's bounds: it may grow to `http_connections` batches in flight (each batch
/// holds one request at a time), within `bytes`. It starts at `worker_processes` or half
/// of that maximum, whichever is more: every doubling costs a batch's time (about four
/// round trips), which on a 200 ms link was a third of a 20,000-document copy.
fn in_flight_limits(o: &ReplicationOptions, bytes: u64) -> InFlightLimits {
    let max = o.worker_processes.max(o.http_connections).max(1);
    InFlightLimits {
        initial: o.worker_processes.max(max / 2).max(1),
        min: 1,
        max,
        max_bytes: bytes,
    }
}

/// The source's average document size from its database info (`sizes.external` over the
/// documents), the window's first byte estimate, if it says.
fn doc_size_hint(info: &Value) -> Option<u64> {
    let external = info.pointer("/sizes/external").and_then(Value::as_u64);
    let docs = info.get("doc_count").and_then(Value::as_u64);
    match (external, docs) {
        (Some(bytes), Some(n)) if n > 0 && bytes > 0 => Some((bytes / n).max(64)),
        _ => None,
    }
}

/// A poisoned lock only means a worker panicked mid-update; the data is still usable.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// The changes reader handed out `b`: track it, and move the source sequence shown in
    /// stats forward (never back: numeric sequences only grow, opaque ones are taken as is).
    pub(crate) fn note_batch(&self, b: &Batch) {
        lock(&self.tracker).register(b.index, b.last_seq.clone());
        self.moved.notify_one();
        let mut seq = lock(&self.source_seq);
        match (seq.as_u64(), b.last_seq.as_u64()) {
            (Some(cur), Some(new)) if new <= cur => {}
            _ => *seq = b.last_seq.clone(),
        }
    }

    /// The sequence every batch up to which is written (where a checkpoint may point).
    pub(crate) fn through_seq(&self) -> Value {
        lock(&self.tracker).through.clone()
    }

    /// The most batches the window may ever allow (one worker each).
    pub(crate) fn in_flight_max(&self) -> usize {
        lock(&self.in_flight).max()
    }

    /// The highest source sequence seen (the source's `update_seq` until a batch arrives).
    pub(crate) fn source_seq(&self) -> Value {
        lock(&self.source_seq).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn through_seq_never_passes_an_unfinished_batch() {
        let mut t = Tracker::new(json!(0));
        for i in 0..3 {
            t.register(i, json!((i + 1) * 10));
        }
        t.complete(1);
        assert_eq!(t.through, json!(0));
        t.complete(2);
        assert_eq!(t.through, json!(0));
        t.complete(0);
        assert_eq!(t.through, json!(30));
    }
}
