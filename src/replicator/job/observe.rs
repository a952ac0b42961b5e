//! What a job actor shows operators: its tracing span (`replication_job` with the job id, the
//! replication id once known, the endpoints with the password masked,
//! and the node), and CouchDB's scheduler counters for its starts and ends.

use supervisors::ExitReason;

use crate::replication::ReplicationError;
use crate::telemetry::{NodeMetrics, Series};

use super::id::JobId;
use super::record::RepJobRecord;
use super::view::parse_rep;
use crate::replicator::node::name::NodeName;

/// The span every handler of the job enters (the engine's tasks inherit it).
pub fn job_span(node: &NodeName, job_id: &JobId, record: &RepJobRecord) -> tracing::Span {
    // Logs keep the user name (password masked), which helps operators more than the
    // stripped URL the HTTP API shows. Only the endpoints are shown: the node's per-job
    // defaults do not change them.
    let defaults = crate::replication::ReplicationOptions::default();
    let rep = serde_json::Value::Object(record.rep.clone());
    let (source, target) = match parse_rep(&rep, &defaults) {
        Ok(spec) => (spec.source.to_string(), spec.target.to_string()),
        Err(_) => ("invalid".to_owned(), "invalid".to_owned()),
    };
    tracing::info_span!(
        "replication_job",
        job_id = %job_id,
        rep_id = tracing::field::Empty,
        source = %source,
        target = %target,
        node = %node,
    )
}

/// After `Start`: a job now running counts a start, one whose start errored a failed start
/// (a start that marked the job `failed` counted itself).
pub fn count_start(m: &NodeMetrics, running: bool, errored: bool) {
    if running {
        m.inc(Series::JobsStarts);
    } else if errored {
        m.inc(Series::FailedStarts);
    }
}

/// A run that ended with an error: one that never got going is also a failed start.
pub fn count_run_error(m: &NodeMetrics, e: &ReplicationError) {
    if e.is_start_failure() {
        m.inc(Series::FailedStarts);
    }
}

/// The actor's end: a crash, or a stop (rotation, shutdown).
pub fn count_end(m: &NodeMetrics, reason: &ExitReason) {
    m.inc(match reason {
        ExitReason::Error(_) => Series::JobsCrashes,
        ExitReason::Normal | ExitReason::Shutdown => Series::JobsStops,
    });
}
