//! The errors the replicator handle and its actors return to callers.

use super::job::id::{JobId, JobRef};
use super::job::record::{JobError, RepState};
use super::node::settings::SettingsError;
use super::server_job::spec::ServerJobId;
use crate::jobs::JobsError;
use crate::replication::ReplicationError;

/// What a [`crate::replicator::Replicator`] call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ReplicatorError {
    /// The replication document or `_replicate` body is invalid (a 400 for HTTP callers).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The replication engine refused the request (invalid options or endpoint: a 400 for
    /// HTTP callers, with the engine's error kept as the source).
    #[error("bad request: {0}")]
    Replication(#[source] ReplicationError),
    /// No job with that job id or replication id.
    #[error("not_found: no replication job {0}")]
    NotFound(JobRef),
    /// No server job with that id.
    #[error("not_found: no server job {0}")]
    ServerJobNotFound(ServerJobId),
    /// A persistent job already owns this id (`POST /_replicate` for a persistent job id).
    #[error("conflict: {0}")]
    Conflict(String),
    /// `_pause` or `_resume` on a job in a state it does not apply to (a 409 for HTTP
    /// callers).
    #[error("conflict: replication job {job} is {}; {wanted}", state.as_str())]
    NotPausable {
        /// The job.
        job: JobId,
        /// Its state.
        state: RepState,
        /// What the operation needs.
        wanted: &'static str,
    },
    /// The job ended in `failed` (one-shot waits) with this error.
    #[error("replication failed: {0}")]
    Failed(#[source] JobError),
    /// A wait ran out of time.
    #[error("timeout waiting for replication job {0}")]
    Timeout(JobRef),
    /// The settings are invalid.
    #[error("invalid replicator settings: {0}")]
    Config(#[source] SettingsError),
    /// An actor of the tree is not running (node starting or shutting down).
    #[error("replicator unavailable: {0}")]
    Unavailable(String),
    /// couch_jobs failed.
    #[error(transparent)]
    Jobs(#[from] JobsError),
    /// The store cannot be joined (a newer format).
    #[error(transparent)]
    Agreement(#[from] crate::replicator::cluster::agreement::AgreementError),
}

impl From<ReplicationError> for ReplicatorError {
    fn from(e: ReplicationError) -> Self {
        ReplicatorError::Replication(e)
    }
}

impl ReplicatorError {
    /// The reason of a refused request (what a `_replicator` document's `failed` state
    /// carries), or `None` for any other error.
    pub(crate) fn bad_request_reason(&self) -> Option<String> {
        match self {
            Self::BadRequest(reason) => Some(reason.clone()),
            Self::Replication(e) => Some(e.to_string()),
            _ => None,
        }
    }
}

impl From<crate::store::StoreError> for ReplicatorError {
    fn from(e: crate::store::StoreError) -> Self {
        ReplicatorError::Jobs(JobsError::Store(e))
    }
}

/// Result alias of the replicator.
pub type ReplicatorResult<T> = Result<T, ReplicatorError>;
