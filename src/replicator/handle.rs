//! The embeddable replicator's handle, [`Replicator`]: add, cancel, read and list replication
//! jobs, subscribe to events, and shut the node down gracefully (running jobs checkpoint and
//! go back to `pending`). Starting a node is in `start.rs`, which sits above the tree; this
//! file sits below it, so the frontend services started by the tree can hold a handle.
//!
//! Job operations go straight to couch_jobs, so they work on any node of a cluster sharing one
//! store, whichever node runs the job.

use std::sync::Arc;
use std::time::Duration;

use super::new_job::NewJob;
use supervisors::SupervisorRef;

use crate::jobs::{Background, Jobs, JobsError, JobsOptions, Subscribed};
use crate::store::Db;

use super::cluster::actor::{CLUSTERING, ClusterMsg};
use super::cluster::membership::Membership;
use super::error::{ReplicatorError, ReplicatorResult};
use super::job::id::{JobId, JobRef, persistent_job_id, transient_job_id};
use super::job::record::{JobError, RepJobRecord};
use super::job::view::{JobKind, JobView, REP_JOBS, RepState, new_record, parse_rep};
use super::job::{collision, owners};
use super::node::context::NodeCtx;
use super::node::event_bus::{EVENT_BUS, EventReceiver, subscribe};
use super::node::name::NodeName;
use super::node::settings::ReplicatorSettings;
use super::scheduler::job_server::{JOB_SERVER, JobServerMsg};
use super::scheduler::job_sup::JobSupRef;
use crate::replication::RepId;
use crate::telemetry::Series;

/// How long [`Replicator::wait`] pauses before subscribing again when a subscription ended
/// early (its notifier restarted).
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(50);
/// How long a stopping node waits for its membership row to be removed before it stops its
/// jobs anyway (a store that does not answer: the neighbours will remove the row).
const LEAVE_WAIT: Duration = Duration::from_secs(5);
/// How long a stopping node's retired acceptors may take to end once its jobs are handed
/// back (one that took a job hands it back in a transaction or two).
const ACCEPTORS_WAIT: Duration = Duration::from_secs(2);

/// How to start a node.
#[derive(Debug, Clone)]
pub struct ReplicatorConfig {
    /// The store every node of the cluster shares.
    pub db: Db,
    /// couch_jobs options: layer prefix (the replicator's own keys live under it too), clock,
    /// `[couch_jobs]` settings.
    pub jobs: JobsOptions,
    /// `[replicator]` settings, including the node types.
    pub settings: ReplicatorSettings,
    /// This node's name (unique in the cluster).
    pub node: NodeName,
    /// The uuid that goes into replication ids (the same on every node of a cluster, so a
    /// replication has one id wherever it runs).
    pub server_uuid: String,
}

impl ReplicatorConfig {
    /// Defaults on `db`: node `node1@127.0.0.1`, default settings.
    pub fn new(db: Db) -> Self {
        Self {
            db,
            jobs: JobsOptions::default(),
            settings: ReplicatorSettings::default(),
            node: "node1@127.0.0.1".into(),
            server_uuid: "couch-replicator".into(),
        }
    }
}

/// What [`Replicator::wait`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// The job is running (continuous `POST /_replicate` answers 202 then).
    Running,
    /// The job is `completed` (`failed` ends the wait with [`ReplicatorError::Failed`]).
    Completed,
}

