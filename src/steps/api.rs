//! The library API of steps jobs, for hosts and the HTTP layer: [`Steps`] submits a job
//! (returning its id), gets one job with per-step status, lists jobs with their state, and
//! waits for a job to end.
//!
//! The state shown comes from the document and, for a job in progress, from couch_jobs:
//! a step whose worker died reads `pending` again as soon as the activity monitor has
//! re-enqueued it, even though its document still names the dead executor.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
#[cfg(any(test, feature = "internals"))]
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::jobs::{JobState, Jobs, JobsError};
use crate::store::{RangeOptions, Tx};

use super::config::StepsConfig;
use super::error::{SpecError, StepsError, StepsResult};
use super::keys::{StepsKeys, queue_type};
use super::model::{JobDoc, JobOutcome, JobSpec, StepStatus, Target, validate_node_name};
use super::stats::WriteStats;
use super::txn::{read_doc, submit_tx};

/// The state of a steps job as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepsState {
    /// Its current step waits in its target's queue (for a node that may not exist yet).
    Pending,
    /// A worker runs its current step.
    Running,
    /// Every step succeeded.
    Success,
    /// A step failed; the rest were skipped.
    Failed,
}

/// One job with per-step status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    /// The job's state, from its document and couch_jobs.
    pub state: StepsState,
    /// The stored document (flattened into the JSON view).
    #[serde(flatten)]
    pub doc: JobDoc,
}

/// One line of a job listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSummary {
    /// The job's id.
    pub id: String,
    /// The job's state.
    pub state: StepsState,
    /// The node whose API created the job.
    pub creator: String,
    /// UNIX milliseconds of creation.
    pub created_at: i64,
    /// UNIX milliseconds when the job ended, if it has.
    pub finished_at: Option<i64>,
    /// Index of the step to run next (the step count once done).
    pub current_step: usize,
    /// How many steps the job has.
    pub step_count: usize,
    /// The target of the current step, while the job is in progress.
    pub current_target: Option<Target>,
}

/// Which jobs to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOptions {
    /// Only jobs in this state.
    pub state: Option<StepsState>,
    /// Continue after this job id (the `next` of a previous page).
    pub start_after: Option<String>,
    /// At most this many jobs.
    pub limit: usize,
}

impl Default for ListOptions {
    fn default() -> Self {
        Self {
            state: None,
            start_after: None,
            limit: 100,
        }
    }
}

/// A page of jobs, in id order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobList {
    /// The jobs of this page.
    pub jobs: Vec<JobSummary>,
    /// Pass as `start_after` for the next page; `None` at the end.
    pub next: Option<String>,
}

/// Documents read per transaction while listing.
const LIST_PAGE: usize = 200;

/// The steps job type on one node: cheap to clone, shared by the API and the node's workers.
#[derive(Clone)]
pub struct Steps {
    inner: Arc<Inner>,
}

struct Inner {
    jobs: Jobs,
    node: String,
    config: StepsConfig,
    keys: StepsKeys,
    stats: Arc<WriteStats>,
    /// Queue types known to have their activity timeout.
    queues_ready: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("node", &self.inner.node)
            .finish()
    }
}

impl Steps {
    /// The steps job type for node `node` (the creator of jobs submitted here, and the
    /// queue its workers serve).
    pub fn new(jobs: Jobs, node: &str, config: StepsConfig) -> Result<Self, SpecError> {
        Self::with_stats(jobs, node, config, Arc::default())
    }

