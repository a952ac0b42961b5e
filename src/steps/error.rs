//! The errors of the steps job type: invalid job specifications ([`SpecError`]) and failures
//! of the steps API and workers ([`StepsError`]).

use crate::jobs::JobsError;
use crate::store::{RetryableError, StoreError};

/// Why a submitted job specification was rejected. Every variant names the offending step
/// (0-based) where there is one, so an HTTP layer can return it as a 400 message as is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The job has no steps.
    #[error("a job needs at least one step")]
    NoSteps,
    /// The job has more steps than allowed.
    #[error("a job has at most {max} steps, got {got}")]
    TooManySteps {
        /// The most steps a job may have.
        max: usize,
        /// How many steps the job has.
        got: usize,
    },
    /// A step's target is neither `any` nor a valid node name.
    #[error("step {step}: bad target {target:?}: {reason}")]
    BadTarget {
        /// The step's index.
        step: usize,
        /// The target as given.
        target: String,
        /// Which naming rule it breaks.
        reason: &'static str,
    },
    /// The node name given to `Steps::new` breaks the naming rules.
    #[error("bad node name {name:?}: {reason}")]
    BadNodeName {
        /// The name as given.
        name: String,
        /// Which naming rule it breaks.
        reason: &'static str,
    },
    /// A step's command is blank.
    #[error("step {step}: the command is empty")]
    EmptyCommand {
        /// The step's index.
        step: usize,
    },
    /// A step's alternative command is given but blank.
    #[error("step {step}: the alternative command is empty (omit it or give one)")]
    EmptyAltCommand {
        /// The step's index.
        step: usize,
    },
    /// A step's command or alternative command is too long.
    #[error("step {step}: command longer than {max} bytes")]
    CommandTooLong {
        /// The step's index.
        step: usize,
        /// The longest command accepted, in bytes.
        max: usize,
    },
    /// A step's retry strategy has an out-of-range value.
    #[error("step {step}: retry strategy: {field} {reason}")]
    BadRetry {
        /// The step's index.
        step: usize,
        /// The retry field at fault (`max_retries`, `sleep`, ...).
        field: &'static str,
        /// What the value must be.
        reason: &'static str,
    },
    /// A stored job document does not decode (bad JSON or an out-of-range step index).
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
    Corrupt {
        /// The job's id.
        id: String,
        /// What failed to decode.
        reason: String,
    },
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
