//! The errors couch_jobs returns to callers (CouchDB's couch_jobs.erl error returns), as one `thiserror` enum.
//!
//! `JobsError` implements [`RetryableError`] so job operations can run inside
//! [`Db::run`](crate::store::Db::run) and have store conflicts retried transparently.

use crate::store::{RetryableError, StoreError};

/// What a couch_jobs call can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobsError {
    /// The job (or type) does not exist, or `accept` found nothing before its timeout.
    #[error("job not found")]
    NotFound,
    /// The caller's job lock is no longer valid: the job was removed, re-enqueued by the
    /// activity monitor, or accepted by another worker. The worker must stop.
    #[error("job lock lost (halt)")]
    Halt,
    /// Jobs of a type can only be added after `set_type_timeout` for that type.
    #[error("no activity timeout set for this job type")]
    NoTypeTimeout,
    /// `accept` in `no_schedule` mode needs `max_sched_time` 0.
    #[error("no_schedule accept requires max_sched_time 0")]
    NoScheduleRequiresZeroMaxSchedTime,
    /// Stored bytes under the job keys could not be decoded (corrupt or foreign data), or
    /// job data could not be encoded.
    #[error("job encoding error: {0}")]
    Encoding(String),
    /// The background notifier for the type is not running (node shutting down).
    #[error("job notifier unavailable: {0}")]
    Unavailable(String),
    /// The transactional store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RetryableError for JobsError {
    fn is_retryable(&self) -> bool {
        matches!(self, JobsError::Store(e) if e.is_retryable())
    }
}

/// couch_jobs' own notion of retryable for its background loops (CouchDB's
/// `COUCH_JOBS_RETRYABLE` in apache/couchdb `src/couch_jobs/src/couch_jobs.hrl`): every
/// retryable store error plus a transaction timeout (FDB 1031), after which the activity
/// monitor and the notifier try again later, with a smaller batch, instead of crashing.
pub(crate) fn background_retryable(e: &StoreError) -> bool {
    e.is_retryable() || matches!(e, StoreError::TimedOut)
}

/// Result alias for couch_jobs calls.
pub type JobsResult<T> = Result<T, JobsError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_loops_also_retry_timeouts() {
        assert!(background_retryable(&StoreError::TimedOut));
        assert!(background_retryable(&StoreError::CommitUnknown));
        assert!(!background_retryable(&StoreError::Closed));
        assert!(!JobsError::Store(StoreError::TimedOut).is_retryable());
    }
}
