//! A running replication: opens the endpoints (CouchDB's couch_replicator_scheduler_job.erl start-up), finds the start sequence, then runs the
//! pipeline — the changes reader running ahead, workers each taking a batch (as many at once as
//! the adaptive window allows: `worker_processes` at first, up to `http_connections`, see
//! [`crate::replication::pipeline::in_flight::InFlight`]) through `_revs_diff` → `_bulk_get` (+ a multipart one for small attachments, + individual
//! fetches) → `_bulk_docs` and multipart PUTs, so source reads and target writes overlap — and checkpoints on a timer at the through-sequence, which never
//! passes a batch still in flight. Takes: [`start`] / [`replicate`]; a [`ReplicationHandle`]
//! gives stats snapshots, a progress stream, a checkpoint-then-stop request and the result.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::checkpoint::{Checkpointer, instance_start_of};
pub use super::context::Context;
pub(crate) use super::context::clients;
use super::fetch::BulkGetGate;
use super::revs_diff::DiffSkipper;
use super::shared::{Shared, Tracker, new_in_flight};
pub use super::start_up::compute_id;
pub(crate) use super::start_up::open_db;
use super::start_up::{Opened, open};
use super::stats::{Counters, ReplicationStats, unix_now};
use super::worker::worker;
use crate::replication::changes::reader::{Batch, ChangesReader};
use crate::replication::endpoint::database::Endpoint;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::id::rep_id::RepId;
use crate::replication::options::spec::ReplicationSpec;
use crate::replication::pipeline::in_flight::InFlightStats;
use crate::telemetry::{NodeMetrics, Series};

/// How soon after progress the stats snapshot is refreshed (and so how often at most).
const STATS_PERIOD: Duration = Duration::from_millis(250);

/// A replication started with [`start`].
pub struct ReplicationHandle {
    stop: watch::Sender<bool>,
    // The in-flight probe of the crate's tests and benches (`Self::in_flight`).
    #[cfg(any(test, feature = "internals"))]
    in_flight: Arc<Mutex<InFlightStats>>,
    stats: watch::Receiver<ReplicationStats>,
    task: Option<tokio::task::JoinHandle<Result<ReplicationStats>>>,
}

impl ReplicationHandle {
    /// The latest stats snapshot (at most 250 ms, `STATS_PERIOD`, old).
    #[cfg(any(test, feature = "internals"))]
    pub fn stats(&self) -> ReplicationStats {
        self.stats.borrow().clone()
    }

    /// A stream of stats snapshots.
    pub fn progress(&self) -> watch::Receiver<ReplicationStats> {
        self.stats.clone()
    }

    /// The pipeline window's statistics, as of the last batch done; the probe stays readable
    /// after [`Self::wait`].
    #[cfg(any(test, feature = "internals"))]
    pub fn in_flight(&self) -> Arc<Mutex<InFlightStats>> {
        self.in_flight.clone()
    }

    /// Asks the replication to write a checkpoint and stop; [`Self::wait`] then returns.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits for the end: a one-shot reaching the end of the feed, a stop, or an error.
    pub async fn wait(mut self) -> Result<ReplicationStats> {
        match self.task.take() {
            Some(t) => t
                .await
                .map_err(|e| ReplicationError::WorkerDied(e.to_string()))?,
            None => Err(ReplicationError::WorkerDied("already awaited".into())),
        }
    }
}

