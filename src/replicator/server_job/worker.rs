//! The worker of whole-server jobs (`server_jobs`), a service of every `replication` node:
//! accepts server jobs from couch_jobs and runs each on a task. A run lists the source
//! server's databases, adds one replication per matching database through the node's own
//! [`Replicator`] API (ids derived from the server job id, so re-adding after a restart is a
//! no-op), follows the source's `_db_updates` (polling `_all_dbs` where the server has no
//! `_db_updates`, as pouchdb-server) to add databases created later and to drop deleted
//! ones, and writes the progress of every database into its own job data with couch_jobs
//! `update`, which also keeps the job alive: a worker whose node dies stops updating, and the
//! activity monitor hands the job to another worker (or this node after a restart).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::jobs::{AcceptOpts, Job, JobData, JobsError};
use crate::replication::endpoint::server::{self, DbUpdates};
use crate::replication::{Context, ReplicationOptions};

use super::spec::{
    DbProgress, SERVER_JOBS, ServerJobId, ServerRecord, ServerSpec, ServerState, db_job_kind,
    group_of,
};
use crate::replicator::handle::Replicator;
use crate::replicator::job::id::persistent_job_id;
use crate::replicator::job::lease::Lease;
use crate::replicator::job::view::{RepState, parse_rep};
use crate::replicator::new_job::NewJob;
use crate::replicator::node::event_bus::{EventReceiver, ReplicatorEvent};
use crate::replicator::node::frontend::{ServiceError, ServiceFn};

/// Child id of the worker service.
pub(crate) const SERVER_WORKER: &str = "server_jobs";
/// How long one accept waits before the worker looks at its finished runs.
const ACCEPT_WAIT: Duration = Duration::from_secs(5);
/// The `_all_dbs` poll period where `_db_updates` is missing.
const POLL: Duration = Duration::from_secs(1);
/// The longest `_db_updates` longpoll (shorter with a short activity timeout: each turn
/// ends with the job's keep-alive update).
const MAX_LONGPOLL: Duration = Duration::from_secs(10);
/// Replications added at once (their commits share the store's group commits).
const ADD_CONCURRENCY: usize = 32;
/// After one of its replications ended on this node, the run waits this long for others to
/// end too before its next turn (one turn reads every job).
const END_DEBOUNCE: Duration = Duration::from_millis(100);

/// The worker as a tree service.
pub(crate) fn service() -> ServiceFn {
    Arc::new(|rep| Box::pin(run_worker(rep)))
}

/// Accepts server jobs forever; each runs on its own task (aborted with this future).
async fn run_worker(rep: Arc<Replicator>) -> Result<(), ServiceError> {
    let mut runs = JoinSet::new();
    loop {
        let opts = AcceptOpts::default()
            .max_sched_time(rep.ctx.now_secs())
            .timeout(ACCEPT_WAIT);
        match rep.jobs().accept(SERVER_JOBS, opts).await {
            Ok((job, data)) => {
                tracing::info!(job = %job.id, "server job accepted");
                runs.spawn(run_job(rep.clone(), job, data));
            }
            Err(JobsError::NotFound) => {}
            Err(e) => {
                tracing::warn!(error = %e, "server job accept failed");
                tokio::time::sleep(POLL).await;
            }
        }
        while runs.try_join_next().is_some() {}
    }
}

