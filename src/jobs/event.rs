//! The events a job subscription delivers: what the notifier sends and a [`Subscription`]
//! receives. Kept apart from both so the notifier (the sender) and the subscription (the
//! receiver) depend on these types, not on each other.
//!
//! [`Subscription`]: super::Subscription

use super::job_data::{JobData, JobState};

/// The state a subscriber is told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventState {
    /// The job waits in the pending queue.
    Pending,
    /// A worker accepted the job and holds its lock.
    Running,
    /// The job's worker finished it.
    Finished,
    /// The job was removed.
    NotFound,
}

impl From<JobState> for EventState {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Pending => EventState::Pending,
            JobState::Running => EventState::Running,
            JobState::Finished => EventState::Finished,
        }
    }
}

/// One state change of a subscribed job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEvent {
    /// The job's type.
    pub job_type: String,
    /// The job's id.
    pub id: String,
    /// The state the job is in now.
    pub state: EventState,
    /// The job's data; `None` for `NotFound`.
    pub data: Option<JobData>,
}
