//! The node's numbers over HTTP: `GET /metrics` (Prometheus text, unauthenticated like
//! CouchDB's separate metrics port), `GET /_node/{node}/_prometheus` (the same, admins only),
//! `GET /_node/{node}/_stats[/path...]` (CouchDB's stats JSON, admins only; an unknown path
//! answers `null` as CouchDB does), `GET /_node/{node}/_replicator_jobs` (the jobs this process
//! runs, admins only). `{node}` is `_local` or this node's name.
//!
//! Nothing here reads the store: the job counts come from the job server's last census
//! (`replicator::scheduler::census`, at most an `interval` old, sooner after a change; its age
//! is `couch_replicator_jobs_census_age_seconds`). `jobs.running` counts this node's running
//! jobs; `jobs.pending`, `jobs.crashed` and `jobs.total` describe the queue all nodes share,
//! so they read the same on every node (aggregate them with `max`, not `sum`).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::AppState;
use super::auth::Caller;
use super::error::{HttpError, HttpResult};
use crate::replicator::RepState;
use crate::replicator::scheduler::census::{Census, STATES};
use crate::telemetry::job_gauges;
use crate::telemetry::stats_json::{StatNode, stats_tree};
use crate::telemetry::{Exposition, Series};

/// Sets CouchDB's scheduler gauges from the last census: `jobs.running` is this node's
/// running jobs as the job server counts them now; the others are the census'.
fn refresh(st: &AppState) -> Arc<Census> {
    let rep = st.replicator();
    let c = rep.census();
    let m = rep.metrics();
    m.couch.set(
        Series::JobsRunning,
        rep.job_sup().which_children().len() as u64,
    );
    m.couch.set(Series::JobsPending, c.count(RepState::Pending));
    m.couch
        .set(Series::JobsCrashed, c.count(RepState::Crashing));
    m.couch.set(Series::JobsTotal, c.total);
    c
}

/// The job counts per state `/metrics` has always had (kept for existing dashboards), and
/// the census' age.
fn render_job_states(e: &mut Exposition, c: &Census) {
    let name = "couch_replicator_jobs";
    e.family(name, "gauge", "replication jobs of the cluster per state");
    for (state, n) in STATES.iter().zip(c.by_state) {
        e.sample(name, &[("state", state.as_str())], n as f64);
    }
    e.single(
        "couch_replicator_jobs_total",
        "gauge",
        "replication jobs of the cluster",
        c.total as f64,
    );
    e.single(
        "couch_replicator_jobs_census_age_seconds",
        "gauge",
        "how old the job counts are (taken by the job server, not by the scrape)",
        c.taken.map_or(-1.0, |t| t.elapsed().as_secs_f64()),
    );
}

/// couch_jobs queue depth per job type: all pending jobs, and those due now.
fn render_queues(c: &Census, e: &mut Exposition) {
    let name = "couch_jobs_pending";
    e.family(
        name,
        "gauge",
        "couch_jobs pending jobs per type (including backed-off ones)",
    );
    for q in &c.queues {
        e.sample(name, &[("type", &q.job_type)], q.pending as f64);
    }
    let name = "couch_jobs_pending_due";
    e.family(
        name,
        "gauge",
        "couch_jobs pending jobs per type whose scheduled time has come",
    );
    for q in &c.queues {
        e.sample(name, &[("type", &q.job_type)], q.due as f64);
    }
}

/// The whole Prometheus document of this node, from numbers it keeps: nothing is read from
/// the store.
pub fn render(st: &AppState) -> String {
    let census = refresh(st);
    let mut e = Exposition::default();
    st.replicator().metrics().render(&mut e);
    render_job_states(&mut e, &census);
    job_gauges::render(&mut e, &census.mine);
    render_queues(&census, &mut e);
    let jobs = st.replicator().jobs();
    e.single(
        "couch_jobs_rows_listed_total",
        "counter",
        "job rows read by scans of every job (the census, the status page, _scheduler/jobs)",
        jobs.rows_listed() as f64,
    );
    let db = jobs.db();
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
    text_response(render(&st))
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
    Ok(text_response(render(&st)))
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
    refresh(&st);
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
