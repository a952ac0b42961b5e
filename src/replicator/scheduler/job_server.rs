//! job_server: the acceptor model of CouchDB 4.x's `couch_replicator_job_server` (RFC 016).
//!
//! Keeps up to `max_acceptors` acceptor tasks waiting in `accept(max_sched_time = now)` while
//! acceptors + running jobs < `max_jobs`; an acceptor that gets a job asks `job_sup` to start
//! a job actor and reports [`JobServerMsg::Accepted`]. Every `interval` (+ up to a third of it
//! at random) a [`JobServerMsg::Tick`]: trim the longest-running continuous jobs older than
//! `min_run_time` back to `max_jobs` (never one-shot jobs), start up to `max_churn` extra
//! acceptors when jobs are pending, remove finished transient jobs older than
//! `transient_job_max_age`, refresh the gauges. The arithmetic is in [`super::rotation_policy`].
//! Each extra job accepted trims one back out at once (CouchDB 4.x trims at the next
//! interval), so a rotation takes one interval, as CouchDB 3.x's does, and `max_jobs` is
//! exceeded only while the new jobs start, not for a whole interval.
//! The running jobs and when each rotates out and comes back are `rotation.rs`'s:
//! a trimmed job becomes eligible again shortly before its turn (one cycle per `max_churn`
//! waiting jobs, less a margin; see [`super::rotation_policy::eligible_after`]) and acceptors take
//! the earliest scheduled first, so jobs rotate in order and none starves (CouchDB 4.x
//! waits one interval).
//!
//! Fair share ([`super::share`], [`super::share_plan`]): running jobs are charged to their
//! `_replicator` database (transient jobs to one group) every tick; every tick the slots
//! are split among the databases by their shares, and a trimmed job's rotation delay is
//! scaled by its database's planned factor (a database whose jobs each get less than the
//! average running fraction waits longer) times a feedback factor from its recent running
//! time against its planned part, averaged over about a rotation and left at 1 within a
//! dead band ([`super::share::smooth_ratio`], [`super::share::delay_factor`]). Trimming
//! stops the longest-running jobs, those of a database measured far over its part first.
//!
//! Other messages: `WorkerExited` (from job_sup), `Observe`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::{ActorId, ActorRef, RpcReplyPort};
use rand::Rng;
use supervisors::{BoxError, ExitReason, Observable, Server};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::jobs::{AcceptOpts, JobState, JobsError};

use super::job_sup::JobSupRef;
use super::rotation_policy::{acceptors_to_add, extra_acceptor_budget};
use super::running_jobs::{Rotation, Worker};
use super::share::{FairShare, ShareKey};
use crate::replicator::job::actor::{JobArgs, JobMsg};
use crate::replicator::job::record::RepJobRecord;
use crate::replicator::job::view::REP_JOBS;
use crate::replicator::node::context::NodeCtx;
use crate::replicator::node::settings::ReplicatorSettings;

/// How long one accept call waits before the acceptor sleeps its jitter.
const ACCEPT_WAIT: Duration = Duration::from_secs(5);
/// The earliest eligible jobs an acceptor picks among: few enough that a job eligible early
/// does not jump the jobs scheduled before it, enough (about a second of trims at 10,000
/// jobs) that one database's jobs do not start in id order together
/// (docs/decisions/2026-11-26-accept-candidates.md).
const ACCEPT_CANDIDATES: usize = 64;
/// Pending jobs counted for the rotation delay.
const ROTATION_COUNT_LIMIT: usize = 100_000;
/// How long an acceptor keeps trying to hand an accepted job to a restarting job_sup.
const HANDOFF_ATTEMPTS: u32 = 50;

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
        job_id: String,
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
    /// The server's state.
    Observe(RpcReplyPort<JobServerObservation>),
    /// This node was removed from the cluster as dead: stop every running job now (a
    /// neighbour has re-enqueued them; each stop is fenced by its job lock).
    StopAll,
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
}

/// One running job as the job server sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunningJobObservation {
    /// The couch_jobs id.
    pub job_id: String,
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

/// The job server's state.
pub struct JobServerState {
    acceptors: HashMap<u64, JoinHandle<()>>,
    next_acceptor: u64,
    /// The running jobs and the rotation's timing.
    rot: Rotation,
    churn: usize,
    timer: Option<JoinHandle<()>>,
    share: FairShare<String>,
    /// When finished transient jobs were last looked for.
    last_cleanup: Option<Instant>,
}

impl Drop for JobServerState {
    fn drop(&mut self) {
        for a in self.acceptors.values() {
            a.abort();
        }
        if let Some(t) = &self.timer {
            t.abort();
        }
    }
}

