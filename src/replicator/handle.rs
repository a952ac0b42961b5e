//! The embeddable replicator: [`Replicator::start`] starts one node (couch_jobs background
//! processes plus the `replicator_sup` tree for the configured node types) and returns a
//! handle to add, cancel, read and list replication jobs, subscribe to events, and shut the
//! node down gracefully (running jobs checkpoint and go back to `pending`).
//!
//! Job operations go straight to couch_jobs, so they work on any node of a cluster sharing one
//! store, whichever node runs the job.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use supervisors::SupervisorRef;

use crate::jobs::{Background, Jobs, JobsError, JobsOptions};
use crate::store::Db;

use super::collision;
use super::context::{NodeCtx, ids};
use super::error::{ReplicatorError, ReplicatorResult};
use super::event_bus::{EventBusMsg, EventReceiver, subscribe};
use super::frontend::Frontend;
use super::rep_job::{
    self, JobKind, JobView, REP_JOBS, RepState, new_job_data, parse_rep, persistent_job_id,
    transient_job_id,
};
use super::settings::ReplicatorSettings;
use super::tree;

/// How often [`Replicator::wait`] re-reads the job.
const WAIT_POLL: Duration = Duration::from_millis(100);

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
    pub node: String,
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

/// What to add: a persistent job (from a `_replicator` doc) or a transient one.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Persistent or transient.
    pub kind: JobKind,
    /// The replication document / `POST /_replicate` body (`source`, `target`, options).
    pub rep: Value,
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
pub struct Replicator {
    ctx: NodeCtx,
    tree: SupervisorRef,
    background: Option<Background>,
}

impl std::fmt::Debug for Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator")
            .field("node", &self.ctx.node())
            .finish()
    }
}

impl Replicator {
    /// Starts a node: sets the `rep_jobs` activity timeout, starts couch_jobs' background
    /// processes and the replicator tree.
    pub async fn start(config: ReplicatorConfig) -> ReplicatorResult<Replicator> {
        Self::start_with(config, Frontend::default()).await
    }

    /// [`Replicator::start`] plus the `api_frontend` children (doc_processor, HTTP API),
    /// started as the last children of the tree when the node types include `api_frontend`.
    pub async fn start_with(
        config: ReplicatorConfig,
        frontend: Frontend,
    ) -> ReplicatorResult<Replicator> {
        config
            .settings
            .validate()
            .map_err(ReplicatorError::Config)?;
        let prefix = config.jobs.prefix.clone();
        let jobs = Jobs::new(config.db, config.jobs);
        jobs.set_type_timeout(REP_JOBS, config.settings.job_timeout_sec as i64)
            .await?;
        let background = jobs.start_background().await?;
        let (handle_tx, handle_rx) = tokio::sync::watch::channel(None);
        let (tree, ctx) = tree::start(
            jobs,
            config.settings,
            config.node,
            config.server_uuid,
            prefix,
            frontend,
            handle_rx,
        )
        .await?;
        // The frontend services wait for this handle (a view without the background
        // processes, which only the host's handle stops).
        let _ = handle_tx.send(Some(Arc::new(Replicator {
            ctx: ctx.clone(),
            tree: tree.clone(),
            background: None,
        })));
        Ok(Replicator {
            ctx,
            tree,
            background: Some(background),
        })
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        self.ctx.node()
    }

    /// The settings this node runs with.
    pub fn settings(&self) -> &ReplicatorSettings {
        self.ctx.settings()
    }

    /// The couch_jobs handle (for hosts and tests that look deeper).
    pub fn jobs(&self) -> &Jobs {
        self.ctx.jobs()
    }

    /// The supervision tree (`replicator_sup`), for tests and hosts linking it.
    pub fn tree(&self) -> &SupervisorRef {
        &self.tree
    }

    /// The dynamic supervisor of this node's job actors (one child per running job, keyed by
    /// job id), for tests and hosts that inspect or stop single job actors.
    pub fn job_sup(&self) -> &super::job_sup::JobSupRef {
        self.ctx.job_sup()
    }

    /// Adds a job and returns its view (state `pending`). Validates the document first
    /// ([`ReplicatorError::BadRequest`] with the reason). Adding a transient job identical to
    /// a pending/running one is a no-op returning that job; adding a persistent job replaces
    /// the job of the same doc unless its replication is unchanged and it is active.
    pub async fn add(&self, job: NewJob) -> ReplicatorResult<JobView> {
        let spec = parse_rep(&job.rep, &self.ctx.settings().job_defaults)?;
        let job_id = match &job.kind {
            JobKind::Persistent { db_name, doc_id } => persistent_job_id(db_name, doc_id),
            JobKind::Transient { user } => transient_job_id(&spec, user.as_deref()),
        };
        let jobs = self.ctx.jobs();
        let now = self.ctx.now_secs();
        let data = new_job_data(&job.kind, &job.rep, &spec, now);
        let ctx = &self.ctx;
        let view = jobs
            .db()
            .run(|tx| {
                let data = data.clone();
                let job_id = job_id.clone();
                async move {
                    match jobs.get_job_data_tx(&tx, REP_JOBS, &job_id).await {
                        Ok(old) => {
                            let active = !rep_job::state_of(&old).is_terminal();
                            if active && old.get("rep") == data.get("rep") {
                                return Ok(JobView::from_data(&job_id, &old));
                            }
                            if let Some(rep_id) = rep_job::str_field(&old, "rep_id") {
                                collision::release_tx(ctx, &tx, rep_id, &job_id).await?;
                            }
                            jobs.remove_tx(&tx, REP_JOBS, &job_id).await?;
                        }
                        Err(JobsError::NotFound) => {}
                        Err(e) => return Err(e),
                    }
                    jobs.add_tx(&tx, REP_JOBS, &job_id, data.clone(), now)
                        .await?;
                    Ok(JobView::from_data(&job_id, &data))
                }
            })
            .await?;
        Ok(view)
    }

