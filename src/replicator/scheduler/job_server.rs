//! job_server: the acceptor model of CouchDB 4.x's `couch_replicator_job_server` (RFC 016).
//!
//! Keeps up to `max_acceptors` acceptor tasks waiting in `accept(max_sched_time = now)` while
//! acceptors + running jobs < `max_jobs`; an acceptor that gets a job asks `job_sup` to start
//! a job actor and reports [`JobServerMsg::Accepted`]. Every `interval` (+ up to a third of it
//! at random) a [`JobServerMsg::Tick`]: trim the longest-running continuous jobs older than
//! `min_run_time` back to `max_jobs` (never one-shot jobs), start up to `max_churn` extra
//! acceptors when jobs are pending, remove finished transient jobs older than
//! `transient_job_max_age`, refresh the gauges. The arithmetic is in `super::rotation_policy`.
//! Each extra job accepted trims one back out at once (CouchDB 4.x trims at the next
//! interval), so a rotation takes one interval, as CouchDB 3.x's does, and `max_jobs` is
//! exceeded only while the new jobs start, not for a whole interval.
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
//! Several nodes (`balance`): every tick, and when a job is enqueued while this
//! node is held below `max_jobs` (`Rebalance`, from a task watching the queue), the node
//! reads its part of the cluster's jobs. It keeps acceptors only up to that part (a
//! surplus acceptor retires after its current wait), hands the jobs over it back to the
//! queue once a second read confirms it ([`HAND_BACK_AFTER`]), reports its load row at
//! every job start and end, and starts no extra rotation acceptors unless every member is
//! full.
//!
//! Other messages: `WorkerExited` (from job_sup), `Observe`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::{ActorId, ActorRef, RpcReplyPort};
use rand::Rng;
use supervisors::{BoxError, ExitReason, Observable, Server};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::jobs::{JobState, JobsError};

use super::balance;
use super::job_acceptor::acceptor;
use super::job_sup::JobSupRef;
use super::rotation_policy::{acceptors_to_add, cluster_churn, extra_acceptor_budget};
use super::running_jobs::{Rotation, Worker};
use super::share::{FairShare, ShareKey};
use crate::replicator::cluster::membership::Membership;
use crate::replicator::job::actor::JobMsg;
use crate::replicator::job::id::JobId;
use crate::replicator::job::record::RepJobRecord;
use crate::replicator::job::view::REP_JOBS;
use crate::replicator::node::child_id::ChildId;
use crate::replicator::node::context::NodeCtx;
use crate::replicator::node::settings::ReplicatorSettings;

/// Pending jobs counted for the rotation delay.
const ROTATION_COUNT_LIMIT: usize = 100_000;

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

/// One acceptor task, and the flag that tells it to end after its current wait.
struct Acceptor {
    task: JoinHandle<()>,
    retire: Arc<AtomicBool>,
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
}

/// How long a node must be seen over its part, at two balance reads, before it hands jobs
/// back. The picture is racy while jobs move: a job handed back is counted both as pending
/// and in its old node's load row until that row is rewritten, a job just taken in neither.
/// Acting on one read, nodes handed back jobs that no node then had room for, and took them
/// back a tick later: a target waited 5-7 s in a rolling restart of 30 jobs.
const HAND_BACK_AFTER: Duration = Duration::from_secs(1);