    /// As [`Steps::new`], counting writes into `stats` (shared by several nodes in tests
    /// and benchmarks).
    pub fn with_stats(
        jobs: Jobs,
        node: &str,
        config: StepsConfig,
        stats: Arc<WriteStats>,
    ) -> Result<Self, SpecError> {
        validate_node_name(node).map_err(|reason| SpecError::BadNodeName {
            name: node.to_string(),
            reason,
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                keys: StepsKeys::new(&config.prefix),
                jobs,
                node: node.to_string(),
                config,
                stats,
                queues_ready: Mutex::default(),
            }),
        })
    }

    /// The node this handle runs on: the creator of jobs submitted here.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The couch_jobs handle the steps queues live in.
    pub fn jobs(&self) -> &Jobs {
        &self.inner.jobs
    }

    /// The steps settings of this node.
    pub fn config(&self) -> &StepsConfig {
        &self.inner.config
    }

    /// The key layout of the steps documents.
    pub fn keys(&self) -> &StepsKeys {
        &self.inner.keys
    }

    /// Write counters of this node (shared when built with [`Steps::with_stats`]).
    pub fn stats(&self) -> &Arc<WriteStats> {
        &self.inner.stats
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.inner.jobs.clock().now_ms()
    }

    /// Makes sure the queue of `target` has its couch_jobs activity timeout (needed before
    /// anything is enqueued there). Writes only the first time a queue is seen.
    pub async fn ensure_queue(&self, target: &Target) -> StepsResult<()> {
        let ty = queue_type(target);
        let ready = |set: &HashSet<String>| set.contains(&ty);
        if self.inner.queues_ready.lock().is_ok_and(|s| ready(&s)) {
            return Ok(());
        }
        if self.inner.jobs.get_type_timeout(&ty).await?.is_none() {
            self.inner
                .jobs
                .set_type_timeout(&ty, self.inner.config.activity_timeout_secs)
                .await?;
            self.inner.stats.queue_setup();
        }
        if let Ok(mut set) = self.inner.queues_ready.lock() {
            set.insert(ty);
        }
        Ok(())
    }

    /// Validates and stores a job; its first step is queued at once. Returns the job id.
    pub async fn submit(&self, spec: JobSpec) -> StepsResult<String> {
        let targets = spec.validate()?;
        for t in targets.iter().collect::<HashSet<_>>() {
            self.ensure_queue(t).await?;
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let doc = JobDoc::new(
            id.clone(),
            self.inner.node.clone(),
            self.now_ms(),
            spec,
            targets,
        );
        let weight = self.inner.config.priority_step_secs;
        let (jobs, keys) = (&self.inner.jobs, &self.inner.keys);
        jobs.db()
            .run(|tx| {
                let doc = &doc;
                async move { submit_tx(jobs, keys, &tx, doc, weight).await }
            })
            .await?;
        self.inner.stats.submit();
        tracing::debug!(job = %id, node = %self.inner.node, "steps job submitted");
        Ok(id)
    }

    /// One job with per-step status.
    pub async fn get(&self, id: &str) -> StepsResult<JobView> {
        self.inner
            .jobs
            .db()
            .run(|tx| async move { self.view_tx(&tx, id).await })
            .await
    }

    async fn view_tx(&self, tx: &Tx, id: &str) -> StepsResult<JobView> {
        let doc = read_doc(&self.inner.keys, tx, id, true)
            .await?
            .ok_or_else(|| StepsError::NotFound(id.to_string()))?;
        self.view_of(tx, doc).await
    }

    async fn view_of(&self, tx: &Tx, mut doc: JobDoc) -> StepsResult<JobView> {
        let state = match doc.status {
            Some(JobOutcome::Success) => StepsState::Success,
            Some(JobOutcome::Failed) => StepsState::Failed,
            None => {
                let step = doc.current_step;
                let Some(current) = doc.steps.get_mut(step) else {
                    return Err(StepsError::Corrupt {
                        id: doc.id.clone(),
                        reason: "current step out of range".into(),
                    });
                };
                let ty = queue_type(&current.target);
                match self.inner.jobs.get_job_state_tx(tx, &ty, &doc.id).await {
                    Ok(JobState::Running) => StepsState::Running,
                    // Re-enqueued after its worker died (the document still says running),
                    // or in the instant between finish and the next accept.
                    Ok(JobState::Pending | JobState::Finished) | Err(JobsError::NotFound) => {
                        current.status = StepStatus::Pending;
                        StepsState::Pending
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        };
        Ok(JobView { state, doc })
    }

    /// Jobs in id order, optionally only those in one state.
    pub async fn list(&self, opts: ListOptions) -> StepsResult<JobList> {
        let limit = opts.limit.max(1);
        let mut out = Vec::new();
        let mut after = opts.start_after.clone();
        loop {
            let (page, full) = self
                .inner
                .jobs
                .db()
                .run(|tx| {
                    let after = after.clone();
                    async move { self.list_page_tx(&tx, after.as_deref()).await }
                })
                .await?;
            let mut last = None;
            for view in page {
                last = Some(view.doc.id.clone());
                if opts.state.is_none_or(|s| s == view.state) {
                    out.push(summary(view));
                    if out.len() == limit {
                        let next = out.last().map(|s| s.id.clone());
                        return Ok(JobList { jobs: out, next });
                    }
                }
            }
            if !full {
                return Ok(JobList {
                    jobs: out,
                    next: None,
                });
            }
            after = last;
        }
    }

    async fn list_page_tx(
        &self,
        tx: &Tx,
        after: Option<&str>,
    ) -> StepsResult<(Vec<JobView>, bool)> {
        let keys = &self.inner.keys;
        let (begin, end) = keys.doc_range(after);
        let rows = tx
            .get_range(
                &begin,
                &end,
                RangeOptions::all().snapshot().limit(LIST_PAGE),
            )
            .await?;
        let full = rows.len() == LIST_PAGE;
        let mut views = Vec::with_capacity(rows.len());
        for kv in rows {
            let id = keys.decode_doc_key(&kv.key).unwrap_or_default();
            let doc = JobDoc::decode(&kv.value).map_err(|e| StepsError::Corrupt {
                id,
                reason: e.to_string(),
            })?;
            views.push(self.view_of(tx, doc).await?);
        }
        Ok((views, full))
    }

    /// Waits until the job succeeds or fails (`None` on timeout), woken by changes of its
    /// document.
    #[cfg(any(test, feature = "internals"))]
    pub async fn wait_done(&self, id: &str, timeout: Duration) -> StepsResult<Option<JobView>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (view, watch) = self
                .inner
                .jobs
                .db()
                .run(|tx| async move {
                    let view = self.view_tx(&tx, id).await?;
                    let watch = tx.watch(&self.inner.keys.doc(id));
                    Ok::<_, StepsError>((view, watch))
                })
                .await?;
            if matches!(view.state, StepsState::Success | StepsState::Failed) {
                return Ok(Some(view));
            }
            match tokio::time::timeout_at(deadline, watch).await {
                Err(_) => return Ok(None),
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_retryable() => {}
                Ok(Err(e)) => return Err(e.into()),
            }
        }
    }
}

fn summary(view: JobView) -> JobSummary {
    let d = view.doc;
    JobSummary {
        current_target: d.current().map(|s| s.target.clone()),
        id: d.id,
        state: view.state,
        creator: d.creator,
        created_at: d.created_at,
        finished_at: d.finished_at,
        current_step: d.current_step,
        step_count: d.steps.len(),
    }
}
