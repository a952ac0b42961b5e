//! `GET /` (welcome), `GET /_up` (is this node's replicator tree alive), and the middleware
//! counting requests by method and status (`couch_replicator_http_requests_total`, in the
//! node's metrics that `/metrics` renders; see [`super::node_stats`]).

use axum::Json;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;

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

/// Counts every request by method and status code, in the node's metrics.
pub async fn count_requests(
    State(st): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // Methods outside HTTP's own are one label: each made-up method would otherwise be a
    // series kept for ever.
    let method = match *req.method() {
        Method::GET
        | Method::HEAD
        | Method::POST
        | Method::PUT
        | Method::DELETE
        | Method::OPTIONS
        | Method::PATCH
        | Method::TRACE
        | Method::CONNECT => req.method().as_str().to_owned(),
        _ => "OTHER".to_owned(),
    };
    let resp = next.run(req).await;
    st.replicator()
        .metrics()
        .count_request(&method, resp.status().as_u16());
    resp
}
