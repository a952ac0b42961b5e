//! `jobs_sup` (CouchDB's couch_jobs_sup.erl): the supervisor of this node's couch_jobs processes.
//!
//! CouchDB's `couch_jobs_sup` is `rest_for_one` (intensity 3 / 10 s) over the monitor and
//! notifier supervisors and `couch_jobs_server`. Here the per-type monitors and notifiers are
//! linked children of the type server (it starts and stops them as types come and go), so a
//! restart of the type server restarts every pair started after it: the same effect. The
//! supervisor itself is a [`supervisors::Supervisor`]; past 3 restarts in 10 s it fails.
//! It takes no messages of its own; [`Background`] is its handle, and hands the crate's tests
//! the type server, monitors and notifiers so they can be observed (`supervisors::observe`).

use std::time::Duration;

use ractor::Actor;
use supervisors::SupervisorRef;
use supervisors::{ChildContext, ChildSpec, Shutdown, Strategy, Supervisor};

use super::Jobs;
use super::error::{JobsError, JobsResult};
use super::type_server::TypeServer;
// What the tests' handles into the tree name.
#[cfg(any(test, feature = "internals"))]
use {
    super::activity_monitor::MonitorMsg,
    super::notifier::NotifierMsg,
    super::type_server::{Registry, TypeServerMsg},
    ractor::ActorRef,
    std::sync::Arc,
};

/// Restart intensity: at most this many restarts ...
pub const MAX_RESTARTS: u32 = 3;
/// ... within this period.
pub const MAX_SECONDS: Duration = Duration::from_secs(10);

/// A running `jobs_sup`.
pub struct Background {
    sup: SupervisorRef,
    /// The type server's registry, for the tests that reach its actors.
    #[cfg(any(test, feature = "internals"))]
    registry: Arc<Registry>,
}

impl std::fmt::Debug for Background {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Background")
            .field("sup", &self.sup.actor().get_id())
            .finish()
    }
}

pub(crate) async fn start(jobs: Jobs) -> JobsResult<Background> {
    #[cfg(any(test, feature = "internals"))]
    let registry = jobs.registry().clone();
    let type_server = ChildSpec::new("type_server", move |ctx: ChildContext| {
        let jobs = jobs.clone();
        async move {
            let (server, _) = Actor::spawn_linked(None, TypeServer, jobs, ctx.supervisor).await?;
            Ok(server.get_cell())
        }
    })
    // Its monitors and notifiers stop with it; give them time to finish a round.
    .shutdown(Shutdown::Timeout(Duration::from_secs(10)));
    let sup = Supervisor::new(Strategy::RestForOne)
        .intensity(MAX_RESTARTS, MAX_SECONDS)
        .child(type_server)
        .start()
        .await
        .map_err(|e| JobsError::Unavailable(e.to_string()))?;
    Ok(Background {
        sup,
        #[cfg(any(test, feature = "internals"))]
        registry,
    })
}

impl Background {
    /// Stops every background process in reverse start order and waits for them.
    pub async fn stop(self) {
        self.sup.stop().await;
    }

    /// Kills the tree without any cleanup (a node dying), and waits until it is gone.
    pub async fn kill(self) {
        self.sup.actor().kill();
        self.sup.wait().await;
    }
}

/// Handles into the tree, for the crate's tests.
#[cfg(any(test, feature = "internals"))]
impl Background {
    /// The running type server (`None` while it restarts).
    pub fn type_server(&self) -> Option<ActorRef<TypeServerMsg>> {
        self.registry.server()
    }

    /// The running notifier of `ty` (`None` before the type server has found the type).
    pub fn notifier(&self, ty: &str) -> Option<ActorRef<NotifierMsg>> {
        self.registry.running_notifier(ty)
    }

    /// The running activity monitor of `ty`.
    pub fn monitor(&self, ty: &str) -> Option<ActorRef<MonitorMsg>> {
        self.registry.monitor(ty)
    }
}
