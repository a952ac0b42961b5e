//! The replication error type and its classification (CouchDB's replicator error outcomes, docs/architecture.md#errors): which failures are worth
//! retrying with backoff (transient) and which will never succeed unchanged (permanent).
//! Messages never contain credentials: every URL in them is rendered through
//! [`crate::replication::endpoint::database::Endpoint`]'s redacting display.

/// Whether retrying the replication later can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry with backoff (a persistent job goes `crashing`): endpoint down, 5xx exhaustion,
    /// missing database, auth failures (credentials may be fixed), `max_backoff`.
    Transient,
    /// The request itself is wrong (bad options, bad URL): the job goes `failed`.
    Permanent,
}

/// Everything a replication can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// The replication document / request body is invalid.
    #[error("invalid replication options: {0}")]
    InvalidOptions(String),
    /// An endpoint URL could not be used.
    #[error("invalid endpoint: {0}")]
    InvalidEndpoint(String),
    /// `GET db` did not answer 200 with the expected fields.
    #[error("db_not_found: could not open {0}")]
    DbNotFound(String),
    /// The endpoint answered 401.
    #[error("unauthorized: unauthorized to access or create database {0}")]
    Unauthorized(String),
    /// The endpoint's server refused the credentials at `_session` and then answered 401.
    #[error("replication_auth_error: {0}")]
    AuthFailed(String),
    /// The endpoint answered 403.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The 429 back-off interval reached its maximum.
    #[error("max_backoff: {0} keeps answering 429 Too Many Requests")]
    MaxBackoff(String),
    /// A request failed after all retries (connection errors, timeouts, 5xx, 408).
    #[error("http_request_failed: {0}")]
    HttpRequestFailed(String),
    /// The changes feed could not be read.
    #[error("changes_req_failed: {0}")]
    ChangesReqFailed(String),
    /// `_bulk_docs` answered with an unexpected status.
    #[error("bulk_docs_failed: {0}")]
    BulkDocsFailed(String),
    /// A single-document write failed in a way that is not a per-document rejection.
    #[error("doc_write_failed: {0}")]
    DocWriteFailed(String),
    /// Fetching document revisions failed.
    #[error("open_doc_revs_failed: {0}")]
    OpenDocRevsFailed(String),
    /// Writing or verifying a checkpoint failed.
    #[error("checkpoint_commit_failure: {0}")]
    CheckpointFailed(String),
    /// The filter function could not be fetched from the source.
    #[error("filter_fetch_error: {0}")]
    FilterFetch(String),
    /// An endpoint answered something that does not follow the protocol.
    #[error("bad_response: {0}")]
    BadResponse(String),
    /// An internal task of the pipeline died.
    #[error("worker_died: {0}")]
    WorkerDied(String),
    /// An endpoint answered with more than the node holds for one response
    /// (`[replicator] max_response_bytes`, `max_feed_line_bytes`).
    #[error("endpoint_response_too_large: {0}")]
    EndpointResponseTooLarge(String),
    /// An endpoint sent a body slower than `[replicator] min_bytes_per_sec` once
    /// `connection_timeout` had passed.
    #[error("endpoint_response_too_slow: {0}")]
    EndpointResponseTooSlow(String),
}

impl ReplicationError {
    /// The class of this error (transient or permanent).
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidOptions(_) | Self::InvalidEndpoint(_) => ErrorClass::Permanent,
            _ => ErrorClass::Transient,
        }
    }

    /// True when retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// The error that ends a changes reader after its retries: `changes_req_failed` with the
    /// last failure's text, without repeating the tag when that failure already was one.
    pub(crate) fn into_changes_failure(self) -> Self {
        match self {
            e @ (Self::ChangesReqFailed(_)
            | Self::EndpointResponseTooLarge(_)
            | Self::EndpointResponseTooSlow(_)) => e,
            other => Self::ChangesReqFailed(other.to_string()),
        }
    }

    /// The error with `place` (an endpoint, a request) named in front of its reason, for the
    /// errors about what an endpoint sent, when the reason does not name it already.
    pub(crate) fn at(self, place: &str) -> Self {
        let name = |m: String| {
            if m.contains(place) {
                m
            } else {
                format!("{place}: {m}")
            }
        };
        match self {
            Self::BadResponse(m) => Self::BadResponse(name(m)),
            Self::EndpointResponseTooLarge(m) => Self::EndpointResponseTooLarge(name(m)),
            Self::EndpointResponseTooSlow(m) => Self::EndpointResponseTooSlow(name(m)),
            other => other,
        }
    }

    /// Whether a changes feed ends at once rather than reconnecting: the endpoint would only
    /// answer the same (429 exhaustion, a missing database, a response past the caps).
    pub(crate) fn ends_feed(&self) -> bool {
        matches!(
            self,
            Self::MaxBackoff(_)
                | Self::DbNotFound(_)
                | Self::EndpointResponseTooLarge(_)
                | Self::EndpointResponseTooSlow(_)
        )
    }

    /// Whether the replication could not get going (endpoints unusable, options or filter
    /// invalid) rather than failing while running: counted as a failed start.
    pub(crate) fn is_start_failure(&self) -> bool {
        matches!(
            self,
            Self::InvalidOptions(_)
                | Self::InvalidEndpoint(_)
                | Self::DbNotFound(_)
                | Self::Unauthorized(_)
                | Self::AuthFailed(_)
                | Self::Forbidden(_)
                | Self::FilterFetch(_)
        )
    }

    /// CouchDB's short reason tag (`db_not_found`, `unauthorized`, `max_backoff`, ...).
    pub fn tag(&self) -> ReasonTag {
        match self {
            Self::InvalidOptions(_) => ReasonTag::InvalidOptions,
            Self::InvalidEndpoint(_) => ReasonTag::InvalidEndpoint,
            Self::DbNotFound(_) => ReasonTag::DbNotFound,
            Self::Unauthorized(_) => ReasonTag::Unauthorized,
            Self::AuthFailed(_) => ReasonTag::ReplicationAuthError,
            Self::Forbidden(_) => ReasonTag::Forbidden,
            Self::MaxBackoff(_) => ReasonTag::MaxBackoff,
            Self::HttpRequestFailed(_) => ReasonTag::HttpRequestFailed,
            Self::ChangesReqFailed(_) => ReasonTag::ChangesReqFailed,
            Self::BulkDocsFailed(_) => ReasonTag::BulkDocsFailed,
            Self::DocWriteFailed(_) => ReasonTag::DocWriteFailed,
            Self::OpenDocRevsFailed(_) => ReasonTag::OpenDocRevsFailed,
            Self::CheckpointFailed(_) => ReasonTag::CheckpointCommitFailure,
            Self::FilterFetch(_) => ReasonTag::FilterFetchError,
            Self::BadResponse(_) => ReasonTag::BadResponse,
            Self::WorkerDied(_) => ReasonTag::WorkerDied,
            Self::EndpointResponseTooLarge(_) => ReasonTag::EndpointResponseTooLarge,
            Self::EndpointResponseTooSlow(_) => ReasonTag::EndpointResponseTooSlow,
        }
    }

    /// [`Self::tag`] as text.
    pub fn reason(&self) -> &'static str {
        self.tag().as_str()
    }
}