/// A running replicator node. Dropping it does not stop the node: call
/// [`Replicator::shutdown`] (graceful) or [`Replicator::kill`] (a crash).
///
/// A host starts one on a store it owns (here the in-memory engine; the embedded on-disk
/// engine or FoundationDB in production), adds jobs, reads them, and stops the node:
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use couch_replicator::{
///     Db, Endpoint, MemoryStore, NewJob, RepState, Replicator, ReplicatorConfig, ReplicatorError,
///     WaitFor,
/// };
///
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
/// # async fn main() -> Result<(), ReplicatorError> {
/// let node = Replicator::start(ReplicatorConfig::new(Db::new(Arc::new(MemoryStore::new()))))
///     .await?;
/// // Nothing listens on port 9: the job is accepted, then crashes and backs off.
/// let job = node
///     .add(NewJob::transient(
///         Endpoint::parse("http://127.0.0.1:9/a")?,
///         Endpoint::parse("http://127.0.0.1:9/b")?,
///     ).continuous())
///     .await?;
/// assert_eq!(node.get(&job.job_id).await?.job_id, job.job_id);
/// // It never completes: a wait for completion runs out.
/// assert!(matches!(
///     node.wait(&job.job_id, WaitFor::Completed, Duration::from_millis(300)).await,
///     Err(ReplicatorError::Timeout(_))
/// ));
/// let cancelled = node.cancel(&job.job_id).await?;
/// assert_ne!(cancelled.state, RepState::Completed);
/// assert!(matches!(node.get(&job.job_id).await, Err(ReplicatorError::NotFound(_))));
/// node.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct Replicator {
    pub(super) ctx: NodeCtx,
    pub(super) tree: SupervisorRef,
    pub(super) job_sup: JobSupRef,
    /// couch_jobs' processes; only the host's handle has them (the frontend's view does not).
    pub(super) background: Option<Background>,
}

impl std::fmt::Debug for Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator")
            .field("node", &self.ctx.node())
            .finish()
    }
}

impl Replicator {
    /// This node's name.
    pub fn node(&self) -> &NodeName {
        self.ctx.node()
    }

    internal_pub! {
        /// This node's metrics.
        fn metrics(&self) -> &Arc<crate::telemetry::NodeMetrics> {
            self.ctx.metrics()
        }
    }

    /// The last count of the cluster's jobs (taken by the job server every `interval`, and
    /// soon after a job is added, started or ended; reading it reads nothing from the store).
    pub fn census(&self) -> Arc<super::scheduler::census::Census> {
        self.ctx.census().last()
    }

    /// The cluster's nodes with their last heartbeat (UNIX ms), sorted by name.
    pub async fn members(&self) -> ReplicatorResult<Vec<(NodeName, i64)>> {
        let clustering = super::cluster::actor::Clustering::from_ctx(self.ctx.clone());
        Ok(clustering.membership.members().await?)
    }

    /// The settings this node runs with.
    pub fn settings(&self) -> &ReplicatorSettings {
        self.ctx.settings()
    }

    /// This node's server uuid (part of the replication ids it computes).
    pub fn server_uuid(&self) -> &str {
        self.ctx.server_uuid()
    }

    /// The job that owns replication id `rep_id` (full id), if any.
    pub(crate) async fn rep_id_owner(&self, rep_id: &RepId) -> ReplicatorResult<Option<JobId>> {
        Ok(collision::owner(&self.ctx, rep_id).await?)
    }

    internal_pub! {
        /// The couch_jobs handle (for hosts and tests that look deeper).
        fn jobs(&self) -> &Jobs {
            self.ctx.jobs()
        }
    }

    internal_pub! {
        /// The supervision tree (`replicator_sup`), for the crate's tests.
        #[cfg(any(test, feature = "internals"))]
        fn tree(&self) -> &SupervisorRef {
            &self.tree
        }
    }

    internal_pub! {
        /// The dynamic supervisor of this node's job actors (one child per running job, keyed by
        /// job id), for tests and hosts that inspect or stop single job actors.
        fn job_sup(&self) -> &JobSupRef {
            &self.job_sup
        }
    }

