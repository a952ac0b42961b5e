//! The events a job subscription delivers: what the notifier sends and a [`Subscription`]
//! receives. Kept apart from both so the notifier (the sender) and the subscription (the
//! receiver) depend on these types, not on each other.
//!
//! [`Subscription`]: super::Subscription

use super::job_data::{JobData, JobState};

/// The state a subscriber is told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventState {
    Pending,
    Running,
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
    pub job_type: String,
    pub id: String,
    pub state: EventState,
    /// The job's data; `None` for `NotFound`.
    pub data: Option<JobData>,
}