/// CouchDB's reason tags of a failed replication (the `error` of an HTTP reply, the prefix
/// of the reason text); stored in job records by their text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonTag {
    /// `invalid_options`.
    InvalidOptions,
    /// `invalid_endpoint`.
    InvalidEndpoint,
    /// `db_not_found`.
    DbNotFound,
    /// `unauthorized`.
    Unauthorized,
    /// `replication_auth_error`.
    ReplicationAuthError,
    /// `forbidden`.
    Forbidden,
    /// `max_backoff`.
    MaxBackoff,
    /// `http_request_failed`.
    HttpRequestFailed,
    /// `changes_req_failed`.
    ChangesReqFailed,
    /// `bulk_docs_failed`.
    BulkDocsFailed,
    /// `doc_write_failed`.
    DocWriteFailed,
    /// `open_doc_revs_failed`.
    OpenDocRevsFailed,
    /// `checkpoint_commit_failure`.
    CheckpointCommitFailure,
    /// `filter_fetch_error`.
    FilterFetchError,
    /// `bad_response`.
    BadResponse,
    /// `worker_died`.
    WorkerDied,
    /// `endpoint_response_too_large`.
    EndpointResponseTooLarge,
    /// `endpoint_response_too_slow`.
    EndpointResponseTooSlow,
}

impl ReasonTag {
    /// The tag as CouchDB writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidOptions => "invalid_options",
            Self::InvalidEndpoint => "invalid_endpoint",
            Self::DbNotFound => "db_not_found",
            Self::Unauthorized => "unauthorized",
            Self::ReplicationAuthError => "replication_auth_error",
            Self::Forbidden => "forbidden",
            Self::MaxBackoff => "max_backoff",
            Self::HttpRequestFailed => "http_request_failed",
            Self::ChangesReqFailed => "changes_req_failed",
            Self::BulkDocsFailed => "bulk_docs_failed",
            Self::DocWriteFailed => "doc_write_failed",
            Self::OpenDocRevsFailed => "open_doc_revs_failed",
            Self::CheckpointCommitFailure => "checkpoint_commit_failure",
            Self::FilterFetchError => "filter_fetch_error",
            Self::BadResponse => "bad_response",
            Self::WorkerDied => "worker_died",
            Self::EndpointResponseTooLarge => "endpoint_response_too_large",
            Self::EndpointResponseTooSlow => "endpoint_response_too_slow",
        }
    }
}

impl std::fmt::Display for ReasonTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Result alias of this module.
pub type Result<T, E = ReplicationError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changes_failure_is_tagged_once() {
        let inner = ReplicationError::ChangesReqFailed("404".into());
        assert_eq!(
            inner.into_changes_failure().to_string(),
            "changes_req_failed: 404"
        );
        let other = ReplicationError::DbNotFound("x".into()).into_changes_failure();
        assert_eq!(other.reason(), "changes_req_failed");
    }

    #[test]
    fn tags_serialize_as_couchdb_writes_them() {
        for tag in [
            ReasonTag::ReplicationAuthError,
            ReasonTag::CheckpointCommitFailure,
        ] {
            let text = serde_json::to_value(tag).unwrap();
            assert_eq!(text, serde_json::json!(tag.as_str()));
            assert_eq!(serde_json::from_value::<ReasonTag>(text).unwrap(), tag);
        }
    }

    #[test]
    fn classes_follow_d7() {
        assert_eq!(
            ReplicationError::InvalidOptions("x".into()).class(),
            ErrorClass::Permanent
        );
        assert_eq!(
            ReplicationError::DbNotFound("x".into()).class(),
            ErrorClass::Transient
        );
        assert!(ReplicationError::MaxBackoff("x".into()).is_transient());
        assert_eq!(
            ReplicationError::Unauthorized("x".into()).reason(),
            "unauthorized"
        );
    }
}
