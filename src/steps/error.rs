//! The errors of the steps job type: invalid job specifications ([`SpecError`]) and failures
//! of the steps API and workers ([`StepsError`]).

use crate::jobs::JobsError;
use crate::store::{RetryableError, StoreError};

/// Why a submitted job specification was rejected. Every variant names the offending step
/// (0-based) where there is one, so an HTTP layer can return it as a 400 message as is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("a job needs at least one step")]
    NoSteps,
    #[error("a job has at most {max} steps, got {got}")]
    TooManySteps { max: usize, got: usize },
    #[error("step {step}: bad target {target:?}: {reason}")]
    BadTarget {
        step: usize,
        target: String,
        reason: &'static str,
    },
    #[error("bad node name {name:?}: {reason}")]
    BadNodeName { name: String, reason: &'static str },
    #[error("step {step}: the command is empty")]
    EmptyCommand { step: usize },
    #[error("step {step}: the alternative command is empty (omit it or give one)")]
    EmptyAltCommand { step: usize },
    #[error("step {step}: command longer than {max} bytes")]
    CommandTooLong { step: usize, max: usize },
    #[error("step {step}: retry strategy: {field} {reason}")]
    BadRetry {
        step: usize,
        field: &'static str,
        reason: &'static str,
    },
    #[error("job document is malformed: {0}")]
    Malformed(String),
}

/// What a steps API call or a worker can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StepsError {
    /// The job specification is invalid.
    #[error("invalid job: {0}")]
    Spec(#[from] SpecError),
    /// No job with this id.
    #[error("steps job not found: {0}")]
    NotFound(String),
    /// A stored job document could not be decoded (corrupt or foreign data).
    #[error("stored steps job {id} is corrupt: {reason}")]
    Corrupt { id: String, reason: String },
    /// The worker's couch_jobs lock was lost: another worker owns the step now.
    #[error("step lock lost (halt)")]
    Halt,
    /// The node's worker pool could not start.
    #[error("steps worker pool: {0}")]
    Pool(String),
    /// couch_jobs failed.
    #[error("jobs: {0}")]
    Jobs(JobsError),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}

impl From<JobsError> for StepsError {
    fn from(e: JobsError) -> Self {
        match e {
            JobsError::Halt => StepsError::Halt,
            JobsError::Store(s) => StepsError::Store(s),
            other => StepsError::Jobs(other),
        }
    }
}

impl From<StoreError> for StepsError {
    fn from(e: StoreError) -> Self {
        StepsError::Store(e)
    }
}

impl RetryableError for StepsError {
    fn is_retryable(&self) -> bool {
        matches!(self, StepsError::Store(e) if e.is_retryable())
    }
}

/// Result alias for steps calls.
pub type StepsResult<T> = Result<T, StepsError>;
