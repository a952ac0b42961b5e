//! What operators watch: one node's metrics ([`NodeMetrics`]: CouchDB's `couch_replicator`
//! series plus our own node-wide counters), their Prometheus text and CouchDB stats-JSON
//! renderings, bounded per-job aggregates (`job_gauges`), a latency histogram, and the
//! log/span setup ([`logging`]). A leaf module: every layer may report here, it imports none.
//!
//! Metrics are per node, not in a process-global recorder, so several nodes in one process
//! (tests, embedded hosts) each report their own numbers.

pub(crate) mod couch_series;
pub(crate) mod exposition;
pub(crate) mod histogram;
pub(crate) mod job_gauges;
pub mod logging;
pub(crate) mod stats_json;
pub(crate) mod store_stats;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use couch_series::{CouchStats, Series};
pub use exposition::Exposition;
pub use histogram::Histogram;
pub use store_stats::StoreStats;

/// One node's metrics. Shared as `Arc<NodeMetrics>` by everything the node runs.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    /// CouchDB's series.
    pub couch: CouchStats,
    /// Documents written to targets by this node's replications.
    pub docs_written: AtomicU64,
    /// Revisions checked against targets (`_revs_diff`) by this node's replications.
    pub revisions_checked: AtomicU64,
    /// Revisions the targets were missing.
    pub missing_revisions_found: AtomicU64,
    /// Documents targets rejected.
    pub doc_write_failures: AtomicU64,
    /// HTTP requests sent again after a retryable failure.
    pub request_retries: AtomicU64,
}

impl NodeMetrics {
    /// Shorthand for `self.couch.inc(s)`.
    pub fn inc(&self, s: Series) {
        self.couch.inc(s);
    }

    /// Adds `n` to one of the node-wide counters.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// Writes CouchDB's series, then ours.
    pub fn render(&self, e: &mut Exposition) {
        for (def, value) in self.couch.snapshot() {
            let name = def.prometheus_name();
            e.single(&name, def.kind.as_str(), def.help, value as f64);
        }
        let ours: [(&str, &str, &AtomicU64); 5] = [
            (
                "couch_replicator_docs_written_total",
                "documents written to targets by this node's replications",
                &self.docs_written,
            ),
            (
                "couch_replicator_revisions_checked_total",
                "revisions checked against targets (_revs_diff) by this node's replications",
                &self.revisions_checked,
            ),
            (
                "couch_replicator_missing_revisions_found_total",
                "revisions the targets were missing",
                &self.missing_revisions_found,
            ),
            (
                "couch_replicator_doc_write_failures_total",
                "documents the targets rejected",
                &self.doc_write_failures,
            ),
            (
                "couch_replicator_request_retries_total",
                "HTTP requests retried after a connection error, timeout, 408 or 5xx",
                &self.request_retries,
            ),
        ];
        for (name, help, v) in ours {
            e.single(name, "counter", help, v.load(Relaxed) as f64);
        }
    }
}
