//! `jobs_sup` (digest A.1): the supervisor of this node's couch_jobs processes.
//!
//! CouchDB's `couch_jobs_sup` is `rest_for_one` (intensity 3 / 10 s) over the monitor and
//! notifier supervisors and `couch_jobs_server`. Here the per-type monitors and notifiers are
//! linked children of the type server, so restarting the server restarts every pair started
//! after it — the same effect. Built on plain ractor actors: a failed type server is
//! restarted until it fails more than 3 times within 10 s, then `jobs_sup` itself fails.

use std::collections::VecDeque;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Jobs;
use super::error::{JobsError, JobsResult};
use super::type_server::{TypeServer, TypeServerMsg};

/// Restart intensity: at most this many restarts ...
pub const MAX_RESTARTS: usize = 3;
/// ... within this period.
pub const MAX_SECONDS: Duration = Duration::from_secs(10);

/// Messages of `jobs_sup`.
pub enum JobsSupMsg {
    /// How many times the type server was restarted.
    Restarts(ractor::RpcReplyPort<usize>),
}

pub struct JobsSup;

pub struct JobsSupState {
    jobs: Jobs,
    server: ActorRef<TypeServerMsg>,
    recent: VecDeque<Instant>,
    restarts: usize,
}

impl Actor for JobsSup {
    type Msg = JobsSupMsg;
    type State = JobsSupState;
    type Arguments = Jobs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        jobs: Jobs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let (server, _) =
            Actor::spawn_linked(None, TypeServer, jobs.clone(), myself.get_cell()).await?;
        Ok(JobsSupState {
            jobs,
            server,
            recent: VecDeque::new(),
            restarts: 0,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state
            .server
            .stop_and_wait(None, Some(Duration::from_secs(10)))
            .await;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            JobsSupMsg::Restarts(reply) => {
                let _ = reply.send(state.restarts);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let who = match &event {
            SupervisionEvent::ActorTerminated(who, _, _)
            | SupervisionEvent::ActorFailed(who, _) => who.get_id(),
            _ => return Ok(()),
        };
        if who != state.server.get_id() {
            return Ok(());
        }
        let now = Instant::now();
        state.recent.push_back(now);
        while state
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > MAX_SECONDS)
        {
            state.recent.pop_front();
        }
        if state.recent.len() > MAX_RESTARTS {
            return Err(format!("couch_jobs type server restarted too often: {event}").into());
        }
        tracing::warn!(%event, "restarting couch_jobs type server");
        let (server, _) =
            Actor::spawn_linked(None, TypeServer, state.jobs.clone(), myself.get_cell()).await?;
        state.server = server;
        state.restarts += 1;
        Ok(())
    }
}

/// A running `jobs_sup`.
pub struct Background {
    sup: ActorRef<JobsSupMsg>,
    handle: JoinHandle<()>,
}

impl std::fmt::Debug for Background {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Background")
            .field("sup", &self.sup.get_id())
            .finish()
    }
}

pub(crate) async fn start(jobs: Jobs) -> JobsResult<Background> {
    let (sup, handle) = Actor::spawn(None, JobsSup, jobs)
        .await
        .map_err(|e| JobsError::Unavailable(e.to_string()))?;
    Ok(Background { sup, handle })
}

impl Background {
    /// Stops every background process in order and waits for them.
    pub async fn stop(self) {
        self.sup.stop(None);
        let _ = self.handle.await;
    }

    /// Kills the tree without any cleanup (a node dying), and waits until it is gone.
    pub async fn kill(self) {
        self.sup.kill();
        let _ = self.handle.await;
    }

    /// Whether `jobs_sup` is still running.
    pub fn is_running(&self) -> bool {
        self.sup.get_status() < ractor::ActorStatus::Stopping
    }

    /// How many times the type server was restarted.
    pub async fn restarts(&self) -> JobsResult<usize> {
        ractor::call!(self.sup, JobsSupMsg::Restarts)
            .map_err(|e| JobsError::Unavailable(e.to_string()))
    }

    /// The `jobs_sup` actor (for tests and hosts that link it into their own tree).
    pub fn actor(&self) -> &ActorRef<JobsSupMsg> {
        &self.sup
    }
}
