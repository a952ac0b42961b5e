//! The steps transitions, each one store transaction (run inside [`Db::run`]):
//!
//! - submit: write the document and enqueue step 0 in its target's queue;
//! - take: dequeue the most urgent step of a worker's queues (couch_jobs `accept`) and mark
//!   it running in the document, in the same commit;
//! - finish: `finish` the step (fenced by the couch_jobs lock: a worker that lost its step
//!   gets [`StepsError::Halt`] and nothing is written), record the result and enqueue the
//!   next step in the same commit, so no step is skipped, repeated or reordered even when a
//!   node dies between steps.
//!
//! [`Db::run`]: crate::store::Db::run

use crate::jobs::{AcceptOpts, Job, Jobs};
use crate::store::{Tx, Watch};

use super::error::{StepsError, StepsResult};
use super::execute::StepResult;
use super::keys::{StepsKeys, parse_queue_entry, queue_entry, queue_type};
use super::model::{Executor, JobDoc, JobOutcome, StepStatus};

/// The queue key (couch_jobs scheduled time) of `step`: jobs with more steps left sort
/// first, aged by `weight` seconds per step (see `StepsConfig::priority_step_secs`).
pub fn step_stime(doc: &JobDoc, step: usize, weight: i64) -> i64 {
    let remaining = i64::try_from(doc.steps.len().saturating_sub(step)).unwrap_or(i64::MAX);
    doc.created_at
        .div_euclid(1000)
        .saturating_sub(remaining.saturating_mul(weight))
}

/// Reads a document; a corrupt one is an error naming the job.
pub async fn read_doc(
    keys: &StepsKeys,
    tx: &Tx,
    id: &str,
    snapshot: bool,
) -> StepsResult<Option<JobDoc>> {
    match tx.get(&keys.doc(id), snapshot).await? {
        None => Ok(None),
        Some(bytes) => JobDoc::decode(&bytes)
            .map(Some)
            .map_err(|e| StepsError::Corrupt {
                id: id.to_string(),
                reason: e.to_string(),
            }),
    }
}

/// Writes (replaces) `doc` under its id in the caller's transaction.
pub fn write_doc(keys: &StepsKeys, tx: &Tx, doc: &JobDoc) {
    tx.set(&keys.doc(&doc.id), &doc.encode());
}

/// Writes a new job and enqueues its first step.
pub async fn submit_tx(
    jobs: &Jobs,
    keys: &StepsKeys,
    tx: &Tx,
    doc: &JobDoc,
    weight: i64,
) -> StepsResult<()> {
    let first = doc
        .steps
        .first()
        .ok_or(StepsError::Spec(super::error::SpecError::NoSteps))?;
    write_doc(keys, tx, doc);
    jobs.add_tx(
        tx,
        &queue_type(&first.target),
        &doc.id,
        queue_entry(&doc.id, 0),
        step_stime(doc, 0, weight),
    )
    .await?;
    Ok(())
}

/// What a take attempt found.
pub enum Taken {
    /// A step to run: the couch_jobs lock, its queue and the document as written.
    Step {
        /// The couch_jobs job, holding the worker's lock.
        job: Job,
        /// The couch_jobs type (queue) the step was taken from.
        queue: String,
        /// The index of the step to run.
        step: usize,
        /// The job document with the step marked running.
        doc: JobDoc,
    },
    /// A queue entry that no longer matched its document was removed.
    Dropped {
        /// The job id of the dropped entry.
        id: String,
        /// Why the entry did not match (document gone or unreadable, job finished, another step
        /// or queue).
        reason: String,
    },
    /// Nothing eligible; the watches fire when one of the queues gets a step.
    Empty(Vec<Watch>),
}

