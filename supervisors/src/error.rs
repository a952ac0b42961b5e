//! Error types returned by the supervisor and dynamic-supervisor APIs.

/// The boxed error type that server callbacks and child start functions return.
///
/// It is ractor's `ActorProcessingErr`, so any `std::error::Error + Send + Sync` (and
/// `String`/`&str` via `.into()`) can be returned with `?`.
pub type BoxError = ractor::ActorProcessingErr;

/// Errors from starting supervisors and from calls on them.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The supervisor actor itself could not be spawned; for a [`crate::Supervisor`] this
    /// includes a child whose start failed during the supervisor's start.
    #[error("supervisor failed to start: {0}")]
    Spawn(String),
    /// A child's start function failed.
    #[error("child {id} failed to start: {reason}")]
    ChildStart {
        /// The child id.
        id: String,
        /// Why it failed.
        reason: String,
    },
    /// A dynamic supervisor already runs `max_children` children.
    #[error("dynamic supervisor is full ({max} children)")]
    Full {
        /// The configured maximum.
        max: usize,
    },
    /// A child with this id is already running under the dynamic supervisor.
    #[error("child {0} already exists")]
    AlreadyExists(String),
    /// No child with this id.
    #[error("no child {0}")]
    NotFound(String),
    /// The supervisor did not answer (it is dead or stopping, or the call timed out).
    #[error("supervisor call failed: {0}")]
    Call(String),
}
