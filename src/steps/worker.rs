//! One step worker (the thesis' "worker", with its work manager's job folded in): takes the
//! most urgent step of its node's queues, runs it while calling couch_jobs `update` so the
//! activity monitor keeps it, and finishes it in the transaction that queues the next step.
//!
//! Takes: nothing but a shutdown signal; it stops between steps once asked. A worker that
//! loses its step lock (the activity monitor re-enqueued the step, e.g. after a stall)
//! drops the running command and writes nothing.

use std::sync::Arc;

use futures::future::select_all;
use tokio::sync::watch;

use crate::jobs::{Job, JobsError};

use super::action::Action;
use super::api::Steps;
use super::error::{StepsError, StepsResult};
use super::execute::{RunIdentity, StepResult, run_step};
use super::keys::node_queues;
use super::model::{Executor, JobDoc};
use super::txn::{Finished, Taken, finish_step_tx, take_step_tx};

/// Everything a worker needs.
#[derive(Clone)]
pub struct WorkerCtx {
    /// The node's steps handle: queues, documents and settings.
    pub steps: Steps,
    /// What runs each step's command.
    pub action: Arc<dyn Action>,
    /// `<node>/<index>`.
    pub worker: String,
}

/// Runs until `shutdown` turns true (checked between steps). Returns an error only for
/// failures the supervisor should see (store broken, ...).
pub async fn run_worker(ctx: WorkerCtx, mut shutdown: watch::Receiver<bool>) -> StepsResult<()> {
    let steps = &ctx.steps;
    let queues = node_queues(steps.node());
    let who = Executor {
        node: steps.node().to_string(),
        worker: ctx.worker.clone(),
    };
    let (jobs, keys) = (steps.jobs(), steps.keys());
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        let now = steps.now_ms();
        let taken = jobs
            .db()
            .run(|tx| {
                let (queues, who) = (&queues, &who);
                async move { take_step_tx(jobs, keys, &tx, queues, who, now).await }
            })
            .await?;
        match taken {
            Taken::Empty(watches) => {
                tokio::select! {
                    _ = select_all(watches) => {}
                    _ = tokio::time::sleep(steps.config().idle_recheck) => {}
                    _ = shutdown.changed() => {}
                }
            }
            Taken::Dropped { id, reason } => {
                steps.stats().dropped();
                tracing::warn!(job = %id, %reason, "dropped a stale steps queue entry");
            }
            Taken::Step {
                job,
                queue,
                step,
                doc,
            } => {
                steps.stats().accept();
                run_accepted(&ctx, job, &queue, step, &doc).await?;
            }
        }
    }
}

/// Runs an accepted step with keep-alives, then finishes it.
async fn run_accepted(
    ctx: &WorkerCtx,
    job: Job,
    queue: &str,
    step: usize,
    doc: &JobDoc,
) -> StepsResult<()> {
    let steps = &ctx.steps;
    let Some(step_doc) = doc.steps.get(step) else {
        return Err(StepsError::Corrupt {
            id: doc.id.clone(),
            reason: format!("no step {step}"),
        });
    };
    let who = RunIdentity {
        job_id: doc.id.clone(),
        step,
        node: steps.node().to_string(),
        worker: ctx.worker.clone(),
    };
    tracing::debug!(job = %doc.id, step, worker = %ctx.worker, "step started");
    let Some((job, result)) = run_with_keepalive(ctx, job, step_doc, &who).await else {
        steps.stats().halt();
        tracing::info!(job = %doc.id, step, worker = %ctx.worker, "step lost to another worker while running");
        return Ok(());
    };
    let (jobs, keys) = (steps.jobs(), steps.keys());
    let now = steps.now_ms();
    let weight = steps.config().priority_step_secs;
    let finished =
        jobs.db()
            .run(|tx| {
                let (job, result) = (&job, &result);
                async move {
                    finish_step_tx(jobs, keys, &tx, job, queue, step, result, now, weight).await
                }
            })
            .await;
    match finished {
        Ok(f) => {
            steps.stats().finish();
            match f {
                Finished::Next(n) => {
                    tracing::debug!(job = %doc.id, step, next = n, "step finished")
                }
                Finished::Done(o) => {
                    tracing::debug!(job = %doc.id, step, outcome = ?o, "job finished")
                }
            }
            Ok(())
        }
        Err(StepsError::Halt) => {
            steps.stats().halt();
            tracing::info!(job = %doc.id, step, worker = %ctx.worker, "step result discarded: lock lost before finish");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Runs the step, calling `update` every keep-alive period. `None` when the lock was lost.
async fn run_with_keepalive(
    ctx: &WorkerCtx,
    mut job: Job,
    step_doc: &super::model::StepDoc,
    who: &RunIdentity,
) -> Option<(Job, StepResult)> {
    let steps = &ctx.steps;
    let period = steps.config().keepalive();
    let exec = run_step(
        step_doc,
        ctx.action.as_ref(),
        who,
        steps.config().output_limit,
    );
    tokio::pin!(exec);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            result = &mut exec => return Some((job, result)),
            _ = ticker.tick() => match steps.jobs().update(&job, None).await {
                Ok(j) => {
                    job = j;
                    steps.stats().keepalive();
                }
                Err(JobsError::Halt) => return None,
                // A transient failure: the next tick tries again, well inside the timeout.
                Err(e) => tracing::warn!(job = %job.id, error = %e, "steps keep-alive failed"),
            },
        }
    }
}