/// Takes the most urgent step (smallest queue key) of `queues` and marks it running.
pub async fn take_step_tx(
    jobs: &Jobs,
    keys: &StepsKeys,
    tx: &Tx,
    queues: &[String],
    who: &Executor,
    now_ms: i64,
) -> StepsResult<Taken> {
    let mut best: Option<(i64, &String)> = None;
    for q in queues {
        if let Some((stime, _)) = jobs.pending_head_tx(tx, q).await?
            && best.is_none_or(|(s, _)| stime < s)
        {
            best = Some((stime, q));
        }
    }
    let Some((stime, queue)) = best else {
        let watches = queues
            .iter()
            .map(|q| jobs.watch_pending_tx(tx, q))
            .collect();
        return Ok(Taken::Empty(watches));
    };
    // Only keys at the head's time are eligible, so the random pick among candidates keeps
    // the priority order.
    let opts = AcceptOpts::default().max_sched_time(stime);
    let Some((job, data)) = jobs.accept_tx(tx, queue, opts).await? else {
        let watches = vec![jobs.watch_pending_tx(tx, queue)];
        return Ok(Taken::Empty(watches));
    };
    let problem = match parse_queue_entry(&data) {
        None => Err("queue entry is not a steps entry".to_string()),
        Some((id, _)) if id != job.id => Err(format!("queue entry names job {id}")),
        Some((_, step)) => match read_doc(keys, tx, &job.id, false).await {
            Err(e) => Err(e.to_string()),
            Ok(None) => Err("job document is gone".to_string()),
            Ok(Some(doc)) => check_entry(&doc, step, queue).map(|()| (doc, step)),
        },
    };
    match problem {
        Err(reason) => {
            jobs.finish_tx(tx, &job, None).await?;
            jobs.remove_tx(tx, queue, &job.id).await?;
            Ok(Taken::Dropped {
                id: job.id.clone(),
                reason,
            })
        }
        Ok((mut doc, step)) => {
            let s = &mut doc.steps[step];
            s.status = StepStatus::Running;
            s.executor = Some(who.clone());
            s.started_at = Some(now_ms);
            s.runs = s.runs.saturating_add(1);
            write_doc(keys, tx, &doc);
            Ok(Taken::Step {
                job,
                queue: queue.clone(),
                step,
                doc,
            })
        }
    }
}

/// A queue entry is valid when its job is still running that very step in that queue.
fn check_entry(doc: &JobDoc, step: usize, queue: &str) -> Result<(), String> {
    if doc.status.is_some() {
        return Err("job already finished".into());
    }
    if doc.current_step != step {
        return Err(format!(
            "entry for step {step}, job is at step {}",
            doc.current_step
        ));
    }
    match doc.steps.get(step) {
        Some(s) if queue_type(&s.target) == queue => Ok(()),
        Some(s) => Err(format!(
            "step {step} targets {}, found in {queue}",
            s.target
        )),
        None => Err(format!("no step {step}")),
    }
}

/// How a finish went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// The next step is queued.
    Next(usize),
    /// The job is done.
    Done(JobOutcome),
}

/// Records `result` for `step` and moves the job on, fenced by the step's lock.
#[allow(clippy::too_many_arguments)]
pub async fn finish_step_tx(
    jobs: &Jobs,
    keys: &StepsKeys,
    tx: &Tx,
    job: &Job,
    queue: &str,
    step: usize,
    result: &StepResult,
    now_ms: i64,
    weight: i64,
) -> StepsResult<Finished> {
    // The fence first: if another worker owns the step now, nothing below is written.
    jobs.finish_tx(tx, job, None).await?;
    let mut doc = read_doc(keys, tx, &job.id, false)
        .await?
        .ok_or_else(|| StepsError::NotFound(job.id.clone()))?;
    check_entry(&doc, step, queue).map_err(|reason| StepsError::Corrupt {
        id: job.id.clone(),
        reason,
    })?;
    let s = &mut doc.steps[step];
    s.finished_at = Some(now_ms);
    s.attempts = result.attempts;
    s.exit_status = result.exit_status;
    s.output = result.output.clone();
    s.alt_exit_status = result.alt_exit_status;
    s.alt_output = result.alt_output.clone();
    s.error = result.error.clone();
    s.status = if result.succeeded {
        StepStatus::Succeeded
    } else {
        StepStatus::Failed
    };
    let next = step + 1;
    let outcome = if result.succeeded && next < doc.steps.len() {
        doc.current_step = next;
        doc.steps[next].status = StepStatus::Pending;
        let next_queue = queue_type(&doc.steps[next].target);
        if next_queue != queue {
            jobs.remove_tx(tx, queue, &job.id).await?;
        }
        // In the same queue this re-enqueues the finished couch_jobs job.
        jobs.add_tx(
            tx,
            &next_queue,
            &job.id,
            queue_entry(&job.id, next),
            step_stime(&doc, next, weight),
        )
        .await?;
        Finished::Next(next)
    } else {
        jobs.remove_tx(tx, queue, &job.id).await?;
        let outcome = if result.succeeded {
            doc.current_step = doc.steps.len();
            JobOutcome::Success
        } else {
            for later in &mut doc.steps[next..] {
                later.status = StepStatus::Skipped;
            }
            JobOutcome::Failed
        };
        doc.status = Some(outcome);
        doc.finished_at = Some(now_ms);
        Finished::Done(outcome)
    };
    write_doc(keys, tx, &doc);
    Ok(outcome)
}