    /// Removes a job by job id or replication id; a running job's actor loses its lock and
    /// stops at its next update. [`ReplicatorError::NotFound`] if there is no such job.
    pub async fn cancel(&self, id: &str) -> ReplicatorResult<JobView> {
        let job_id = self.resolve(id).await?;
        let jobs = self.ctx.jobs();
        let ctx = &self.ctx;
        let view = jobs
            .db()
            .run(|tx| {
                let job_id = job_id.clone();
                async move {
                    let data = jobs.get_job_data_tx(&tx, REP_JOBS, &job_id).await?;
                    if let Some(rep_id) = rep_job::str_field(&data, "rep_id") {
                        collision::release_tx(ctx, &tx, rep_id, &job_id).await?;
                    }
                    jobs.remove_tx(&tx, REP_JOBS, &job_id).await?;
                    Ok::<_, JobsError>(JobView::from_data(&job_id, &data))
                }
            })
            .await
            .map_err(|e| not_found(e, id))?;
        self.ctx
            .publish(super::event_bus::ReplicatorEvent::Stopped {
                job_id: view.job_id.clone(),
            });
        Ok(view)
    }

    /// One job by job id or replication id.
    pub async fn get(&self, id: &str) -> ReplicatorResult<JobView> {
        let job_id = self.resolve(id).await?;
        let data = self
            .ctx
            .jobs()
            .get_job_data(REP_JOBS, &job_id)
            .await
            .map_err(|e| not_found(e, id))?;
        Ok(JobView::from_data(&job_id, &data))
    }

    /// Every job of the cluster, in job-id order.
    pub async fn list(&self) -> ReplicatorResult<Vec<JobView>> {
        Ok(self
            .ctx
            .jobs()
            .fold_jobs(REP_JOBS, Vec::new(), |mut acc, j| {
                acc.push(JobView::from_data(&j.id, &j.data));
                acc
            })
            .await?)
    }

    /// `_active_tasks`: the `active_task_info` of every running job in the cluster.
    pub async fn active_tasks(&self) -> ReplicatorResult<Vec<Value>> {
        let running = self.ctx.jobs().get_active_jobs(REP_JOBS).await?;
        Ok(running
            .into_iter()
            .filter_map(|(_, d)| d.get("active_task_info").filter(|v| !v.is_null()).cloned())
            .collect())
    }

    /// Waits until the job is running or completed. A `failed` job ends the wait with
    /// [`ReplicatorError::Failed`] (its reason); [`ReplicatorError::Timeout`] after `timeout`.
    pub async fn wait(
        &self,
        id: &str,
        until: WaitFor,
        timeout: Duration,
    ) -> ReplicatorResult<JobView> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let view = self.get(id).await?;
            match (view.state, until) {
                (RepState::Failed, _) => {
                    return Err(ReplicatorError::Failed(reason_text(&view.state_info)));
                }
                (RepState::Running, WaitFor::Running) | (RepState::Completed, _) => {
                    return Ok(view);
                }
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ReplicatorError::Timeout(id.to_owned()));
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }

    /// Subscribes to this node's events (dropping the receiver unsubscribes). `None` while
    /// the event bus is restarting.
    pub fn subscribe(&self) -> Option<EventReceiver> {
        let bus = self.tree.which_child::<EventBusMsg>(ids::EVENT_BUS)?;
        subscribe(&bus)
    }

    /// Graceful shutdown: the tree stops in reverse order; running jobs write a final
    /// checkpoint and go back to `pending` (another node, or this one after a restart, picks
    /// them up); then couch_jobs' background processes stop.
    pub async fn shutdown(mut self) {
        self.tree.stop().await;
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

    /// A job id from a job id or a replication id.
    async fn resolve(&self, id: &str) -> ReplicatorResult<String> {
        if let Some(job_id) = collision::owner(&self.ctx, id).await? {
            return Ok(job_id);
        }
        Ok(id.to_owned())
    }
}

fn not_found(e: JobsError, id: &str) -> ReplicatorError {
    match e {
        JobsError::NotFound => ReplicatorError::NotFound(id.to_owned()),
        other => ReplicatorError::Jobs(other),
    }
}

/// The text of a `state_info` value (a string, or an object with `error`/`reason`).
pub fn reason_text(info: &Value) -> String {
    match info {
        Value::String(s) => s.clone(),
        Value::Object(m) => m
            .get("reason")
            .or_else(|| m.get("error"))
            .and_then(Value::as_str)
            .map_or_else(|| info.to_string(), str::to_owned),
        Value::Null => "unknown".into(),
        other => other.to_string(),
    }
}