impl Drop for ReplicationHandle {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Starts a replication in the background.
pub fn start(spec: ReplicationSpec, ctx: Context) -> ReplicationHandle {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (stats_tx, stats_rx) = watch::channel(ReplicationStats::default());
    let in_flight = Arc::new(Mutex::new(InFlightStats::default()));
    // The caller's span (a job's) follows the replication into every task it spawns.
    let task = tokio::spawn(run(spec, ctx, stop_rx, stats_tx, in_flight.clone()).in_current_span());
    ReplicationHandle {
        stop: stop_tx,
        #[cfg(any(test, feature = "internals"))]
        in_flight,
        stats: stats_rx,
        task: Some(task),
    }
}

/// Runs a replication to its end (for a continuous one: until it fails).
#[cfg(any(test, feature = "internals"))]
pub async fn replicate(spec: ReplicationSpec, ctx: Context) -> Result<ReplicationStats> {
    start(spec, ctx).wait().await
}

/// Endpoints in stats are shown as CouchDB shows them: without credentials.
fn display(ep: &Endpoint) -> String {
    ep.couch_url()
}

/// The run: start-up, then the reader and workers under the run loop, then the final
/// checkpoint. Dropping it (the handle's abort) drops every task with it.
async fn run(
    spec: ReplicationSpec,
    ctx: Context,
    stop: watch::Receiver<bool>,
    stats_tx: watch::Sender<ReplicationStats>,
    in_flight_stats: Arc<Mutex<InFlightStats>>,
) -> Result<ReplicationStats> {
    let opened = open(&spec, &ctx).await?;
    let o = &spec.options;
    let Opened {
        src,
        tgt,
        src_info,
        keep_encoding,
        target,
        rep_id,
        checkpointer,
        start_point,
        first_changes,
    } = opened;
    tracing::info!(rep_id = %rep_id, source = %spec.source, target = %spec.target, since = %start_point.seq, "replication starting");
    let counters = Arc::new(Counters::default());
    if let Some(seed) = &start_point.seed {
        counters.seed(seed);
    }
    let base = ReplicationStats {
        replication_id: rep_id.clone(),
        source: display(&spec.source),
        target: display(&spec.target),
        continuous: o.continuous,
        user: spec.source.user().map(str::to_owned),
        source_seq: src_info.get("update_seq").cloned().unwrap_or(Value::Null),
        through_seq: start_point.seq.clone(),
        checkpointed_source_seq: start_point.seq.clone(),
        checkpoint_interval: o.checkpoint_interval.as_millis() as u64,
        started_on: unix_now(),
        ..Default::default()
    };
    let shared = Arc::new(Shared {
        src,
        tgt,
        spec: spec.clone(),
        counters,
        metrics: ctx.metrics.clone(),
        tracker: Mutex::new(Tracker::new(start_point.seq.clone())),
        skipper: Mutex::new(DiffSkipper::for_target(target)),
        bulk_get: Mutex::new(BulkGetGate::default()),
        keep_encoding,
        source_seq: Mutex::new(base.source_seq.clone()),
        moved: tokio::sync::Notify::new(),
        in_flight: Mutex::new(new_in_flight(o, ctx.in_flight_bytes, &src_info)),
        in_flight_moved: tokio::sync::Notify::new(),
        in_flight_stats,
    });
    let mut progress = Progress {
        shared: shared.clone(),
        base,
        checkpointer,
        stats_tx,
        metrics: ctx.metrics.clone(),
    };
    progress.publish();
    let src_instance = instance_start_of(&src_info);
    let tasks = spawn_tasks(&shared, &ctx, start_point.seq, src_instance, first_changes);
    supervise(&mut progress, tasks, stop, o.checkpoint_interval, &rep_id).await?;
    progress.finish(&rep_id).await
}

/// The reader and worker tasks, and the switch that tells the reader to stop.
struct Tasks {
    set: JoinSet<Result<()>>,
    reader_stop: watch::Sender<bool>,
}

/// Starts the changes reader (from `since`, on the source whose `instance_start_time` is
/// `src_instance`) and one worker per batch the window may ever allow, on a queue that holds
/// two batches per worker, so workers never wait on the feed.
fn spawn_tasks(
    shared: &Arc<Shared>,
    ctx: &Context,
    since: Value,
    src_instance: Option<String>,
    first_changes: Option<(Value, reqwest::Response)>,
) -> Tasks {
    let o = &shared.spec.options;
    // The reader runs ahead by two batches per batch the window may ever allow.
    let slots = shared.in_flight_max();
    let (tx, rx) = mpsc::channel::<Batch>(slots * 2);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let (reader_stop, reader_stop_rx) = watch::channel(false);
    let sh = shared.clone();
    let on_batch = Arc::new(move |b: &Batch| sh.note_batch(b));
    let reader = ChangesReader::new(
        shared.src.clone(),
        o.clone(),
        shared.counters.clone(),
        on_batch,
    )
    .expect_instance_start(src_instance)
    .with_first_response(first_changes);
    let mut set: JoinSet<Result<()>> = JoinSet::new();
    let m = ctx.metrics.clone();
    let reading = reader.run(since, tx, reader_stop_rx);
    set.spawn(
        async move {
            tracing::debug!("changes reader started");
            let r = reading.await;
            if r.is_err() {
                m.inc(Series::ChangesReadFailures);
                m.inc(Series::ChangesReaderDeaths);
            }
            r
        }
        .in_current_span(),
    );
    // One worker per batch the window may allow; the window decides how many run at once.
    for _ in 0..slots {
        ctx.metrics.inc(Series::WorkersStarted);
        let m = ctx.metrics.clone();
        let working = worker(shared.clone(), rx.clone());
        set.spawn(
            async move {
                tracing::debug!("worker started");
                let r = working.await;
                if r.is_err() {
                    m.inc(Series::WorkerDeaths);
                }
                r
            }
            .in_current_span(),
        );
    }
    Tasks { set, reader_stop }
}

/// The run loop: a checkpoint on every `checkpoint_interval` tick, a stats snapshot
/// `STATS_PERIOD` after progress, and on a stop request the reader told to stop and every task aborted.
/// Returns once every task has ended (the reader reached the end of a one-shot feed and the
/// workers drained the queue, or a stop), or with the first failure, the other tasks
/// aborted.
async fn supervise(
    progress: &mut Progress,
    mut tasks: Tasks,
    mut stop: watch::Receiver<bool>,
    checkpoint_interval: Duration,
    rep_id: &RepId,
) -> Result<()> {
    let mut ckpt_timer = tokio::time::interval(checkpoint_interval);
    ckpt_timer.reset();
    let shared = progress.shared.clone();
    // When the stats are next published: `STATS_PERIOD` after the first move since the last
    // publication, so a busy job publishes at most that often and an idle one never wakes.
    let mut stats_due: Option<tokio::time::Instant> = None;
    let mut stopped = false;
    loop {
        tokio::select! {
            _ = ckpt_timer.tick() => {
                progress.checkpoint().await?;
                progress.publish_if_changed();
            }
            _ = shared.moved.notified(), if stats_due.is_none() => {
                stats_due = Some(tokio::time::Instant::now() + STATS_PERIOD);
            }
            _ = tokio::time::sleep_until(stats_due.unwrap_or_else(tokio::time::Instant::now)),
                if stats_due.is_some() => {
                stats_due = None;
                progress.publish_if_changed();
            }
            joined = tasks.set.join_next() => match joined {
                None => return Ok(()),
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => {
                    tasks.set.abort_all();
                    tracing::warn!(rep_id = %rep_id, error = %e, "replication failed");
                    return Err(e);
                }
                // Tasks aborted by a stop end as cancelled: that is the expected ending,
                // the final checkpoint follows.
                Some(Err(e)) if stopped && e.is_cancelled() => {}
                Some(Err(e)) => {
                    tasks.set.abort_all();
                    return Err(ReplicationError::WorkerDied(e.to_string()));
                }
            },
            changed = stop.changed(), if !stopped => {
                if changed.is_err() || *stop.borrow() {
                    stopped = true;
                    let _ = tasks.reader_stop.send(true);
                    // In-flight batches are abandoned: the through-sequence excludes them.
                    tasks.set.abort_all();
                }
            }
        }
    }
}

/// The replication's published stats and its checkpointer: what the run loop's timers and
/// the final checkpoint update.
struct Progress {
    shared: Arc<Shared>,
    base: ReplicationStats,
    checkpointer: Option<Checkpointer>,
    stats_tx: watch::Sender<ReplicationStats>,
    metrics: Arc<NodeMetrics>,
}

impl Progress {
    /// The stats now: the through-sequence, the source sequence and the counters.
    fn snapshot(&mut self) -> ReplicationStats {
        self.refresh();
        self.base.clone()
    }

