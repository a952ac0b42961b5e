//! The per-type activity monitor (CouchDB's couch_jobs_activity_monitor.erl): re-enqueues jobs whose worker stopped calling
//! `update`.
//!
//! Checks run `n` times per type timeout (`activity_monitor_checks_per_timeout`, + jitter).
//! Each check remembers the type's activity watch versionstamp `VS`; the check `n` checks
//! later (at least one whole timeout later) re-enqueues every job whose ACTIVITY key is still
//! `≤ VS` (not touched for a whole timeout) as pending with its data kept, in AIMD-sized
//! batches, then bumps the activity watch. A dead worker's job is therefore re-enqueued
//! between 1 and `1 + 1/n` timeouts (+ jitter) after its last update, and the old worker
//! gets `Halt`. CouchDB checks once per timeout (`n = 1`: 1-2 timeouts); we default to
//! `n = 2` so that a lost node's jobs run again within 2 timeouts including the accept.
//! [`ActivityMonitor::check_once`] is one check; [`MonitorActor`] runs checks on a timer
//! (messages `Check`, `Observe`).

use std::collections::VecDeque;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rand::Rng;
use supervisors::Observable;

use crate::store::tuple::Versionstamp;
use crate::store::{Db, RangeOptions, StoreError};

use super::Jobs;
use super::config::{BatchSize, JobsConfig};
use super::error::{JobsError, JobsResult, background_retryable};
use super::job_data::{JobState, decode_activity};
use super::keys::Keys;
use super::lifecycle::{bump_activity_watch, enqueue, get_row, get_type_timeout};

/// Poll interval while the type has no timeout.
pub(crate) const NO_TIMEOUT_POLL: Duration = Duration::from_millis(5000);

/// Give up a check (and try again next period) after this many shrinking retries.
const MAX_BATCH_FAILURES: u32 = 30;

/// The monitor's state and logic for one type.
pub struct ActivityMonitor {
    db: Db,
    keys: Keys,
    ty: String,
    max_jitter_ms: u64,
    checks: usize,
    batch: BatchSize,
    timeout_secs: Option<i64>,
    /// The versionstamps of the last `checks` checks, oldest first.
    seen: VecDeque<Versionstamp>,
    /// Checks run and jobs re-enqueued since this monitor started.
    checked: u64,
    requeued: u64,
}

/// What one batch did.
struct BatchOutcome {
    scanned: usize,
    requeued: usize,
}

impl ActivityMonitor {
    /// A monitor for type `ty` with batch sizing and jitter from `config`; it learns the type's
    /// timeout on its first check.
    pub fn new(db: Db, keys: Keys, ty: &str, config: &JobsConfig) -> Self {
        Self {
            db,
            keys,
            ty: ty.to_string(),
            max_jitter_ms: config.activity_monitor_max_jitter.as_millis() as u64,
            checks: config.activity_monitor_checks_per_timeout.max(1) as usize,
            batch: BatchSize::new(
                config.activity_monitor_init_batch_size,
                config.activity_monitor_batch_increment,
                config.activity_monitor_batch_factor,
            ),
            timeout_secs: None,
            seen: VecDeque::new(),
            checked: 0,
            requeued: 0,
        }
    }

    /// The current AIMD batch size.
    #[cfg(any(test, feature = "internals"))]
    pub fn batch_size(&self) -> usize {
        self.batch.size
    }

    /// What an operator wants to know of this monitor.
    pub fn observe(&self) -> MonitorObservation {
        MonitorObservation {
            job_type: self.ty.clone(),
            timeout_secs: self.timeout_secs,
            checks_per_timeout: self.checks,
            remembered: self.seen.len(),
            batch_size: self.batch.size,
            checks: self.checked,
            requeued: self.requeued,
        }
    }

    /// Reads the type timeout and returns the delay until the next check: `timeout / n` +
    /// uniform jitter in `1..=max(1, min(timeout/2n, max_jitter))` ms, or 5 s while no timeout
    /// is set. A changed timeout forgets the remembered versionstamps.
    pub async fn schedule(&mut self) -> JobsResult<Duration> {
        let (keys, ty) = (&self.keys, self.ty.as_str());
        let timeout = self
            .db
            .run(|tx| async move { get_type_timeout(keys, &tx, ty).await })
            .await?;
        if timeout != self.timeout_secs {
            self.seen.clear();
            self.timeout_secs = timeout;
        }
        let Some(secs) = timeout else {
            return Ok(NO_TIMEOUT_POLL);
        };
        let ms = secs.max(0) as u64 * 1000 / self.checks as u64;
        let bound = (ms / 2).min(self.max_jitter_ms).max(1);
        let jitter = rand::rng().random_range(1..=bound);
        Ok(Duration::from_millis(ms + jitter))
    }

    /// One check: the first `n` only remember the activity watch's versionstamp; later ones
    /// re-enqueue jobs not active since the check `n` checks ago. Returns how many were
    /// re-enqueued.
    pub async fn check_once(&mut self) -> JobsResult<usize> {
        let requeued = match self.seen.front().cloned() {
            Some(vs) if self.seen.len() >= self.checks => self.reenqueue_upto(&vs).await?,
            _ => 0,
        };
        let vs = self.read_watch_vs().await?;
        self.seen.push_back(vs);
        while self.seen.len() > self.checks {
            self.seen.pop_front();
        }
        self.checked += 1;
        self.requeued += requeued as u64;
        Ok(requeued)
    }