    /// Adds a job and returns its view (state `pending`). Validates the document first
    /// ([`ReplicatorError::Replication`], the engine's error kept as its source). Adding a
    /// transient job identical to a pending/running one is a no-op returning that job;
    /// adding a persistent job replaces the job of the same doc unless its replication is
    /// unchanged and it is active.
    pub async fn add(&self, job: NewJob) -> ReplicatorResult<JobView> {
        let spec = parse_rep(job.body(), &self.ctx.settings().job_defaults)?;
        let job_id = match job.kind() {
            JobKind::Persistent { db_name, doc_id } => persistent_job_id(db_name, doc_id),
            JobKind::Transient { user } => transient_job_id(&spec, user.as_deref()),
        };
        let jobs = self.ctx.jobs();
        let now = self.ctx.now_secs();
        let mut record = new_record(job.kind(), job.body(), &spec, self.ctx.server_uuid(), now);
        // Added paused: past any accept from its first transaction (see `pause.rs`).
        let stime = if job.is_paused() {
            record.set_state(RepState::Paused, None, now);
            super::pause::PAUSED_STIME
        } else {
            0
        };
        let data = record.to_data();
        let ctx = &self.ctx;
        let owner = match job.kind() {
            JobKind::Transient { user: Some(user) } => Some(user.as_str()),
            _ => None,
        };
        let (view, duplicate) = jobs
            .db()
            .run(|tx| {
                let (data, record) = (data.clone(), record.clone());
                let job_id = job_id.clone();
                async move {
                    match jobs.get_job_data_tx(&tx, REP_JOBS, job_id.as_str()).await {
                        Ok(old) => {
                            let old = RepJobRecord::from_data(&old)?;
                            if !old.state.is_terminal() && old.rep == record.rep {
                                return Ok((JobView::from_record(&job_id, &old), true));
                            }
                            if let Some(rep_id) = &old.rep_id {
                                collision::release_tx(ctx, &tx, rep_id, &job_id).await?;
                            }
                            jobs.remove_tx(&tx, REP_JOBS, job_id.as_str()).await?;
                        }
                        Err(JobsError::NotFound) => {}
                        Err(e) => return Err(e),
                    }
                    // Scheduled at 0, couch_jobs' own default: due at once on every node,
                    // whatever its clock says (a node 90 s ahead scheduled new jobs 90 s
                    // into the others' future).
                    jobs.add_tx(&tx, REP_JOBS, job_id.as_str(), data.clone(), stime)
                        .await?;
                    if let Some(user) = owner {
                        owners::record_tx(ctx, &tx, user, &job_id);
                    }
                    Ok((JobView::from_record(&job_id, &record), false))
                }
            })
            .await?;
        self.metrics().inc(if duplicate {
            Series::JobsDuplicateAdds
        } else {
            Series::JobsAdds
        });
        self.ctx.census().poke();
        Ok(view)
    }

    /// Removes a job named by its job id or replication id ([`JobRef`]); a running job's
    /// actor loses its lock and stops (this node's before this returns, other nodes' at their
    /// next update). [`ReplicatorError::NotFound`] if there is no such job.
    pub async fn cancel(&self, id: impl Into<JobRef>) -> ReplicatorResult<JobView> {
        let id = id.into();
        let job_id = self.resolve(&id).await?;
        let jobs = self.ctx.jobs();
        let ctx = &self.ctx;
        let view = jobs
            .db()
            .run(|tx| {
                let job_id = job_id.clone();
                async move {
                    let data = jobs.get_job_data_tx(&tx, REP_JOBS, job_id.as_str()).await?;
                    let record = RepJobRecord::from_data(&data)?;
                    if let Some(rep_id) = &record.rep_id {
                        collision::release_tx(ctx, &tx, rep_id, &job_id).await?;
                    }
                    jobs.remove_tx(&tx, REP_JOBS, job_id.as_str()).await?;
                    Ok::<_, JobsError>(JobView::from_record(&job_id, &record))
                }
            })
            .await
            .map_err(|e| not_found(e, &id))?;
        self.metrics().inc(Series::JobsRemoves);
        self.ctx
            .publish(super::node::event_bus::ReplicatorEvent::Stopped {
                job_id: view.job_id.clone(),
            });
        self.wait_local_actor_gone(&view.job_id).await;
        Ok(view)
    }

    /// A job actor of this node that runs a removed job stops at its next store update: ask
    /// for that update now and wait (bounded) until the actor is gone, so a cancel returns
    /// once the replication has stopped. Jobs run by other nodes stop at their next update.
    pub(super) async fn wait_local_actor_gone(&self, job_id: &JobId) {
        let sup = &self.job_sup;
        let Some(actor) = sup.which_child(job_id.as_str()) else {
            return;
        };
        let _ = actor.send_message(super::job::actor::JobMsg::CheckLock);
        // Waits on this actor's own exit: a new actor for the same job id may start meanwhile.
        let _ = actor
            .wait(Some(2 * super::scheduler::job_sup::JOB_SHUTDOWN))
            .await;
    }