/// Runs one accepted server job until it completes, is removed, or loses its lock.
async fn run_job(rep: Arc<Replicator>, job: Job, data: JobData) {
    let record = match ServerRecord::from_data(&data) {
        Ok(r) if r.spec.is_some() => r,
        other => {
            let reason = match other {
                Err(e) => e.to_string(),
                Ok(_) => "server job without a specification".to_owned(),
            };
            tracing::warn!(job = %job.id, %reason, "unreadable server job");
            let failed = ServerRecord {
                state: ServerState::Failed,
                error: Some(reason),
                ..ServerRecord::default()
            };
            let _ = rep.jobs().finish(&job, Some(failed.to_data())).await;
            return;
        }
    };
    let Some(spec) = record.spec.clone() else {
        return;
    };
    let (source_options, target_options) = endpoint_options(&rep, &spec);
    let mut run = ServerRun {
        engine: Context {
            metrics: rep.ctx.metrics().clone(),
            response_budget: rep.ctx.response_budget().clone(),
            ..Context::default()
        },
        source_options,
        target_options,
        group: group_of(&ServerJobId::from(&job.id)),
        id: ServerJobId::from(&job.id),
        since: None,
        db_updates: None,
        listed: false,
        events: None,
        lease: Arc::new(Lease::new(rep.settings().job_timeout)),
        rep,
        job,
        record,
        spec,
    };
    run.record.state = ServerState::Running;
    run.record.node = Some(run.rep.node().clone());
    let lease = run.lease.clone();
    // The run's own lease, as a replication job's (`job/lease.rs`): once the store has not
    // confirmed the lock for most of an activity timeout another worker may be about to take
    // the job, so this run stops where it is, writing nothing more anywhere (no replication
    // added or cancelled, no target deleted).
    tokio::select! {
        () = run_turns(run) => {}
        () = lease.expired() => {
            tracing::warn!(
                lease_age_ms = lease.age().as_millis() as u64,
                "server job lease ran out (store unreachable?); run stopped"
            );
        }
    }
}

async fn run_turns(mut run: ServerRun) {
    loop {
        match run.turn().await {
            Ok(false) => {}
            Ok(true) => return run.complete().await,
            Err(e) => {
                tracing::info!(job = %run.job.id, error = %e, "server job stopped");
                return run.stopped().await;
            }
        }
        run.wait_for_changes().await;
    }
}

/// The connection options of the source and target servers: those the job's replications
/// get (its per-database options over the node's defaults); CouchDB's defaults where the
/// options do not parse (each replication then fails with the reason).
fn endpoint_options(
    rep: &Replicator,
    spec: &ServerSpec,
) -> (ReplicationOptions, ReplicationOptions) {
    let defaults = &rep.settings().job_defaults;
    match parse_rep(&spec.db_body("_all_dbs"), defaults) {
        Ok(r) => (r.options.clone(), r.options),
        Err(_) => (defaults.clone(), defaults.clone()),
    }
}

/// One server job's run on this worker.
struct ServerRun {
    rep: Arc<Replicator>,
    job: Job,
    /// The job's id, typed (`job.id` is couch_jobs' opaque text).
    id: ServerJobId,
    record: ServerRecord,
    spec: ServerSpec,
    /// The node's metrics, for the server-level requests.
    engine: Context,
    /// The connection options (auth, TLS, proxy, timeouts) of the source and target servers:
    /// those of the job's replications.
    source_options: ReplicationOptions,
    target_options: ReplicationOptions,
    /// The fair-share group (pseudo `_replicator` database) of its replications.
    group: String,
    /// The `_db_updates` sequence to follow from (`None`: from now).
    since: Option<Value>,
    /// Whether the source answers `_db_updates` (`None` until it answered once; CouchDB
    /// without its `_global_changes` database answers 404, pouchdb-server has none).
    db_updates: Option<bool>,
    /// The source has been listed at least once in this run.
    listed: bool,
    /// This node's replicator events: a replication of ours ending here starts a turn at
    /// once (ones ending on other nodes are seen at the next turn).
    events: Option<EventReceiver>,
    /// Renewed by every committed keep-alive update (`turn`).
    lease: Arc<Lease>,
}