    async fn read_watch_vs(&self) -> JobsResult<Versionstamp> {
        let (keys, ty) = (&self.keys, self.ty.as_str());
        self.db
            .run(|tx| async move {
                match tx.get(&keys.watches_activity(ty), false).await? {
                    Some(v) => keys.decode_watches_activity(&v),
                    // No activity was ever recorded: nothing can be older than this.
                    None => Ok(Versionstamp::complete([0; 10], 0)),
                }
            })
            .await
    }

    async fn reenqueue_upto(&mut self, vs: &Versionstamp) -> JobsResult<usize> {
        let mut total = 0;
        let mut failures = 0;
        loop {
            let limit = self.batch.size;
            let (keys, ty) = (&self.keys, self.ty.as_str());
            let outcome = self
                .db
                .run(|tx| async move { reenqueue_batch(keys, &tx, ty, vs, limit).await })
                .await;
            match outcome {
                Ok(BatchOutcome { scanned, requeued }) => {
                    total += requeued;
                    if scanned < limit {
                        return Ok(total);
                    }
                    self.batch.grow();
                }
                Err(JobsError::Store(e))
                    if matches!(e, StoreError::TooLarge(_)) || background_retryable(&e) =>
                {
                    failures += 1;
                    self.batch.shrink();
                    tracing::warn!(job_type = %self.ty, error = %e, batch = self.batch.size,
                        "activity monitor batch failed; possible overload");
                    if failures >= MAX_BATCH_FAILURES {
                        return Err(JobsError::Store(e));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Re-enqueues up to `limit` jobs whose ACTIVITY key is `≤ vs`, in one transaction.
async fn reenqueue_batch(
    keys: &Keys,
    tx: &crate::store::Tx,
    ty: &str,
    vs: &Versionstamp,
    limit: usize,
) -> JobsResult<BatchOutcome> {
    let (begin, end) = keys.activity_range_upto(ty, vs);
    // A serializable read: a worker's concurrent update clears one of these keys and so
    // makes this batch conflict and retry, instead of re-enqueueing a live job.
    let stale = tx
        .get_range(&begin, &end, RangeOptions::all().limit(limit))
        .await?;
    let mut requeued = 0;
    for kv in &stale {
        tx.clear(&kv.key);
        let key_vs = match keys.decode_activity_key(&kv.key) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(job_type = ty, error = %e, "removed corrupt activity key");
                continue;
            }
        };
        let id = match decode_activity(&kv.value) {
            Ok((id, _)) => id,
            Err(e) => {
                tracing::error!(job_type = ty, error = %e, "removed corrupt activity entry");
                continue;
            }
        };
        match get_row(keys, tx, ty, &id, false).await {
            Ok(Some(mut row))
                if row.state() == JobState::Running && row.running_vs() == Some(&key_vs) =>
            {
                tracing::info!(job_type = ty, job_id = %id, "re-enqueueing inactive job");
                enqueue(keys, tx, ty, &id, &mut row);
                requeued += 1;
            }
            Ok(_) => {}
            Err(JobsError::Encoding(e)) => {
                tracing::error!(job_type = ty, job_id = %id, error = %e, "corrupt job row left alone");
            }
            Err(e) => return Err(e),
        }
    }
    if !stale.is_empty() {
        bump_activity_watch(keys, tx, ty);
    }
    Ok(BatchOutcome {
        scanned: stale.len(),
        requeued,
    })
}

/// Messages of the monitor actor.
pub enum MonitorMsg {
    /// Run a check, then schedule the next one.
    Check,
    /// The monitor's state.
    Observe(RpcReplyPort<MonitorObservation>),
}

/// What [`MonitorMsg::Observe`] answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MonitorObservation {
    /// The job type.
    pub job_type: String,
    /// The type's activity timeout as last read (`None`: no timeout, no checks).
    pub timeout_secs: Option<i64>,
    /// Checks per timeout.
    pub checks_per_timeout: usize,
    /// Activity versionstamps remembered (checks re-enqueue once this reaches
    /// `checks_per_timeout`).
    pub remembered: usize,
    /// The current AIMD batch size.
    pub batch_size: usize,
    /// Completed checks since this monitor started.
    pub checks: u64,
    /// Jobs re-enqueued since this monitor started.
    pub requeued: u64,
}

impl Observable for MonitorMsg {
    type Observation = MonitorObservation;
    fn observe(reply: RpcReplyPort<MonitorObservation>) -> Self {
        Self::Observe(reply)
    }
}

/// The activity monitor actor for one type.
pub struct MonitorActor;

impl Actor for MonitorActor {
    type Msg = MonitorMsg;
    type State = ActivityMonitor;
    type Arguments = (Jobs, String);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (jobs, ty): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut monitor =
            ActivityMonitor::new(jobs.db().clone(), jobs.keys().clone(), &ty, jobs.config());
        let delay = monitor.schedule().await.unwrap_or(NO_TIMEOUT_POLL);
        myself.send_after(delay, || MonitorMsg::Check);
        Ok(monitor)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        monitor: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let MonitorMsg::Observe(reply) = msg {
            let _ = reply.send(monitor.observe());
            return Ok(());
        }
        if monitor.timeout_secs.is_some() {
            match monitor.check_once().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(job_type = %monitor.ty, requeued = n, "activity check"),
                Err(JobsError::Store(e))
                    if background_retryable(&e) || matches!(e, StoreError::TooLarge(_)) =>
                {
                    tracing::warn!(job_type = %monitor.ty, error = %e, "activity check skipped");
                }
                Err(e) => return Err(e.into()),
            }
        }
        let delay = match monitor.schedule().await {
            Ok(d) => d,
            Err(JobsError::Store(e)) if background_retryable(&e) => NO_TIMEOUT_POLL,
            Err(e) => return Err(e.into()),
        };
        myself.send_after(delay, || MonitorMsg::Check);
        Ok(())
    }
}
