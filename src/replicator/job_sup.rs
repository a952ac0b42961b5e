//! job_sup: the dynamic supervisor of job actors (OTP `simple_one_for_one`, CouchDB's
//! `couch_replicator_scheduler_sup`). Children are temporary: a job actor that exits is never
//! restarted here — its own terminate hook resubmits the job, and the activity monitor
//! covers killed ones. Every exit is reported to the job server.
//!
//! Messages: [`JobSupMsg::StartJob`] (start one job actor for an accepted job),
//! [`JobSupMsg::Children`]. On shutdown it stops every job gracefully and in parallel (each
//! writes its final checkpoint and goes back to pending), killing any still running after
//! [`JOB_SHUTDOWN`].

use std::collections::HashMap;
use std::time::Duration;

use ractor::{ActorId, ActorRef, RpcReplyPort, SupervisionEvent};
use supervisors::{BoxError, ExitReason, Server};

use crate::jobs::{Job, JobData};

use super::context::{NodeCtx, ids};
use super::job::{JobActor, JobArgs, JobMsg};
use super::job_server::JobServerMsg;

/// How long a stopping job may take before it is killed (CouchDB: 5 s).
pub const JOB_SHUTDOWN: Duration = Duration::from_secs(5);

/// Messages of job_sup.
#[derive(Debug)]
pub enum JobSupMsg {
    /// Start a job actor for an accepted job.
    StartJob {
        /// The couch_jobs job (holds the lock).
        job: Job,
        /// Its data.
        data: JobData,
        /// The new actor.
        reply: RpcReplyPort<Result<ActorRef<JobMsg>, String>>,
    },
    /// The running job actors.
    Children(RpcReplyPort<Vec<ActorRef<JobMsg>>>),
}

/// The job supervisor.
#[derive(Debug, Clone)]
pub struct JobSup {
    /// The node.
    pub ctx: NodeCtx,
}

/// Running children.
#[derive(Default)]
pub struct JobSupState {
    children: HashMap<ActorId, ActorRef<JobMsg>>,
}

impl Server for JobSup {
    type Msg = JobSupMsg;
    type State = JobSupState;
    type Args = ();

    async fn init(&self, _: ActorRef<JobSupMsg>, _: ()) -> Result<JobSupState, BoxError> {
        Ok(JobSupState::default())
    }

    async fn handle(
        &self,
        myself: ActorRef<JobSupMsg>,
        msg: JobSupMsg,
        state: &mut JobSupState,
    ) -> Result<(), BoxError> {
        match msg {
            JobSupMsg::StartJob { job, data, reply } => {
                let args = JobArgs {
                    ctx: self.ctx.clone(),
                    job,
                    data,
                };
                let started =
                    supervisors::start_linked(None, JobActor, args, myself.get_cell()).await;
                let answer = match started {
                    Ok((actor, _)) => {
                        state.children.insert(actor.get_id(), actor.clone());
                        Ok(actor)
                    }
                    Err(e) => Err(e.to_string()),
                };
                let _ = reply.send(answer);
            }
            JobSupMsg::Children(reply) => {
                let _ = reply.send(state.children.values().cloned().collect());
            }
        }
        Ok(())
    }

    async fn handle_child_exit(
        &self,
        _: ActorRef<JobSupMsg>,
        event: SupervisionEvent,
        state: &mut JobSupState,
    ) -> Result<(), BoxError> {
        let gone = match &event {
            SupervisionEvent::ActorTerminated(cell, _, _) => Some(cell.get_id()),
            SupervisionEvent::ActorFailed(cell, err) => {
                tracing::debug!(job_actor = %cell.get_id(), error = %err, "job actor failed");
                Some(cell.get_id())
            }
            _ => None,
        };
        if let Some(id) = gone {
            state.children.remove(&id);
            let _ = self
                .ctx
                .child::<JobServerMsg>(ids::JOB_SERVER)
                .cast(JobServerMsg::WorkerExited(id));
        }
        Ok(())
    }

    async fn terminate(&self, _: ActorRef<JobSupMsg>, state: JobSupState, _: ExitReason) {
        let stops = state.children.into_values().map(|child| async move {
            child.stop(None);
            if child.wait(Some(JOB_SHUTDOWN)).await.is_err() {
                tracing::warn!(job_actor = %child.get_id(), "job did not stop in time; killing");
                child.kill();
            }
        });
        futures::future::join_all(stops).await;
    }
}