    /// One job, named by its job id or replication id ([`JobRef`]).
    pub async fn get(&self, id: impl Into<JobRef>) -> ReplicatorResult<JobView> {
        let id = id.into();
        let job_id = self.resolve(&id).await?;
        match self
            .ctx
            .jobs()
            .get_job_data(REP_JOBS, job_id.as_str())
            .await
        {
            Ok(data) => Ok(JobView::from_data(&job_id, &data)?),
            Err(e) => Err(not_found(e, &id)),
        }
    }

    /// Every job of the cluster, in job-id order (jobs whose data cannot be read are left
    /// out and logged).
    pub async fn list(&self) -> ReplicatorResult<Vec<JobView>> {
        Ok(self
            .ctx
            .jobs()
            .fold_jobs(REP_JOBS, Vec::new(), |mut acc, j| {
                match JobView::from_data(&JobId::from(&j.id), &j.data) {
                    Ok(v) => acc.push(v),
                    Err(e) => tracing::warn!(job = %j.id, error = %e, "unreadable job data"),
                }
                acc
            })
            .await?)
    }

    /// How many unfinished transient jobs `user` holds (`[replicator] max_jobs_per_user`):
    /// reads that user's jobs only, not every job.
    pub async fn unfinished_jobs_of(&self, user: &str) -> ReplicatorResult<usize> {
        Ok(owners::unfinished_of(&self.ctx, user).await?)
    }

    /// `_active_tasks`: every running job of the cluster that has reported stats.
    pub async fn active_tasks(&self) -> ReplicatorResult<Vec<JobView>> {
        let running = self.ctx.jobs().get_active_jobs(REP_JOBS).await?;
        Ok(running
            .into_iter()
            .filter_map(|(id, d)| JobView::from_data(&JobId::from(id), &d).ok())
            .filter(|v| v.state == RepState::Running && v.stats.is_some())
            .collect())
    }