impl ServerRun {
    /// Lists the source, adds and drops replications, aggregates progress and stores it
    /// (the keep-alive). True when a one-shot job is complete. `Err` when the lock is lost.
    async fn turn(&mut self) -> Result<bool, JobsError> {
        match self.list_source().await {
            Ok(names) => {
                self.listed = true;
                self.record.error = None;
                self.sync_dbs(&names).await;
            }
            Err(e) => {
                tracing::warn!(job = %self.job.id, error = %e, "cannot list the source");
                self.record.error = Some(e);
            }
        }
        self.refresh_progress().await;
        self.record.follows = self
            .db_updates
            .map(|d| if d { "_db_updates" } else { "_all_dbs" }.to_owned());
        self.record.last_updated = self.rep.ctx.now_secs();
        let began = Instant::now();
        self.job = self
            .rep
            .jobs()
            .update(&self.job, Some(self.record.to_data()))
            .await?;
        self.lease.renew(began);
        Ok(self.listed
            && !self.spec.continuous()
            && self.record.dbs.values().all(|d| d.state.is_terminal()))
    }

    /// The source's database names that match the job.
    async fn list_source(&self) -> Result<BTreeSet<String>, String> {
        let names = server::all_dbs(&self.spec.source, &self.engine, &self.source_options)
            .await
            .map_err(|e| format!("GET _all_dbs: {e}"))?;
        Ok(names.into_iter().filter(|n| self.spec.matches(n)).collect())
    }

    /// Adds a replication for every new database, drops those of deleted ones.
    async fn sync_dbs(&mut self, names: &BTreeSet<String>) {
        let gone: Vec<String> = self
            .record
            .dbs
            .keys()
            .filter(|n| !names.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.source_deleted(&name).await;
        }
        let new: Vec<String> = names
            .iter()
            .filter(|n| !self.record.dbs.contains_key(*n))
            .cloned()
            .collect();
        let this = &*self;
        let added: Vec<(String, DbProgress)> = futures::stream::iter(new)
            .map(|name: String| async move {
                let p = this.add_db(&name).await;
                (name, p)
            })
            .buffer_unordered(ADD_CONCURRENCY)
            .collect()
            .await;
        self.record.dbs.extend(added);
    }

    /// Adds (or finds) database `name`'s replication.
    async fn add_db(&self, name: &str) -> DbProgress {
        let job_id = persistent_job_id(&self.group, name);
        let new = NewJob::from_body(db_job_kind(&self.id, name), self.spec.db_body(name));
        let state = match self.rep.add(new).await {
            Ok(v) => v.state,
            Err(e) => {
                tracing::warn!(job = %self.job.id, db = %name, error = %e, "cannot add");
                RepState::Failed
            }
        };
        DbProgress {
            job_id,
            state,
            ..DbProgress::default()
        }
    }

    /// The source database `name` is gone: stop its replication and, when asked, delete the
    /// target database.
    async fn source_deleted(&mut self, name: &str) {
        tracing::info!(job = %self.job.id, db = %name, "source database deleted");
        if let Some(p) = self.record.dbs.remove(name)
            && let Err(e) = self.rep.cancel(&p.job_id).await
        {
            tracing::debug!(db = %name, error = %e, "replication already gone");
        }
        if self.spec.delete_target_on_source_delete {
            let (target, opts) = (&self.spec.target, &self.target_options);
            if let Err(e) = server::delete_db(target, name, &self.engine, opts).await {
                tracing::warn!(db = %name, error = %e, "cannot delete target");
            }
        }
    }

    /// Reads every owned replication's state and counters; re-adds one that disappeared.
    async fn refresh_progress(&mut self) {
        let Ok(jobs) = self.rep.list().await else {
            return;
        };
        let mut seen = BTreeSet::new();
        for j in jobs
            .into_iter()
            .filter(|j| j.database.as_deref() == Some(self.group.as_str()))
        {
            let Some(p) = j.doc_id.as_ref().and_then(|d| self.record.dbs.get_mut(d)) else {
                continue;
            };
            seen.insert(j.job_id.clone());
            p.state = j.state;
            if let Some(s) = &j.stats {
                p.docs_read = s.docs_read;
                p.docs_written = s.docs_written;
                p.doc_write_failures = s.doc_write_failures;
            }
        }
        let missing: Vec<String> = self
            .record
            .dbs
            .iter()
            .filter(|(_, p)| !seen.contains(&p.job_id) && p.state != RepState::Failed)
            .map(|(n, _)| n.clone())
            .collect();
        for name in missing {
            let progress = self.add_db(&name).await;
            self.record.dbs.insert(name, progress);
        }
    }