impl JobServer {
    fn spawn_acceptors(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState, n: usize) {
        for _ in 0..n {
            let id = st.next_acceptor;
            st.next_acceptor += 1;
            let task = tokio::spawn(acceptor(
                self.ctx.clone(),
                self.job_sup.clone(),
                myself.clone(),
                id,
            ));
            st.acceptors.insert(id, task);
        }
    }

    fn refill(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState) {
        let s = self.ctx.settings();
        let n = acceptors_to_add(
            st.acceptors.len(),
            st.rot.workers.len(),
            s.max_jobs,
            s.max_acceptors,
        );
        self.spawn_acceptors(myself, st, n);
    }

    fn schedule_tick(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState) {
        let interval = self.ctx.settings().interval;
        let jitter_ms = (interval.as_millis() as u64 / 3).max(1);
        let wait = interval + Duration::from_millis(rand::rng().random_range(0..jitter_ms));
        let me = myself.clone();
        st.timer = Some(tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = me.send_message(JobServerMsg::Tick);
        }));
    }

    async fn tick(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState) {
        // The next tick is timed from this one's start, not its end: the tick's own work
        // (store scans, the stops it sends) would otherwise lengthen every cycle and, at
        // 10,000 jobs, every rotation by a third.
        self.schedule_tick(myself, st);
        let s = self.ctx.settings();
        // A job that ended before its Accepted arrived leaves a stale entry.
        let now = Instant::now();
        let share = &mut st.share;
        st.rot.workers.retain(|_, w| {
            let alive = w.actor.get_status() < ractor::ActorStatus::Stopping;
            if !alive {
                share.stopped(&w.job_id, now);
            }
            alive
        });
        // The churn of this cycle: what this tick starts or stops. Jobs accepted since the
        // last tick, and the trims they caused, belong to the last one.
        st.churn = 0;
        // 1. fair-share accounting, then trim what is still over `max_jobs`
        st.share.update(now);
        let pending = self.pending_all().await;
        st.rot.tick(now, s.interval, pending, s.max_churn);
        // The jobs surely there: a leaving job may already be counted as pending.
        let all_jobs = pending + st.rot.live();
        st.rot.refresh(&st.share, s.max_jobs, all_jobs);
        st.churn += st.rot.trim(s.max_jobs, s.min_run_time);
        // 2. extra acceptors for pending work; each one accepted trims the job with the
        // longest-running job back out (see `Accepted`), so a rotation completes within the
        // cycle and `max_jobs` is exceeded only while a job starts
        let budget = extra_acceptor_budget(
            st.acceptors.len(),
            st.rot.workers.len(),
            s.max_jobs,
            s.max_churn,
            st.churn,
        );
        if budget > 0 {
            let now = self.ctx.now_secs();
            match self
                .ctx
                .jobs()
                .pending_count(REP_JOBS, Some(now), Some(budget))
                .await
            {
                Ok(pending) => self.spawn_acceptors(myself, st, budget.min(pending)),
                Err(e) => tracing::warn!(error = %e, "pending_count failed"),
            }
        }
        // 3. transient cleanup: a scan of every job, so not at every tick (see
        // `cleanup_period`).
        if st
            .last_cleanup
            .is_none_or(|t| t.elapsed() >= cleanup_period(s))
        {
            st.last_cleanup = Some(Instant::now());
            if let Err(e) = self.cleanup_transient().await {
                tracing::warn!(error = %e, "transient job cleanup failed");
            }
        }
        // 4. gauges
        let m = self.ctx.metrics();
        m.jobs_accepting
            .store(st.acceptors.len() as u64, Ordering::Relaxed);
        m.jobs_running
            .store(st.rot.workers.len() as u64, Ordering::Relaxed);
        m.reschedules.fetch_add(1, Ordering::Relaxed);
        self.refill(myself, st);
    }

    /// Every waiting job, eligible or not (up to [`ROTATION_COUNT_LIMIT`]): the queue a job
    /// trimmed now waits behind ([`super::rotation_policy::turn_due`], counted in measured cycles: the interval and
    /// its jitter, not intervals). At the end of a rotation most of them are the ones just
    /// rotated out, and the few that never ran must come first. CouchDB 4.x lets a rotated
    /// job back after one interval, which with couch_jobs' random pick among 1,024 leaves a
    /// long tail of jobs that wait many rotations.
    async fn pending_all(&self) -> usize {
        self.ctx
            .jobs()
            .pending_count(REP_JOBS, None, Some(ROTATION_COUNT_LIMIT))
            .await
            .unwrap_or(0)
    }

    async fn cleanup_transient(&self) -> Result<(), JobsError> {
        let max_age = self.ctx.settings().transient_job_max_age.as_secs() as i64;
        let limit = self.ctx.now_secs() - max_age;
        let old: Vec<String> = self
            .ctx
            .jobs()
            .fold_jobs(REP_JOBS, Vec::new(), |mut acc, j| {
                // The state first: decoding every record is the expensive part.
                let old_transient = || {
                    RepJobRecord::from_data(&j.data)
                        .is_ok_and(|r| r.is_transient() && r.last_updated <= limit)
                };
                if j.state == JobState::Finished && old_transient() {
                    acc.push(j.id);
                }
                acc
            })
            .await?;
        for id in old {
            match self.ctx.jobs().remove(REP_JOBS, &id).await {
                Ok(()) | Err(JobsError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// How often finished transient jobs are looked for: a tenth of their maximum age, at least
/// one `interval` and at most five minutes. The scan reads every job in the store, so doing
/// it at every tick would make an idle node's cost grow with the number of jobs; a finished
/// transient job may outlive `transient_job_max_age` by this much.
fn cleanup_period(s: &ReplicatorSettings) -> Duration {
    let tenth = s.transient_job_max_age / 10;
    tenth.clamp(s.interval, Duration::from_secs(300).max(s.interval))
}

/// One acceptor: waits for a pending job scheduled no later than now, hands it to job_sup.
async fn acceptor(ctx: NodeCtx, job_sup: JobSupRef, server: ActorRef<JobServerMsg>, id: u64) {
    let jitter = (ctx.settings().startup_jitter.as_millis() as u64).max(1);
    loop {
        let opts = AcceptOpts::default()
            .max_sched_time(ctx.now_secs())
            .timeout(ACCEPT_WAIT)
            .candidates(ACCEPT_CANDIDATES);
        match ctx.jobs().accept(REP_JOBS, opts).await {
            Ok((job, data)) => {
                let record = match RepJobRecord::from_data(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        // Unreadable data cannot be run: finish it so it does not come back.
                        tracing::warn!(job = %job.id, error = %e, "unreadable job data");
                        let _ = ctx.jobs().finish(&job, None).await;
                        continue;
                    }
                };
                let continuous = record.continuous;
                let group = match &record.origin.db_name {
                    Some(db) => ShareKey::Db(db.clone()),
                    None => ShareKey::Transient,
                };
                for _ in 0..HANDOFF_ATTEMPTS {
                    let args = JobArgs {
                        ctx: ctx.clone(),
                        job: job.clone(),
                        record: record.clone(),
                    };
                    if let Ok(actor) = job_sup.start_child(job.id.clone(), args).await {
                        let _ = server.send_message(JobServerMsg::Accepted {
                            acceptor: id,
                            actor,
                            job_id: job.id.clone(),
                            continuous,
                            group: group.clone(),
                        });
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // The lock stays with nobody: the activity monitor re-enqueues the job.
                tracing::warn!(job = %job.id, "no job_sup to start an accepted job");
                let _ = server.send_message(JobServerMsg::AcceptorEnded(id));
                return;
            }
            Err(JobsError::NotFound) => {
                let ms = rand::rng().random_range(1..=jitter);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
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
            next_acceptor: 0,
            rot: Rotation::new(self.ctx.settings().interval),
            churn: 0,
            timer: None,
            share: FairShare::new(self.ctx.settings().share_params()),
            last_cleanup: None,
        };
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
                st.rot.workers.insert(
                    actor.get_id(),
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
                let s = self.ctx.settings();
                st.rot.trim(s.max_jobs, s.min_run_time);
                self.refill(&myself, st);
            }
            JobServerMsg::AcceptorEnded(acceptor) => {
                st.acceptors.remove(&acceptor);
                self.refill(&myself, st);
            }
            JobServerMsg::WorkerExited(id) => {
                if let Some(w) = st.rot.workers.remove(&id) {
                    st.share.stopped(&w.job_id, Instant::now());
                }
                self.refill(&myself, st);
            }
            JobServerMsg::Tick => self.tick(&myself, st).await,
            JobServerMsg::StopAll => {
                for w in st.rot.workers.values() {
                    let _ = w.actor.send_message(JobMsg::Rotate(Duration::ZERO));
                }
            }
            JobServerMsg::Observe(reply) => {
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
                let _ = reply.send(JobServerObservation {
                    acceptors: st.acceptors.len(),
                    jobs,
                    churn: st.churn,
                    max_jobs: self.ctx.settings().max_jobs,
                    share_jobs: st.share.len(),
                });
            }
        }
        Ok(())
    }

    async fn terminate(&self, _: ActorRef<JobServerMsg>, st: JobServerState, _: ExitReason) {
        // Acceptors stop with the state; running jobs are job_sup's children.
        drop(st);
    }
}
