//! job_server: the acceptor model of CouchDB 4.x's `couch_replicator_job_server` (RFC 016).
//!
//! Keeps up to `max_acceptors` acceptor tasks waiting in `accept(max_sched_time = now)` while
//! acceptors + running jobs < `max_jobs`; an acceptor that gets a job asks `job_sup` to start
//! a job actor and reports [`JobServerMsg::Accepted`]. Every `interval` (+ up to a third of it
//! at random) a [`JobServerMsg::Tick`]: trim the longest-running continuous jobs older than
//! `min_run_time` back to `max_jobs` (never one-shot jobs), stop up to `max_churn` of them
//! when jobs are due and no slot is free, remove finished transient jobs older than
//! `transient_job_max_age`, refresh the gauges. The arithmetic is in `super::rotation_policy`.
//! A stopped job keeps its slot until its actor has exited, and the acceptors refilled then
//! start its successor (CouchDB 3.x stops before it starts), so a node never runs more than
//! `max_jobs` and a rotation takes one interval, as CouchDB 3.x's does.
//! The running jobs and when each rotates out and comes back are `running_jobs.rs`'s:
//! a trimmed job becomes eligible again shortly before its turn (one cycle per `max_churn`
//! waiting jobs, less a margin; see `super::rotation_policy::eligible_after`) and acceptors take
//! the earliest scheduled first, so jobs rotate in order and none starves (CouchDB 4.x
//! waits one interval).
//!
//! Fair share (`super::share`, `super::share_plan`): running jobs are charged to their
//! `_replicator` database (transient jobs to one group) every tick; every tick the slots
//! are split among the databases by their shares, and a trimmed job's rotation delay is
//! scaled by its database's planned factor (a database whose jobs each get less than the
//! average running fraction waits longer) times a feedback factor from its recent running
//! time against its planned part, averaged over about a rotation and left at 1 within a
//! dead band (`super::share::smooth_ratio`, `super::share::delay_factor`). Trimming
//! stops the longest-running jobs, those of a database measured far over its part first.
//!
//! Several nodes (`balance`, and `cluster_part.rs` here): every tick, and when a job is
//! enqueued while this node is held below `max_jobs` (`Rebalance`, from a task watching the
//! queue), the node reads its part of the cluster's jobs. It keeps acceptors only up to that
//! part (a surplus acceptor retires after its current wait), hands the jobs over it back to
//! the queue once a second read confirms it (`HAND_BACK_AFTER`), reports its load row at
//! every job start and end, and stops no jobs for the rotation unless every member is full.
//! While the picture shows jobs due it keeps more acceptors (`HANDOVER_ACCEPTORS`) and, at
//! its part, reads again shortly (`RECHECK_AFTER`).
//!
//! The tick itself is `cycle.rs`'s.
//!
//! Other messages: `WorkerExited` (from job_sup), `Observe`.

use std::collections::HashMap;
use std::time::Duration;

use ractor::{ActorId, ActorRef, RpcReplyPort};
use supervisors::{BoxError, ExitReason, Observable, Server};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::job_acceptor::{Retirement, acceptor};
use super::job_sup::JobSupRef;
use super::rotation_policy::acceptors_to_add;
use super::running_jobs::{Rotation, Worker};
use super::share::{FairShare, ShareKey};
use crate::replicator::job::actor::JobMsg;
use crate::replicator::job::id::JobId;
use crate::replicator::node::child_id::ChildId;
use crate::replicator::node::context::NodeCtx;
use crate::replicator::node::settings::ReplicatorSettings;
use cluster_part::HANDOVER_ACCEPTORS;

mod cluster_part;
mod cycle;

/// The job server (acceptors and running jobs), a child of the tree.
pub(crate) const JOB_SERVER: ChildId<JobServerMsg> = ChildId::new("job_server");