    /// Waits until the job is running or completed. A `failed` job ends the wait with
    /// [`ReplicatorError::Failed`] (its reason); [`ReplicatorError::Timeout`] after `timeout`.
    ///
    /// Driven by couch_jobs' subscription to the job (the type's notifier tells of every
    /// state change and every `update`), not by polling: each event carries the job data the
    /// answer is read from.
    pub async fn wait(
        &self,
        id: impl Into<JobRef>,
        until: WaitFor,
        timeout: Duration,
    ) -> ReplicatorResult<JobView> {
        let deadline = tokio::time::Instant::now() + timeout;
        let id = id.into();
        let job_id = self.resolve(&id).await?;
        loop {
            let subscribed = self
                .ctx
                .jobs()
                .subscribe(REP_JOBS, job_id.as_str())
                .await
                .map_err(|e| not_found(e, &id))?;
            let (mut sub, data) = match subscribed {
                Subscribed::Finished(data) => {
                    return wait_outcome(&JobView::from_data(&job_id, &data)?, until)
                        .unwrap_or_else(|| Err(ReplicatorError::Timeout(id.clone())));
                }
                Subscribed::Active { sub, data, .. } => (sub, data),
            };
            if let Some(done) = wait_outcome(&JobView::from_data(&job_id, &data)?, until) {
                return done;
            }
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Err(ReplicatorError::Timeout(id.clone()));
                }
                let Some(event) = sub.wait(left).await else {
                    // A timeout, or the subscription ended (its notifier restarted):
                    // subscribe again, which re-reads the job.
                    break;
                };
                let Some(data) = event.data else {
                    return Err(ReplicatorError::NotFound(id.clone()));
                };
                if let Some(done) = wait_outcome(&JobView::from_data(&job_id, &data)?, until) {
                    return done;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ReplicatorError::Timeout(id.clone()));
            }
            // Do not spin while a notifier is restarting.
            tokio::time::sleep(RESUBSCRIBE_PAUSE).await;
        }
    }

    /// Subscribes to this node's events (dropping the receiver unsubscribes). `None` while
    /// the event bus is restarting.
    pub fn subscribe(&self) -> Option<EventReceiver> {
        let bus = EVENT_BUS.in_tree(&self.tree)?;
        subscribe(&bus)
    }

    /// Graceful shutdown: the tree stops in reverse order; running jobs write a final
    /// checkpoint and go back to `pending` (another node, or this one after a restart, picks
    /// them up), as do the whole-server jobs this node ran; then couch_jobs' background
    /// processes stop.
    pub async fn shutdown(mut self) {
        // No more jobs taken here: the jobs stopped below go back to the queue, and this
        // node's own acceptors, still waiting, would take them and die with the node.
        let mut acceptors = Vec::new();
        if let Some(job_server) = self.ctx.children().get::<JobServerMsg>(JOB_SERVER.name())
            && let Ok(ractor::rpc::CallResult::Success(tasks)) = job_server
                .call(JobServerMsg::StopAccepting, Some(LEAVE_WAIT))
                .await
        {
            acceptors = tasks;
        }
        // Out of the membership first: the other nodes make room for this node's jobs while
        // they are still being checkpointed, and take them the moment they are handed back
        // (a rolling restart's jobs waited for this node's row to go, at the end, before).
        if let Some(clustering) = self.ctx.children().get::<ClusterMsg>(CLUSTERING.name()) {
            let _ = clustering.call(ClusterMsg::Leave, Some(LEAVE_WAIT)).await;
        }
        self.tree.stop().await;
        // A retired acceptor that took one of the jobs just handed back gives it back and
        // ends; one still waiting for a job is stopped after a moment.
        let ending = futures::future::join_all(acceptors.iter_mut());
        if tokio::time::timeout(ACCEPTORS_WAIT, ending).await.is_err() {
            acceptors.iter().for_each(|a| a.abort());
        }
        // A job killed for outliving its stop (a slow final checkpoint) wrote nothing: its
        // job would stay locked by this node for the activity timeout (over a minute in the
        // failover drill under load). Every job actor of this node is gone now, so what the
        // store still shows running here is handed back, as a neighbour does for a dead node.
        let own = Membership::new(
            self.ctx.jobs().clone(),
            self.ctx.prefix(),
            self.ctx.node(),
            self.ctx.settings().node_timeout(),
        );
        match own.requeue_rest_of(self.ctx.node()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                jobs = n,
                "jobs stopped without their checkpoint handed back"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot hand back the jobs left running here"),
        }
        match self.release_server_jobs().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(server_jobs = n, "server jobs handed back"),
            Err(e) => tracing::warn!(error = %e, "cannot hand back server jobs"),
        }
        if let Some(bg) = self.background.take() {
            bg.stop().await;
        }
    }

    /// Kills the node without any cleanup, like a crashed machine: job actors stop updating
    /// and the activity monitor of another node re-enqueues their jobs.
    pub async fn kill(mut self) {
        self.tree.actor().kill();
        self.tree.wait().await;
        if let Some(bg) = self.background.take() {
            bg.kill().await;
        }
    }

    /// The job id a [`JobRef`] names. A replication id is claimed in the collision index
    /// when its job first runs; a pending job that has not run yet is found by the id its
    /// record shows, as CouchDB finds it.
    pub(super) async fn resolve(&self, id: &JobRef) -> ReplicatorResult<JobId> {
        let rep_id = match id {
            JobRef::Job(job_id) => return Ok(job_id.clone()),
            JobRef::Replication(rep_id) => rep_id,
        };
        if let Some(job_id) = self.rep_id_owner(rep_id).await? {
            return Ok(job_id);
        }
        self.list()
            .await?
            .into_iter()
            .find(|j| j.rep_id.as_ref() == Some(rep_id))
            .map(|j| j.job_id)
            .ok_or_else(|| ReplicatorError::NotFound(id.clone()))
    }
}

/// Whether `view` ends a wait for `until`, and how.
fn wait_outcome(view: &JobView, until: WaitFor) -> Option<ReplicatorResult<JobView>> {
    match (view.state, until) {
        (RepState::Failed, _) => Some(Err(ReplicatorError::Failed(failure(view)))),
        (RepState::Running, WaitFor::Running) | (RepState::Completed, _) => Some(Ok(view.clone())),
        _ => None,
    }
}

pub(super) fn not_found(e: JobsError, id: &JobRef) -> ReplicatorError {
    match e {
        JobsError::NotFound => ReplicatorError::NotFound(id.clone()),
        other => ReplicatorError::Jobs(other),
    }
}

/// Why a `failed` job failed (a job failed without a recorded reason is an internal error).
pub fn failure(view: &JobView) -> JobError {
    view.state_info
        .clone()
        .unwrap_or_else(|| JobError::Internal {
            reason: "failed without a recorded reason".into(),
        })
}
