//! CouchDB 3.4's `couch_replicator` statistics: one table of the 36 series (their path in
//! `/_node/_local/_stats`, kind, and both descriptions CouchDB uses), and [`CouchStats`], one
//! node's lock-free values of them. Names, kinds and texts are CouchDB's so dashboards written
//! for CouchDB work unchanged; what each one counts here is documented on [`Series`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counter (only grows) or gauge (set at scrape time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic.
    Counter,
    /// Current value.
    Gauge,
}

impl Kind {
    /// `counter` / `gauge`, as both the stats JSON and Prometheus spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
        }
    }
}

/// One series of the table.
#[derive(Debug, Clone, Copy)]
pub struct SeriesDef {
    /// Path under `couch_replicator` in the stats JSON (`["jobs", "adds"]`).
    pub path: &'static [&'static str],
    /// Counter or gauge.
    pub kind: Kind,
    /// The stats JSON `desc`.
    pub desc: &'static str,
    /// The Prometheus `# HELP` text (CouchDB words the `success` series differently there).
    pub help: &'static str,
}

impl SeriesDef {
    /// The Prometheus name: `couchdb_couch_replicator_` + the path joined by `_` (a final
    /// `success` dropped), `_total` appended to counters, as CouchDB 3.4 names them.
    pub fn prometheus_name(&self) -> String {
        let mut parts: Vec<&str> = self.path.to_vec();
        if parts.len() > 1 && parts.last() == Some(&"success") {
            parts.pop();
        }
        let mut name = format!("couchdb_couch_replicator_{}", parts.join("_"));
        if self.kind == Kind::Counter {
            name.push_str("_total");
        }
        name
    }
}

