//! The HTTP API's error type: every failure becomes a CouchDB-style `{"error", "reason"}` body
//! with the status CouchDB uses. Reasons come from typed errors that already redact
//! credentials, so nothing secret reaches a client.

use axum::Json;
use axum::http::StatusCode;
use axum::http::header::WWW_AUTHENTICATE;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::replicator::replicator_db::request::InvalidRepDoc;

/// An error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// HTTP status.
    pub status: StatusCode,
    /// CouchDB's short error tag (`bad_request`, `not_found`, ...).
    pub error: String,
    /// Human-readable reason.
    pub reason: String,
    /// Send `WWW-Authenticate: Basic` with a 401 (routes meant for command-line clients).
    pub basic_challenge: bool,
}

impl HttpError {
    /// A reply with this status, tag and reason.
    pub fn new(status: StatusCode, error: &str, reason: impl Into<String>) -> Self {
        Self {
            status,
            error: error.to_owned(),
            reason: reason.into(),
            basic_challenge: false,
        }
    }

    /// The same error; a 401 also asks for Basic credentials (`WWW-Authenticate`).
    pub(crate) fn with_basic_challenge(mut self) -> Self {
        self.basic_challenge = self.status == StatusCode::UNAUTHORIZED;
        self
    }

    /// 400: the request is malformed.
    pub fn bad_request(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", reason)
    }

    /// 401: no or wrong credentials.
    pub fn unauthorized(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", reason)
    }

    /// 403: authenticated, but not allowed.
    pub fn forbidden(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", reason)
    }

    /// 404.
    pub fn not_found(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", reason)
    }

    /// 413: the body is larger than the configured limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request entity is larger than {limit} bytes"),
        )
    }

    /// 500 with a reason.
    pub fn internal(reason: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_server_error",
            reason,
        )
    }

    /// 503: the replicator is not available (starting, stopping, not an api_frontend).
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            reason,
        )
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": self.error, "reason": self.reason}));
        if self.basic_challenge {
            let challenge = [(WWW_AUTHENTICATE, "Basic realm=\"server\"")];
            return (self.status, challenge, body).into_response();
        }
        (self.status, body).into_response()
    }
}

impl From<InvalidRepDoc> for HttpError {
    fn from(e: InvalidRepDoc) -> Self {
        Self::bad_request(e.0)
    }
}

impl From<&crate::replicator::JobError> for HttpError {
    /// The reply for a failed job, by the kind of its error: CouchDB answers a replication
    /// that failed with 500 and the error's tag; duplicates are a conflict the caller can act
    /// on; an invalid request is the caller's fault.
    fn from(e: &crate::replicator::JobError) -> Self {
        use crate::replication::error::ReasonTag;
        use crate::replicator::JobError as J;
        match e {
            J::InvalidDocument { reason } => Self::bad_request(reason.clone()),
            J::DuplicateJob { .. } | J::DuplicateDocument { .. } => {
                Self::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
            // An endpoint that refused the replicator's credentials: CouchDB passes the class
            // on (401 `unauthorized`, 403 `forbidden`), so a client can tell it from a crash.
            J::Replication {
                tag: ReasonTag::Unauthorized,
                ..
            } => Self::unauthorized(e.detail()),
            J::Replication {
                tag: ReasonTag::Forbidden,
                ..
            } => Self::forbidden(e.detail()),
            J::Replication { .. } | J::Internal { .. } => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, e.tag(), e.detail())
            }
        }
    }
}

/// Result alias of the handlers.
pub(crate) type HttpResult<T> = Result<T, HttpError>;

impl From<crate::replicator::ReplicatorError> for HttpError {
    fn from(e: crate::replicator::ReplicatorError) -> Self {
        use crate::replicator::ReplicatorError as E;
        match e {
            E::BadRequest(r) => Self::bad_request(r),
            E::Replication(e) => Self::bad_request(e.to_string()),
            E::NotFound(id) => Self::not_found(format!("no replication job {id}")),
            E::ServerJobNotFound(id) => Self::not_found(format!("no server job {id}")),
            E::Conflict(r) => Self::new(StatusCode::CONFLICT, "conflict", r),
            E::NotPausable { job, state, wanted } => Self::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("replication job {job} is {}; {wanted}", state.as_str()),
            ),
            E::Failed(e) => Self::from(&e),
            E::Timeout(id) => Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                format!("replication job {id} did not reach the expected state in time"),
            ),
            E::Unavailable(r) => Self::unavailable(r),
            other => Self::internal(other.to_string()),
        }
    }
}
