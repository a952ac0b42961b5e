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

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use couch_series::{CouchStats, Series};
pub use exposition::Exposition;
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
    /// Job acceptors the job server keeps waiting for work (a gauge).
    pub jobs_accepting: AtomicU64,
    /// Jobs the job server runs (a gauge).
    pub jobs_running: AtomicU64,
    /// Scheduling passes the job server made.
    pub reschedules: AtomicU64,
    /// Bytes of the response budget held by bodies being read (a gauge).
    pub response_bytes_held: AtomicU64,
    /// Times a body waited for the response budget.
    pub response_budget_waits: AtomicU64,
    /// Requests this node's API answered, by method and status.
    http_requests: Mutex<BTreeMap<(String, u16), u64>>,
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

    /// Counts one answered API request.
    pub fn count_request(&self, method: &str, status: u16) {
        // Only counters live under the lock, so a poisoned map is still consistent.
        let mut m = self.http_requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((method.to_owned(), status)).or_default() += 1;
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
        let scheduler: [(&str, &str, &str, &AtomicU64); 5] = [
            (
                "couch_replicator_response_bytes_held",
                "gauge",
                "bytes of the node's response budget held by bodies being read",
                &self.response_bytes_held,
            ),
            (
                "couch_replicator_response_budget_waits_total",
                "counter",
                "times a response body waited for the node's response budget",
                &self.response_budget_waits,
            ),
            (
                "couch_replicator_jobs_accepting",
                "gauge",
                "job acceptors this node's job server keeps waiting for work",
                &self.jobs_accepting,
            ),
            (
                "couch_replicator_jobs_running",
                "gauge",
                "jobs this node's job server runs",
                &self.jobs_running,
            ),
            (
                "couch_replicator_jobs_reschedules",
                "counter",
                "scheduling passes of this node's job server",
                &self.reschedules,
            ),
        ];
        for (name, kind, help, v) in scheduler {
            e.single(name, kind, help, v.load(Relaxed) as f64);
        }
        self.render_requests(e);
    }

    fn render_requests(&self, e: &mut Exposition) {
        let name = "couch_replicator_http_requests_total";
        e.family(name, "counter", "requests this node's API answered");
        let m = self.http_requests.lock().unwrap_or_else(|p| p.into_inner());
        for ((method, status), n) in m.iter() {
            let status = status.to_string();
            e.sample(name, &[("method", method), ("status", &status)], *n as f64);
        }
    }
}