    /// Brings the base stats up to date: the sequences and the counters.
    fn refresh(&mut self) {
        self.base.through_seq = self.shared.through_seq();
        self.base.source_seq = self.shared.source_seq();
        self.base.fill(&self.shared.counters);
    }

    /// Refreshes the snapshot the handle shows.
    fn publish(&mut self) {
        let s = self.snapshot();
        self.stats_tx.send_replace(s);
    }

    /// Publishes only a change, so that an idle continuous job wakes nobody between its
    /// changes; `updated_on` moves only with progress, as in CouchDB's task status. Called
    /// after progress (see `supervise`) and after a checkpoint, never on an idle timer.
    fn publish_if_changed(&mut self) {
        let mut s = self.snapshot();
        self.stats_tx.send_if_modified(|cur| {
            let now = s.updated_on;
            s.updated_on = cur.updated_on;
            let changed = *cur != s;
            if changed {
                s.updated_on = now;
                *cur = s;
            }
            changed
        });
    }

    /// Writes a checkpoint at the through-sequence (when checkpoints are on).
    async fn checkpoint(&mut self) -> Result<()> {
        let s = self.snapshot();
        if let Some(cp) = self.checkpointer.as_mut() {
            checkpoint(cp, &mut self.base, &s, &self.metrics).await?;
        }
        Ok(())
    }

    /// The end: a final checkpoint, and the final stats (with the checkpoint record, the
    /// answer of a one-shot `_replicate`) published and returned.
    async fn finish(mut self, rep_id: &RepId) -> Result<ReplicationStats> {
        self.checkpoint().await?;
        self.refresh();
        let mut s = self.base;
        s.checkpoint_record = Some(self.checkpointer.take().map_or_else(
            || json!({"use_checkpoints": false}),
            Checkpointer::into_record,
        ));
        self.stats_tx.send_replace(s.clone());
        tracing::info!(rep_id = %rep_id, docs_written = s.docs_written, "replication finished");
        Ok(s)
    }
}

async fn checkpoint(
    cp: &mut Checkpointer,
    base: &mut ReplicationStats,
    s: &ReplicationStats,
    metrics: &NodeMetrics,
) -> Result<()> {
    match cp.write(&s.through_seq, s).await {
        Ok(true) => {
            tracing::debug!(seq = %s.through_seq, "checkpoint written");
            metrics.inc(Series::CheckpointsSuccess);
            base.checkpointed_source_seq = s.through_seq.clone();
        }
        Ok(false) => {}
        Err(e) => {
            metrics.inc(Series::CheckpointsFailure);
            return Err(e);
        }
    }
    Ok(())
}