/// Messages of the job server.
#[derive(Debug)]
pub enum JobServerMsg {
    /// Acceptor `acceptor` got a job and job_sup started `actor` for it.
    Accepted {
        /// The acceptor's number.
        acceptor: u64,
        /// The job actor.
        actor: ActorRef<JobMsg>,
        /// The couch_jobs id of its job.
        job_id: JobId,
        /// One-shot jobs are never trimmed.
        continuous: bool,
        /// Its fair-share group.
        group: ShareKey,
    },
    /// Acceptor `acceptor` ended without a job.
    AcceptorEnded(u64),
    /// A job actor exited.
    WorkerExited(ActorId),
    /// The periodic cycle.
    Tick,
    /// A job was enqueued: read this node's part again if it holds the node below
    /// `max_jobs`.
    Rebalance,
    /// The membership changed (a node joined, left or was removed): read this node's part
    /// again now, not at the next tick, so a stopped node's jobs (pending again) are taken
    /// at once and a node that joined gets its part within `min_run_time`.
    MembersChanged,
    /// The server's state.
    Observe(RpcReplyPort<JobServerObservation>),
    /// This node was removed from the cluster as dead: stop every running job now (a
    /// neighbour has re-enqueued them; each stop is fenced by its job lock).
    StopAll,
    /// The node is shutting down: take no more jobs. Every acceptor retires (one that takes
    /// a job meanwhile hands it straight back) and none is started again, so the jobs that
    /// job_sup's stop hands back go to other nodes, not to this node's own acceptors (which
    /// then died with it, holding them for the activity timeout: 85 s in the drill). The
    /// acceptor tasks are handed to the caller, to be awaited once job_sup has stopped:
    /// aborted with this server, one could die between taking a job and handing it back.
    StopAccepting(RpcReplyPort<Vec<JoinHandle<()>>>),
}

/// What [`JobServerMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobServerObservation {
    /// Acceptors waiting for a job.
    pub acceptors: usize,
    /// Running job actors, sorted by job id.
    pub jobs: Vec<RunningJobObservation>,
    /// Starts and trims in the current cycle.
    pub churn: usize,
    /// The `max_jobs` setting.
    pub max_jobs: usize,
    /// Jobs the fair-share tables remember (running, or waiting with a priority left).
    pub share_jobs: usize,
    /// The most jobs this node runs now: `max_jobs`, or less while its part of the
    /// cluster's jobs is smaller (`balance`).
    pub limit: usize,
    /// The most job actors this node ran at once since the server started, stopping ones
    /// included (at most `max_jobs`).
    pub peak: usize,
}

/// One running job as the job server sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunningJobObservation {
    /// The couch_jobs id.
    pub job_id: JobId,
    /// Continuous (only these are trimmed).
    pub continuous: bool,
    /// Time since its actor was accepted.
    pub running_for: Duration,
    /// Its fair-share group.
    pub group: ShareKey,
    /// Its fair-share priority (higher: stopped first, waits longer).
    pub priority: u64,
}