impl Drop for JobServerState {
    fn drop(&mut self) {
        let tasks = self.acceptors.values().map(|a| &a.task);
        for t in tasks
            .chain(&self.retired)
            .chain(&self.timer)
            .chain(&self.queue_watch)
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
            let retire = Arc::new(AtomicBool::new(false));
            let task = tokio::spawn(acceptor(
                self.ctx.clone(),
                self.job_sup.clone(),
                myself.clone(),
                id,
                retire.clone(),
            ));
            st.acceptors.insert(id, Acceptor { task, retire });
        }
    }

    fn refill(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState) {
        let s = self.ctx.settings();
        let n = acceptors_to_add(
            st.acceptors.len(),
            st.rot.workers.len(),
            st.limit,
            s.max_acceptors,
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
        }
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
        // The queue is the cluster's: a trimmed job's turn comes at the cluster's pace.
        // Counting this node's churn alone held jobs back `members` times too long.
        let pending = self.pending_all().await;
        let churn = cluster_churn(s.max_churn, st.members);
        st.rot.tick(now, s.interval, pending, churn);
        // The jobs surely there: a leaving job may already be counted as pending.
        let all_jobs = pending + st.rot.live();
        st.rot.refresh(&st.share, s.max_jobs, all_jobs);
        st.churn += st.rot.trim(s.max_jobs, s.min_run_time);
        self.balance(st).await;
        // 2. extra acceptors for pending work; each one accepted trims the job with the
        // longest-running job back out (see `Accepted`), so a rotation completes within the
        // cycle and `max_jobs` is exceeded only while a job starts
        // (none while this node is held below `max_jobs`: some member has room for every
        // pending job, nothing needs to rotate)
        let budget = extra_acceptor_budget(
            st.acceptors.len(),
            st.rot.workers.len(),
            s.max_jobs,
            s.max_churn,
            st.churn,
            st.rot.rotatable(s.min_run_time),
        ) * usize::from(st.limit >= s.max_jobs);
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

    /// Reads this node's part of the cluster's jobs (`balance`) into `st.limit`,
    /// retires the acceptors beyond it and hands the running jobs beyond it back to the
    /// queue. A job is moved at most once an interval (or `min_run_time`, if shorter), so
    /// views read at slightly different times do not bounce it. Keeps the old limit when
    /// the store cannot be read.
    fn membership(&self) -> Membership {
        Membership::new(
            self.ctx.jobs().clone(),
            self.ctx.prefix(),
            self.ctx.node(),
            self.ctx.settings().node_timeout(),
        )
        .with_sightings(self.ctx.sightings().clone())
    }

    /// Writes this node's load row now (a blind write) when it runs in a cluster: the other
    /// nodes' balance counts a job it just took as running here, not as gone. Reported only
    /// at this node's own balance before, a node that had just taken its part still showed
    /// none, so a neighbour counted 10 jobs too few and handed back more than the newcomer
    /// had room for; they waited for the next tick (4.8 s in the failover drill).
    fn report_load(&self, st: &JobServerState) {
        if st.members < 2 {
            return;
        }
        let (membership, running) = (self.membership(), st.rot.live());
        tokio::spawn(async move {
            let db = membership.jobs().db().clone();
            let written = db
                .run(|tx| {
                    let m = &membership;
                    async move {
                        m.report_load_tx(&tx, running);
                        Ok::<_, crate::jobs::JobsError>(())
                    }
                })
                .await;
            if let Err(e) = written {
                tracing::debug!(error = %e, "could not report this node's load");
            }
        });
    }

    async fn balance(&self, st: &mut JobServerState) {
        let s = self.ctx.settings();
        let membership = self.membership();
        let load = match balance::read_load(&self.ctx, &membership, st.rot.live()).await {
            Ok(load) => load,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the cluster's load");
                return;
            }
        };
        st.members = load.running.len().max(1);
        st.limit = balance::node_limit(self.ctx.node().as_str(), st.rot.live(), &load, s.max_jobs);
        let room = st.limit.saturating_sub(st.rot.live());
        let surplus: Vec<u64> = st.acceptors.keys().skip(room).copied().collect();
        for id in surplus {
            if let Some(a) = st.acceptors.remove(&id) {
                a.retire.store(true, Ordering::Relaxed);
                st.retired.push(a.task);
            }
        }
        st.retired.retain(|t| !t.is_finished());
        if st.limit >= s.max_jobs || st.rot.live() <= st.limit {
            st.over_since = None;
            return;
        }
        match st.over_since {
            None => {
                st.over_since = Some(Instant::now());
                let me = st.me.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(HAND_BACK_AFTER).await;
                    let _ = me.send_message(JobServerMsg::Rebalance);
                });
            }
            Some(since) if since.elapsed() >= HAND_BACK_AFTER => {
                st.over_since = None;
                st.churn += st.rot.hand_back(st.limit, s.min_run_time.min(s.interval));
            }
            Some(_) => {}
        }
    }

    /// A task that sends `Rebalance` whenever a job is enqueued, at most every quarter
    /// interval (between 0.2 and 2 s): a node held below `max_jobs` then takes its part of
    /// new jobs at once rather than at its next tick.
    fn watch_queue(&self, myself: &ActorRef<JobServerMsg>) -> JoinHandle<()> {
        let (jobs, me) = (self.ctx.jobs().clone(), myself.clone());
        let pause = (self.ctx.settings().interval / 4)
            .clamp(Duration::from_millis(200), Duration::from_secs(2));
        tokio::spawn(async move {
            loop {
                let armed = jobs
                    .db()
                    .run(|tx| {
                        let jobs = jobs.clone();
                        async move { Ok::<_, JobsError>(jobs.watch_pending_tx(&tx, REP_JOBS)) }
                    })
                    .await;
                let fired = match armed {
                    Ok(watch) => watch.await.is_ok(),
                    Err(_) => false,
                };
                if fired && me.send_message(JobServerMsg::Rebalance).is_err() {
                    return;
                }
                tokio::time::sleep(if fired { pause } else { Duration::from_secs(1) }).await;
            }
        })
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
                self.report_load(st);
                let s = self.ctx.settings();
                if st.limit < s.max_jobs && st.rot.live() > st.limit {
                    // Taken by an acceptor retiring meanwhile: over this node's part, so
                    // straight back to the queue for a node under its own.
                    if let Some(w) = st.rot.workers.get_mut(&actor_id) {
                        let _ = w.actor.send_message(JobMsg::Rotate(Duration::ZERO));
                        w.leaving = true;
                    }
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
                    a.retire.store(true, Ordering::Relaxed);
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
