//! axum's own refusals in CouchDB's form: an extractor that cannot read a request (a query
//! string that does not parse, a path segment that is not UTF-8, ...) answers plain text;
//! this middleware turns any such 4xx into `{"error", "reason"}` with the same status, so every
//! error a client sees has CouchDB's shape. Found by the randomized requests of
//! `tests/reliability/request_fuzz.rs`.

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::HttpError;

/// The most of a plain-text refusal kept as the reason.
const REASON_BYTES: usize = 4096;

/// Rewrites a plain-text client error as CouchDB's JSON error.
pub(crate) async fn as_couchdb_error(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let plain = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/plain"));
    if !status.is_client_error() || !plain {
        return resp;
    }
    let (_, body) = resp.into_parts();
    let text = to_bytes(Body::new(body), REASON_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|_| status.to_string());
    let tag = match status.as_u16() {
        404 => "not_found",
        405 => "method_not_allowed",
        413 => "too_large",
        415 => "bad_content_type",
        _ => "bad_request",
    };
    HttpError::new(status, tag, text).into_response()
}
