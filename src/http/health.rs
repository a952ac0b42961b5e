//! `GET /_up` (is this node's replicator tree alive) and `GET /metrics` (Prometheus text:
//! the process-wide recorder, with job gauges refreshed at every scrape).

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::{HttpError, HttpResult};
use crate::replicator::RepState;

/// `GET /_up`: 200 `{"status":"ok"}` while the tree's event bus runs, else 503.
pub async fn up(State(st): State<AppState>) -> Response {
    let rep = st.replicator();
    if rep.subscribe().is_some() {
        Json(json!({"status": "ok", "node": rep.node()})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "maintenance_mode", "node": rep.node()})),
        )
            .into_response()
    }
}

/// `GET /metrics`: Prometheus exposition text.
pub async fn metrics(State(st): State<AppState>) -> HttpResult<Response> {
    let Some(handle) = st.metrics() else {
        return Err(HttpError::not_found("no metrics recorder is installed"));
    };
    if let Ok(jobs) = st.replicator().list().await {
        for state in [
            RepState::Pending,
            RepState::Running,
            RepState::Crashing,
            RepState::Completed,
            RepState::Failed,
        ] {
            let n = jobs.iter().filter(|j| j.state == state).count();
            metrics::gauge!("couch_replicator_jobs", "state" => state.as_str()).set(n as f64);
        }
        metrics::gauge!("couch_replicator_jobs_total").set(jobs.len() as f64);
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response())
}