    /// Waits for a database event on the source, or for one of the run's replications to
    /// end on this node.
    async fn wait_for_changes(&mut self) {
        if self.events.is_none() {
            self.events = self.rep.subscribe();
        }
        let mut events = self.events.take();
        let ours = format!("{}|", self.group);
        let ended = tokio::select! {
            _ = self.wait_for_source() => false,
            _ = replication_ended(&mut events, &ours) => true,
        };
        if ended {
            tokio::time::sleep(END_DEBOUNCE).await;
            if let Some(rx) = events.as_mut() {
                while rx.try_recv().is_ok() {}
            }
        }
        self.events = events;
    }

    /// Waits for a database event on the source (`_db_updates` longpoll) or, without
    /// `_db_updates`, one poll period.
    async fn wait_for_source(&mut self) {
        if self.db_updates == Some(false) {
            return tokio::time::sleep(POLL).await;
        }
        let longpoll = MAX_LONGPOLL
            .min(self.rep.settings().job_timeout / 3)
            .max(POLL);
        let (source, opts) = (&self.spec.source, &self.source_options);
        let since = self.since.as_ref();
        match server::db_updates(source, since, longpoll, &self.engine, opts).await {
            Ok(DbUpdates::Since(seq)) => {
                self.db_updates = Some(true);
                if !seq.is_null() {
                    self.since = Some(seq);
                }
            }
            Ok(DbUpdates::Missing) => {
                tracing::info!(job = %self.job.id, "no _db_updates on the source: polling _all_dbs");
                self.db_updates = Some(false);
                tokio::time::sleep(POLL).await;
            }
            Err(e) => {
                tracing::debug!(job = %self.job.id, error = %e, "_db_updates failed");
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// The run lost its lock. If the server job was removed (cancelled), this run may have
    /// added replications after the canceller removed the job's replications: remove them
    /// again. If another worker holds it now, that worker owns them.
    async fn stopped(self) {
        if !matches!(
            self.rep.server_job(&self.id).await,
            Err(crate::replicator::error::ReplicatorError::ServerJobNotFound(_))
        ) {
            return;
        }
        if let Err(e) = self.rep.cancel_server_replications(&self.id).await {
            tracing::warn!(job = %self.job.id, error = %e, "cannot remove replications");
        }
    }

    /// A one-shot job whose databases all ended: finish it with its final progress.
    async fn complete(mut self) {
        self.record.state = ServerState::Completed;
        self.record.node = None;
        self.record.last_updated = self.rep.ctx.now_secs();
        let data = self.record.to_data();
        match self.rep.jobs().finish(&self.job, Some(data)).await {
            Ok(()) => tracing::info!(job = %self.job.id, dbs = self.record.dbs.len(),
                "server job completed"),
            Err(e) => tracing::warn!(job = %self.job.id, error = %e, "cannot finish"),
        }
    }
}

/// Returns once a replication whose job id starts with `prefix` finished or failed; never
/// while there is no event subscription (the bus restarting drops it).
async fn replication_ended(events: &mut Option<EventReceiver>, prefix: &str) {
    loop {
        let Some(rx) = events.as_mut() else {
            return std::future::pending().await;
        };
        match rx.recv().await {
            Some(
                ReplicatorEvent::Finished { job_id, .. } | ReplicatorEvent::Failed { job_id, .. },
            ) if job_id.as_str().starts_with(prefix) => {
                return;
            }
            Some(_) => {}
            None => *events = None,
        }
    }
}
