//! The node's numbers over HTTP: `GET /metrics` (Prometheus text, unauthenticated like
//! CouchDB's separate metrics port), `GET /_node/{node}/_prometheus` (the same, admins only),
//! `GET /_node/{node}/_stats[/path...]` (CouchDB's stats JSON, admins only; an unknown path
//! answers `null` as CouchDB does), `GET /_node/{node}/_replicator_jobs` (the jobs this process
//! runs, admins only). `{node}` is `_local` or this node's name.
//!
//! Gauges are refreshed at each request from the job list: `jobs.running` counts this node's
//! running jobs; `jobs.pending`, `jobs.crashed` and `jobs.total` describe the queue all nodes
//! share, so they read the same on every node (aggregate them with `max`, not `sum`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::AppState;
use super::auth::Caller;
use super::error::{HttpError, HttpResult};
use super::status_page::model::queues;
use crate::replicator::{JobId, JobView, RepState};
use crate::telemetry::job_gauges::{self, JobSample};
use crate::telemetry::stats_json::{StatNode, stats_tree};
use crate::telemetry::{Exposition, Series};

/// The numeric part of a sequence: a number, or the `N` of CouchDB's `N-opaque` strings.
fn seq_number(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.split('-').next().and_then(|n| n.parse().ok()),
        _ => None,
    }
}

fn sample(j: &JobView) -> JobSample<JobId> {
    let n = j.stats.clone().unwrap_or_default();
    let lag = match (
        seq_number(&n.through_seq),
        seq_number(&n.checkpointed_source_seq),
    ) {
        (Some(t), Some(c)) => Some(t.saturating_sub(c)),
        _ => None,
    };
    JobSample {
        job_id: j.job_id.clone(),
        changes_pending: n.changes_pending,
        checkpoint_lag: lag,
        docs_written: n.docs_written,
    }
}

/// Sets CouchDB's scheduler gauges from the job list; returns what it counted.
async fn refresh(st: &AppState) -> Refreshed {
    let rep = st.replicator();
    let Ok(jobs) = rep.list().await else {
        return Refreshed::default();
    };
    let m = rep.metrics();
    let count = |s: RepState| jobs.iter().filter(|j| j.state == s).count() as u64;
    let mine: Vec<&JobView> = jobs
        .iter()
        .filter(|j| j.state == RepState::Running && j.node.as_ref() == Some(rep.node()))
        .collect();
    m.couch.set(Series::JobsRunning, mine.len() as u64);
    m.couch.set(Series::JobsPending, count(RepState::Pending));
    m.couch.set(Series::JobsCrashed, count(RepState::Crashing));
    m.couch.set(Series::JobsTotal, jobs.len() as u64);
    let states = [
        RepState::Pending,
        RepState::Running,
        RepState::Crashing,
        RepState::Completed,
        RepState::Failed,
    ];
    Refreshed {
        samples: mine.into_iter().map(sample).collect(),
        by_state: states.map(|s| (s, count(s))),
        total: jobs.len() as u64,
    }
}

/// What one pass over the job list found.
#[derive(Default)]
struct Refreshed {
    /// This node's running jobs.
    samples: Vec<JobSample<JobId>>,
    /// The cluster's jobs per state.
    by_state: [(RepState, u64); 5],
    total: u64,
}

/// The job counts per state `/metrics` has always had (kept for existing dashboards).
fn render_job_states(e: &mut Exposition, r: &Refreshed) {
    let name = "couch_replicator_jobs";
    e.family(name, "gauge", "replication jobs of the cluster per state");
    for (state, n) in &r.by_state {
        e.sample(name, &[("state", state.as_str())], *n as f64);
    }
    e.single(
        "couch_replicator_jobs_total",
        "gauge",
        "replication jobs of the cluster",
        r.total as f64,
    );
}

/// couch_jobs queue depth per job type: all pending jobs, and those due now.
async fn render_queues(st: &AppState, e: &mut Exposition) {
    let depth = queues(st).await;
    let name = "couch_jobs_pending";
    e.family(
        name,
        "gauge",
        "couch_jobs pending jobs per type (including backed-off ones)",
    );
    for q in &depth {
        e.sample(name, &[("type", &q.job_type)], q.pending as f64);
    }
    let name = "couch_jobs_pending_due";
    e.family(
        name,
        "gauge",
        "couch_jobs pending jobs per type whose scheduled time has come",
    );
    for q in &depth {
        e.sample(name, &[("type", &q.job_type)], q.due as f64);
    }
}