impl Observable for JobServerMsg {
    type Observation = JobServerObservation;
    fn observe(reply: RpcReplyPort<JobServerObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// The job server.
#[derive(Debug, Clone)]
pub struct JobServer {
    /// The node.
    pub ctx: NodeCtx,
    /// Where accepted jobs are started.
    pub job_sup: JobSupRef,
}

/// One acceptor task, and the flag that tells it to end: at once while it waits for a job,
/// after its transaction when it is taking one.
struct Acceptor {
    task: JoinHandle<()>,
    retire: tokio::sync::watch::Sender<Retirement>,
}

/// The job server's state.
pub struct JobServerState {
    acceptors: HashMap<u64, Acceptor>,
    /// Acceptors told to retire, still finishing their wait.
    retired: Vec<JoinHandle<()>>,
    /// The most jobs this node runs now (see [`JobServerObservation::limit`]).
    limit: usize,
    /// The replication members the last balance saw (this node included; 1 alone).
    members: usize,
    /// The task that sends `Rebalance` when a job is enqueued.
    queue_watch: Option<JoinHandle<()>>,
    next_acceptor: u64,
    /// The running jobs and the rotation's timing.
    rot: Rotation,
    churn: usize,
    timer: Option<JoinHandle<()>>,
    share: FairShare<JobId>,
    /// When finished transient jobs were last looked for.
    last_cleanup: Option<Instant>,
    /// Since when the balance has seen this node over its part (see [`HAND_BACK_AFTER`]).
    over_since: Option<Instant>,
    /// This server, for the balance's own re-check.
    me: ActorRef<JobServerMsg>,
    /// Told to take no more jobs ([`JobServerMsg::StopAccepting`]).
    stopping: bool,
    /// The pending `Rebalance` of [`JobServer::recheck_soon`].
    recheck: Option<JoinHandle<()>>,
    /// See [`JobServerObservation::peak`].
    peak: usize,
    /// The last balance saw jobs due (handed over by a node that stopped or died, or back
    /// from one over its part): more acceptors wait ([`HANDOVER_ACCEPTORS`]).
    handover: bool,
}

impl Drop for JobServerState {
    fn drop(&mut self) {
        let tasks = self.acceptors.values().map(|a| &a.task);
        for t in tasks
            .chain(&self.retired)
            .chain(&self.timer)
            .chain(&self.queue_watch)
            .chain(&self.recheck)
        {
            t.abort();
        }
    }
}

impl JobServer {
    fn spawn_acceptors(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState, n: usize) {
        if st.stopping {
            return;
        }
        for _ in 0..n {
            let id = st.next_acceptor;
            st.next_acceptor += 1;
            let (retire, retired) = tokio::sync::watch::channel(Retirement::Working);
            let task = tokio::spawn(acceptor(
                self.ctx.clone(),
                self.job_sup.clone(),
                myself.clone(),
                id,
                retired,
            ));
            st.acceptors.insert(id, Acceptor { task, retire });
        }
    }

    /// `max_acceptors`, or [`HANDOVER_ACCEPTORS`] while the last balance saw jobs due.
    fn acceptors_wanted(st: &JobServerState, s: &ReplicatorSettings) -> usize {
        if st.handover {
            s.max_acceptors.max(HANDOVER_ACCEPTORS)
        } else {
            s.max_acceptors
        }
    }

    fn refill(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState) {
        let s = self.ctx.settings();
        let n = acceptors_to_add(
            st.acceptors.len(),
            st.rot.workers.len(),
            st.limit,
            Self::acceptors_wanted(st, s),
        );
        self.spawn_acceptors(myself, st, n);
    }

    /// What `Observe` answers: the running jobs (sorted by id) and the counters.
    fn observation(&self, st: &JobServerState) -> JobServerObservation {
        let mut jobs: Vec<RunningJobObservation> = st
            .rot
            .workers
            .values()
            .map(|w| RunningJobObservation {
                job_id: w.job_id.clone(),
                continuous: w.continuous,
                running_for: w.started.elapsed(),
                group: w.group.clone(),
                priority: st.share.priority(&w.job_id),
            })
            .collect();
        jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        JobServerObservation {
            acceptors: st.acceptors.len(),
            jobs,
            churn: st.churn,
            max_jobs: self.ctx.settings().max_jobs,
            share_jobs: st.share.len(),
            limit: st.limit,
            peak: st.peak,
        }
    }
}

impl Server for JobServer {
    type Msg = JobServerMsg;
    type State = JobServerState;
    type Args = ();

    async fn init(
        &self,
        myself: ActorRef<JobServerMsg>,
        _: (),
    ) -> Result<JobServerState, BoxError> {
        let mut st = JobServerState {
            acceptors: HashMap::new(),
            retired: Vec::new(),
            limit: self.ctx.settings().max_jobs,
            members: 1,
            queue_watch: Some(self.watch_queue(&myself)),
            next_acceptor: 0,
            rot: Rotation::new(self.ctx.settings().interval),
            churn: 0,
            timer: None,
            share: FairShare::new(self.ctx.settings().share_params()),
            last_cleanup: None,
            over_since: None,
            me: myself.clone(),
            stopping: false,
            recheck: None,
            peak: 0,
            handover: false,
        };
        self.balance(&mut st).await;
        self.refill(&myself, &mut st);
        self.schedule_tick(&myself, &mut st);
        Ok(st)
    }

    async fn handle(
        &self,
        myself: ActorRef<JobServerMsg>,
        msg: JobServerMsg,
        st: &mut JobServerState,
    ) -> Result<(), BoxError> {
        if !matches!(msg, JobServerMsg::Observe(_)) {
            // A job started, ended or was enqueued (or a tick): the count is due again.
            self.ctx.census().poke();
        }
        match msg {
            JobServerMsg::Accepted {
                acceptor,
                actor,
                job_id,
                continuous,
                group,
            } => {
                st.acceptors.remove(&acceptor);
                let now = Instant::now();
                st.share.started(job_id.clone(), group.clone(), now);
                let delay = st.rot.delay_of(&st.share, &group);
                let actor_id = actor.get_id();
                st.rot.workers.insert(
                    actor_id,
                    Worker {
                        actor,
                        job_id,
                        continuous,
                        group,
                        started: now,
                        leaving: false,
                        delay,
                    },
                );
                st.churn += 1;
                st.peak = st.peak.max(st.rot.workers.len());
                self.report_load(st);
                let s = self.ctx.settings();
                if st.limit < s.max_jobs && st.rot.live() > st.limit {
                    // Over this node's part as the last picture drew it. It keeps running:
                    // the picture may be the stale one (taken while another node took jobs
                    // it had not reported yet), and sent straight back, the job waited 5 s
                    // for a node with room. A fresh read decides, and a part confirmed
                    // smaller hands jobs back a second later (`HAND_BACK_AFTER`).
                    Self::recheck_soon(st);
                } else {
                    st.rot.trim(s.max_jobs, s.min_run_time);
                }
                self.refill(&myself, st);
            }
            JobServerMsg::AcceptorEnded(acceptor) => {
                st.acceptors.remove(&acceptor);
                self.refill(&myself, st);
            }
            JobServerMsg::WorkerExited(id) => {
                if let Some(w) = st.rot.workers.remove(&id) {
                    st.share.stopped(&w.job_id, Instant::now());
                    self.report_load(st);
                }
                self.refill(&myself, st);
            }
            JobServerMsg::Tick => self.tick(&myself, st).await,
            JobServerMsg::Rebalance => {
                if st.limit < self.ctx.settings().max_jobs {
                    self.balance(st).await;
                    self.refill(&myself, st);
                }
            }
            JobServerMsg::MembersChanged => {
                self.balance(st).await;
                self.refill(&myself, st);
            }
            JobServerMsg::StopAll => {
                for w in st.rot.workers.values() {
                    let _ = w.actor.send_message(JobMsg::Rotate(Duration::ZERO));
                }
            }
            JobServerMsg::StopAccepting(reply) => {
                st.stopping = true;
                let mut tasks = std::mem::take(&mut st.retired);
                for (_, a) in st.acceptors.drain() {
                    a.retire.send_replace(Retirement::Stopping);
                    tasks.push(a.task);
                }
                let _ = reply.send(tasks);
            }
            JobServerMsg::Observe(reply) => {
                let _ = reply.send(self.observation(st));
            }
        }
        Ok(())
    }

    async fn terminate(&self, _: ActorRef<JobServerMsg>, st: JobServerState, _: ExitReason) {
        // Acceptors stop with the state; running jobs are job_sup's children.
        drop(st);
    }
}
