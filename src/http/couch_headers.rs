//! CouchDB's response headers on every reply, and the request id that ties a request to its
//! log lines. One middleware ([`couch_headers`]): it takes the caller's `X-Couch-Request-ID`
//! when it is a plain token (CouchDB reuses it too) or makes a new one of CouchDB's shape (10
//! hex digits), runs the request inside a `request` span carrying that id (so every log line of
//! the request, the job it adds included, names it), logs the request once as CouchDB's httpd
//! does, and adds `X-Couch-Request-ID`, `X-CouchDB-Body-Time`, `Cache-Control:
//! must-revalidate` and `Server` to the response.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, SERVER};
use axum::middleware::Next;
use axum::response::Response;
use rand::RngCore as _;
use tracing::Instrument as _;

/// The request id header, read and written.
pub const REQUEST_ID: &str = "x-couch-request-id";
/// The time CouchDB spent reading the request body, in milliseconds.
pub const BODY_TIME: &str = "x-couchdb-body-time";
/// The `Server` header: CouchDB's product token first, so clients that parse the version
/// from it see the CouchDB release whose API this node serves; the comment says what answers.
pub const SERVER_HEADER: &str = concat!(
    "CouchDB/3.4.3 (couch-replicator/",
    env!("CARGO_PKG_VERSION"),
    ")"
);

/// The longest caller-supplied request id kept; longer or odd ones are replaced.
const MAX_CALLER_ID: usize = 64;

/// A caller's id when it is safe to echo and log: 1..=64 ASCII letters, digits, `-` or `_`.
fn caller_id(req: &Request) -> Option<String> {
    let v = req.headers().get(REQUEST_ID)?.to_str().ok()?;
    let ok = !v.is_empty()
        && v.len() <= MAX_CALLER_ID
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then(|| v.to_owned())
}

/// A new request id: 5 random bytes as 10 hex digits, as CouchDB makes them.
fn new_id() -> String {
    let mut b = [0u8; 5];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// The middleware: see the module doc.
pub async fn couch_headers(req: Request, next: Next) -> Response {
    let id = caller_id(&req).unwrap_or_else(new_id);
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let span = tracing::info_span!("request", request_id = %id);
    let started = std::time::Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    span.in_scope(|| {
        tracing::info!(
            %method,
            path,
            status,
            ms = started.elapsed().as_millis() as u64,
            "request"
        );
    });
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert(REQUEST_ID, v);
    }
    // Bodies are read whole by the handlers after routing, so no separate body time is
    // measured; CouchDB reports 0 for a body read at once too.
    h.insert(BODY_TIME, HeaderValue::from_static("0"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("must-revalidate"));
    h.insert(SERVER, HeaderValue::from_static(SERVER_HEADER));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_id(v: &str) -> Request {
        let mut r = Request::new(axum::body::Body::empty());
        if let Ok(v) = HeaderValue::from_str(v) {
            r.headers_mut().insert(REQUEST_ID, v);
        }
        r
    }

    #[test]
    fn a_plain_caller_id_is_kept_and_an_odd_one_replaced() {
        assert_eq!(
            caller_id(&with_id("abc-123_X")).as_deref(),
            Some("abc-123_X")
        );
        assert_eq!(caller_id(&with_id("has space")), None);
        assert_eq!(caller_id(&with_id("")), None);
        assert_eq!(caller_id(&with_id(&"a".repeat(65))), None);
    }

    #[test]
    fn new_ids_have_couchdbs_shape() {
        let (a, b) = (new_id(), new_id());
        assert_eq!(a.len(), 10);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