/// The whole Prometheus document of this node.
pub async fn render(st: &AppState) -> String {
    let refreshed = refresh(st).await;
    let mut e = Exposition::default();
    st.replicator().metrics().render(&mut e);
    render_job_states(&mut e, &refreshed);
    job_gauges::render(&mut e, &refreshed.samples);
    render_queues(st, &mut e).await;
    let db = st.replicator().jobs().db();
    db.stats().render(&mut e);
    let (engine, counters) = db.engine_counters();
    for c in counters {
        let name = format!("couch_replicator_store_{engine}_{}_total", c.name);
        e.single(&name, "counter", c.help, c.value as f64);
    }
    e.finish()
}

fn text_response(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `GET /metrics`.
pub async fn metrics(State(st): State<AppState>) -> Response {
    text_response(render(&st).await)
}

fn check_node(st: &AppState, node: &str) -> HttpResult<()> {
    if node == "_local" || node == st.replicator().node().as_str() {
        Ok(())
    } else {
        Err(HttpError::not_found(format!("no such node: {node}")))
    }
}

/// `GET /_node/{node}/_prometheus`.
pub async fn prometheus(
    State(st): State<AppState>,
    caller: Caller,
    Path(node): Path<String>,
) -> HttpResult<Response> {
    caller.require_admin()?;
    check_node(&st, &node)?;
    Ok(text_response(render(&st).await))
}

/// `GET /_node/{node}/_replicator_jobs`: the ids of the jobs whose actors run on this very
/// node (`_scheduler/jobs` and `_active_tasks` show the store's view, shared by every node;
/// this is the process's own, so sampling every node shows whether one replication runs on
/// two at once). Not a CouchDB endpoint.
pub async fn local_jobs(
    State(st): State<AppState>,
    caller: Caller,
    Path(node): Path<String>,
) -> HttpResult<Json<Value>> {
    caller.require_admin()?;
    check_node(&st, &node)?;
    let mut jobs = st.replicator().job_sup().which_children();
    jobs.sort();
    Ok(Json(
        serde_json::json!({"node": st.replicator().node(), "jobs": jobs}),
    ))
}

/// `GET /_node/{node}/_stats`: `{"couch_replicator": {...}}`.
pub async fn stats(
    State(st): State<AppState>,
    caller: Caller,
    Path(node): Path<String>,
) -> HttpResult<Json<Value>> {
    stats_at(st, caller, node, String::new()).await
}

/// `GET /_node/{node}/_stats/{path}` (`couch_replicator`, `couch_replicator/jobs`, ...).
pub(crate) async fn stats_path(
    State(st): State<AppState>,
    caller: Caller,
    Path((node, path)): Path<(String, String)>,
) -> HttpResult<Json<Value>> {
    stats_at(st, caller, node, path).await
}

async fn stats_at(
    st: AppState,
    caller: Caller,
    node: String,
    path: String,
) -> HttpResult<Json<Value>> {
    caller.require_admin()?;
    check_node(&st, &node)?;
    refresh(&st).await;
    let tree = stats_tree(&st.replicator().metrics().couch);
    let mut root = std::collections::BTreeMap::new();
    root.insert("couch_replicator", tree);
    let mut at = &StatNode::Group(root);
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        match at {
            StatNode::Group(g) => match g.get(seg) {
                Some(child) => at = child,
                None => return Ok(Json(Value::Null)),
            },
            StatNode::Leaf { .. } => return Ok(Json(Value::Null)),
        }
    }
    Ok(Json(serde_json::to_value(at).unwrap_or(Value::Null)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sequences_are_numbers_or_couchdb_strings() {
        assert_eq!(seq_number(&json!(42)), Some(42));
        assert_eq!(seq_number(&json!("17-g1AAAA")), Some(17));
        assert_eq!(seq_number(&json!("opaque")), None);
        assert_eq!(seq_number(&Value::Null), None);
    }
}