macro_rules! series {
    ($( $(#[$doc:meta])* $variant:ident => [$($p:literal),+], $kind:ident, $desc:literal $(, $help:literal)?; )+) => {
        /// The series, in table order. Each variant says what increments it on this node.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Series { $( $(#[$doc])* $variant, )+ }

        /// Every series with its path, kind and texts, indexed by `Series as usize`.
        pub const TABLE: &[SeriesDef] = &[
            $( SeriesDef {
                path: &[$($p),+],
                kind: Kind::$kind,
                desc: $desc,
                help: series!(@help $desc $(, $help)?),
            }, )+
        ];
    };
    (@help $desc:literal) => { $desc };
    (@help $desc:literal, $help:literal) => { $help };
}

series! {
    /// Reading a `_replicator` database's changes failed (its follower retries shortly).
    ChangesManagerDeaths => ["changes_manager_deaths"], Counter, "number of failed replicator changes managers";
    /// No separate work queue process here: always 0.
    // Never counted, but CouchDB's table has the series and `TABLE` is indexed by variant:
    // it must exist (as dead code outside the crate's tests).
    #[allow(dead_code)]
    ChangesQueueDeaths => ["changes_queue_deaths"], Counter, "number of failed replicator changes work queues";
    /// A replication's changes reader gave up after its retries.
    ChangesReadFailures => ["changes_read_failures"], Counter, "number of failed replicator changes read failures";
    /// A replication's changes reader task ended with an error or panicked.
    ChangesReaderDeaths => ["changes_reader_deaths"], Counter, "number of failed replicator changes readers";
    /// A checkpoint could not be written.
    CheckpointsFailure => ["checkpoints", "failure"], Counter, "number of failed checkpoint saves";
    /// A checkpoint was written to both endpoints.
    CheckpointsSuccess => ["checkpoints", "success"], Counter, "number of checkpoints successfully saves", "number of checkpoint saves";
    /// A job was granted a share of an endpoint's connection budget.
    ConnectionAcquires => ["connection", "acquires"], Counter, "number of times connections are shared";
    /// An HTTP client of a replication was dropped at its end.
    ConnectionCloses => ["connection", "closes"], Counter, "number of times a worker is gracefully shut down";
    /// An HTTP client (with its connection pool) was built for an endpoint.
    ConnectionCreates => ["connection", "creates"], Counter, "number of connections created";
    /// A job actor holding a connection lease died without releasing it.
    ConnectionOwnerCrashes => ["connection", "owner_crashes"], Counter, "number of times a connection owner crashes while owning at least one connection";
    /// A job released its connection lease.
    ConnectionReleases => ["connection", "releases"], Counter, "number of times ownership of a connection is released";
    /// Connection failures seen by requests (refused, reset, timed out).
    ConnectionWorkerCrashes => ["connection", "worker_crashes"], Counter, "number of times a worker unexpectedly terminates";
    /// The doc processor started reading a `_replicator` database from the start (when it
    /// first found it, and again after it was deleted and re-created).
    DbScans => ["db_scans"], Counter, "number of times replicator db scans have been started";
    /// A `_replicator` document was updated to `completed`.
    DocsCompletedStateUpdates => ["docs", "completed_state_updates"], Counter, "number of 'completed' state document updates";
    /// A change of a `_replicator` database was processed.
    DocsDbChanges => ["docs", "db_changes"], Counter, "number of db changes processed by replicator doc processor";
    /// A followed `_replicator` database was found deleted.
    DocsDbsDeleted => ["docs", "dbs_deleted"], Counter, "number of db shard deletions seen by replicator doc processor";
    /// A `_replicator` database started being followed.
    DocsDbsFound => ["docs", "dbs_found"], Counter, "number of db shard found by replicator doc processor";
    /// A `_replicator` document was updated to `failed`.
    DocsFailedStateUpdates => ["docs", "failed_state_updates"], Counter, "number of 'failed' state document updates";
    /// A job could not start (invalid document, endpoint unreachable, duplicate).
    FailedStarts => ["failed_starts"], Counter, "number of replications that have failed to start";
    /// A job was added (`POST /_replicate`, a `_replicator` document).
    JobsAdds => ["jobs", "adds"], Counter, "number of jobs added to replicator scheduler";
    /// Jobs in `crashing` (set at scrape time, cluster-wide).
    JobsCrashed => ["jobs", "crashed"], Gauge, "replicator scheduler crashed jobs";
    /// A job run on this node ended with an error.
    JobsCrashes => ["jobs", "crashes"], Counter, "number of job crashed noticed by replicator scheduler";
    /// An add found the same replication already pending or running.
    JobsDuplicateAdds => ["jobs", "duplicate_adds"], Counter, "number of duplicate jobs added to replicator scheduler";
    /// Jobs waiting to run (set at scrape time, cluster-wide).
    JobsPending => ["jobs", "pending"], Gauge, "replicator scheduler pending jobs";
    /// A job was removed (cancelled, its document deleted).
    JobsRemoves => ["jobs", "removes"], Counter, "number of jobs removed from replicator scheduler";
    /// Jobs running on this node (set at scrape time).
    JobsRunning => ["jobs", "running"], Gauge, "replicator scheduler running jobs";
    /// A job started running on this node.
    JobsStarts => ["jobs", "starts"], Counter, "number of jobs started by replicator scheduler";
    /// A running job on this node was stopped (rotation, shutdown).
    JobsStops => ["jobs", "stops"], Counter, "number of jobs stopped by replicator scheduler";
    /// All jobs (set at scrape time, cluster-wide).
    JobsTotal => ["jobs", "total"], Gauge, "total number of replicator scheduler jobs";
    /// Every HTTP request attempt a replication sent (retries count again).
    Requests => ["requests"], Counter, "number of HTTP requests made by the replicator";
    /// A buffered response with status 408 or 5xx.
    ResponsesFailure => ["responses", "failure"], Counter, "number of failed HTTP responses received by the replicator";
    /// A buffered response with any other status except 429 (which the rate limiter takes).
    ResponsesSuccess => ["responses", "success"], Counter, "number of successful HTTP responses received by the replicator", "number of HTTP responses received by the replicator";
    /// A streamed response (a `_changes` feed) with status 408 or 5xx, or a transport error.
    StreamResponsesFailure => ["stream_responses", "failure"], Counter, "number of failed streaming HTTP responses received by the replicator";
    /// A streamed response with any other status except 429.
    StreamResponsesSuccess => ["stream_responses", "success"], Counter, "number of successful streaming HTTP responses received by the replicator", "number of streaming HTTP responses received by the replicator";
    /// A replication worker task ended with an error or panicked.
    WorkerDeaths => ["worker_deaths"], Counter, "number of failed replicator workers";
    /// A replication worker task was started.
    WorkersStarted => ["workers_started"], Counter, "number of replicator workers started";
}

/// One node's values of `TABLE`.
#[derive(Debug)]
pub struct CouchStats {
    values: Vec<AtomicU64>,
}

impl Default for CouchStats {
    fn default() -> Self {
        Self {
            values: TABLE.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl CouchStats {
    /// Adds one to a counter.
    pub fn inc(&self, s: Series) {
        self.add(s, 1);
    }

    /// Adds `n` to a counter.
    pub fn add(&self, s: Series, n: u64) {
        if let Some(v) = self.values.get(s as usize) {
            v.fetch_add(n, Relaxed);
        }
    }

    /// Sets a gauge.
    pub fn set(&self, s: Series, n: u64) {
        if let Some(v) = self.values.get(s as usize) {
            v.store(n, Relaxed);
        }
    }

    /// The current value (the crate's tests read counters; scrapes use `snapshot`).
    #[cfg(any(test, feature = "internals"))]
    pub fn get(&self, s: Series) -> u64 {
        self.values.get(s as usize).map_or(0, |v| v.load(Relaxed))
    }

    /// Every series with its current value, in table order.
    pub fn snapshot(&self) -> Vec<(&'static SeriesDef, u64)> {
        TABLE
            .iter()
            .zip(&self.values)
            .map(|(d, v)| (d, v.load(Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_couchdbs_scheme() {
        let name = |s: Series| TABLE[s as usize].prometheus_name();
        assert_eq!(
            name(Series::ResponsesSuccess),
            "couchdb_couch_replicator_responses_total"
        );
        assert_eq!(
            name(Series::JobsTotal),
            "couchdb_couch_replicator_jobs_total"
        );
        assert_eq!(
            name(Series::JobsAdds),
            "couchdb_couch_replicator_jobs_adds_total"
        );
        let st = CouchStats::default();
        st.add(Series::Requests, 3);
        st.set(Series::JobsRunning, 2);
        assert_eq!(st.get(Series::Requests), 3);
        assert_eq!(st.get(Series::JobsRunning), 2);
    }
}
