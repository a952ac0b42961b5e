//! `GET /` (welcome), `GET /_up` (is this node's replicator tree alive), `GET /metrics` (Prometheus text: the
//! process-wide recorder, with job gauges refreshed at every scrape), and the middleware
//! counting requests by method and status (`couch_replicator_http_requests_total`).

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::{HttpError, HttpResult};
use crate::replicator::RepState;

/// `GET /`: CouchDB's welcome object, so clients probing the server recognise it.
pub async fn welcome(State(st): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({
        "couchdb": "Welcome",
        "version": env!("CARGO_PKG_VERSION"),
        "vendor": {"name": "couch-replicator", "version": env!("CARGO_PKG_VERSION")},
        "node": st.replicator().node(),
        "features": ["scheduler"],
    }))
}

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

/// Counts every request by method and status code.
pub async fn count_requests(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let method = req.method().as_str().to_owned();
    let resp = next.run(req).await;
    metrics::counter!(
        "couch_replicator_http_requests_total",
        "method" => method,
        "status" => resp.status().as_u16().to_string()
    )
    .increment(1);
    resp
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
