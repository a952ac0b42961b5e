//! Stopping one child the OTP way: ask it to stop, wait up to its shutdown timeout, then kill.
//!
//! ractor's `post_stop` does not receive the stop reason, so a server cannot tell on its own
//! whether it was stopped by its supervisor (OTP reason `shutdown`) or by anyone else
//! (`normal`). The supervisor therefore marks the child's id here before stopping it, and the
//! server's `post_stop` takes the mark ([`take_mark`]).

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use ractor::{ActorCell, ActorId};

/// The stop reason a supervisor sends to a child it shuts down.
pub(crate) const SHUTDOWN_REASON: &str = "shutdown";

/// How a supervisor stops a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Kill at once: the child's `terminate` does not run (OTP `brutal_kill`).
    Brutal,
    /// Stop gracefully, and kill if it has not exited after this long.
    Timeout(Duration),
    /// Stop gracefully and wait as long as it takes (OTP `infinity`; the default for
    /// supervisors as children, which need the time to stop their own children).
    Infinity,
}

impl Default for Shutdown {
    /// Five seconds, OTP's default for workers.
    fn default() -> Self {
        Shutdown::Timeout(Duration::from_secs(5))
    }
}

static MARKS: LazyLock<Mutex<HashSet<ActorId>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

fn marks() -> std::sync::MutexGuard<'static, HashSet<ActorId>> {
    // Inserts and removes are single operations, so a poisoned set is still consistent.
    MARKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// True (once) if the actor is being shut down by its supervisor.
pub(crate) fn take_mark(id: ActorId) -> bool {
    marks().remove(&id)
}

/// Whether the child exited on its own in time or had to be killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    Gracefully,
    Killed,
}

/// Stop `child` per `how` and wait until it has fully exited.
pub(crate) async fn shutdown_child(child: &ActorCell, id: &str, how: Shutdown) -> Stopped {
    let actor = child.get_id();
    let outcome = match how {
        Shutdown::Brutal => {
            child.kill();
            let _ = child.wait(None).await;
            Stopped::Killed
        }
        Shutdown::Infinity => {
            marks().insert(actor);
            child.stop(Some(SHUTDOWN_REASON.to_string()));
            let _ = child.wait(None).await;
            Stopped::Gracefully
        }
        Shutdown::Timeout(limit) => {
            marks().insert(actor);
            child.stop(Some(SHUTDOWN_REASON.to_string()));
            match child.wait(Some(limit)).await {
                Ok(()) => Stopped::Gracefully,
                Err(_) => {
                    tracing::warn!(child = id, ?limit, "child ignored shutdown; killing it");
                    child.kill();
                    let _ = child.wait(None).await;
                    Stopped::Killed
                }
            }
        }
    };
    // The child may not be a server (or was killed before post_stop): drop any leftover mark.
    marks().remove(&actor);
    tracing::debug!(child = id, ?outcome, "child stopped");
    outcome
}
