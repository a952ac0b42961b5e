//! A running replication: opens the endpoints (CouchDB's couch_replicator_scheduler_job.erl start-up), finds the start sequence, then runs the
//! pipeline — the changes reader running ahead, workers each taking a batch (as many at once as
//! the adaptive window allows: `worker_processes` at first, up to `http_connections`, see
//! [`super::rate_limit::Window`]) through `_revs_diff` → `_bulk_get` (+ a multipart one for small attachments, + individual
//! fetches) → `_bulk_docs` and multipart PUTs, so source reads and target writes overlap — and checkpoints on a timer at the through-sequence, which never
//! passes a batch still in flight. Takes: [`start`] / [`replicate`]; a [`ReplicationHandle`]
//! gives stats snapshots, a progress stream, a checkpoint-then-stop request and the result.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::changes::{Batch, ChangesReader};
use super::checkpoint::{Checkpointer, StartPoint, instance_start_of};
use super::client::{ClientConfig, HttpClient, Req};
use super::endpoint::{Endpoint, encode_doc_id, encode_query};
use super::error::{ReplicationError, Result};
use super::fetch::BulkGetGate;
use super::options::{Filter, ReplicationOptions, ReplicationSpec};
use super::rate_limit::{Aimd, RateLimiter, WindowStats};
use super::rep_id::{RepId, checkpoint_ids, replication_id};
use super::revs_diff::DiffSkipper;
use super::stats::{Counters, ReplicationStats, unix_now};
use super::transport::Transports;
use super::worker::{Shared, Tracker, new_window, worker};
use crate::telemetry::{NodeMetrics, Series};

/// How soon after progress the stats snapshot is refreshed (and so how often at most).
const STATS_PERIOD: Duration = Duration::from_millis(250);

/// What a replication needs from its host.
#[derive(Clone)]
pub struct Context {
    /// The replicator node's uuid (part of the replication id).
    pub server_uuid: String,
    /// The 429 hook.
    pub limiter: Arc<dyn RateLimiter>,
    /// Shared per-endpoint clients (a node's connection pool); `None`: each replication
    /// opens its own connections.
    pub transports: Option<Arc<Transports>>,
    /// The host's metrics (requests, checkpoints, workers, documents).
    pub metrics: Arc<NodeMetrics>,
    /// The most bytes of fetched documents one replication holds in flight (see
    /// [`super::rate_limit::Window`]).
    pub in_flight_bytes: u64,
}

/// [`Context::in_flight_bytes`] by default: 64 MiB, a few hundred batches of small documents
/// (more than any link needs) but few of large ones.
pub const DEFAULT_IN_FLIGHT_BYTES: u64 = 64 << 20;

impl Default for Context {
    fn default() -> Self {
        Self {
            server_uuid: "couch-replicator-standalone".into(),
            limiter: Arc::new(Aimd::new()),
            transports: None,
            metrics: Arc::default(),
            in_flight_bytes: DEFAULT_IN_FLIGHT_BYTES,
        }
    }
}

/// A replication started with [`start`].
pub struct ReplicationHandle {
    stop: watch::Sender<bool>,
    window: Arc<Mutex<WindowStats>>,
    stats: watch::Receiver<ReplicationStats>,
    task: Option<tokio::task::JoinHandle<Result<ReplicationStats>>>,
}

impl ReplicationHandle {
    /// The latest stats snapshot (at most 250 ms, `STATS_PERIOD`, old).
    pub fn stats(&self) -> ReplicationStats {
        self.stats.borrow().clone()
    }

    /// A stream of stats snapshots.
    pub fn progress(&self) -> watch::Receiver<ReplicationStats> {
        self.stats.clone()
    }

    /// The pipeline window's statistics, as of the last batch done; the probe stays readable
    /// after [`Self::wait`].
    pub fn window(&self) -> Arc<Mutex<WindowStats>> {
        self.window.clone()
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
    let window = Arc::new(Mutex::new(WindowStats::default()));
    // The caller's span (a job's) follows the replication into every task it spawns.
    let task = tokio::spawn(run(spec, ctx, stop_rx, stats_tx, window.clone()).in_current_span());
    ReplicationHandle {
        stop: stop_tx,
        window,
        stats: stats_rx,
        task: Some(task),
    }
}

/// Runs a replication to its end (for a continuous one: until it fails).
pub async fn replicate(spec: ReplicationSpec, ctx: Context) -> Result<ReplicationStats> {
    start(spec, ctx).wait().await
}

pub(crate) fn clients(
    spec: &ReplicationSpec,
    ctx: &Context,
) -> Result<(Arc<HttpClient>, Arc<HttpClient>)> {
    let o = &spec.options;
    let cfg = |proxy: &Option<String>, conns: usize| ClientConfig {
        connection_timeout: o.connection_timeout,
        request_timeout: o.request_timeout,
        retries_per_request: o.retries_per_request,
        http_connections: conns,
        proxy: proxy.clone(),
        tcp_nodelay: o.tcp_nodelay,
        metrics: ctx.metrics.clone(),
        tls: o.tls.clone(),
        auth: o.auth,
    };
    let client = |ep: &Endpoint, cfg: ClientConfig| match &ctx.transports {
        Some(t) => HttpClient::shared(ep.clone(), cfg, ctx.limiter.clone(), t),
        None => HttpClient::new(ep.clone(), cfg, ctx.limiter.clone()),
    };
    // The changes feed holds one source connection: never fewer than 2 (CouchDB's couch_replicator_scheduler_job.erl start-up).
    let src = client(
        &spec.source,
        cfg(&o.source_proxy, o.http_connections.max(2)),
    )?;
    let tgt = client(&spec.target, cfg(&o.target_proxy, o.http_connections))?;
    Ok((Arc::new(src), Arc::new(tgt)))
}

/// Fetches a user filter's source code (`ddoc/name`) from the source.
async fn filter_code(src: &HttpClient, name: &str) -> Result<String> {
    let (ddoc, fname) = name.split_once('/').ok_or_else(|| {
        ReplicationError::InvalidOptions(format!("filter `{name}` is not `ddoc/name`"))
    })?;
    let r = src
        .send(&Req::get(encode_doc_id(&format!("_design/{ddoc}"))))
        .await?;
    if r.status != StatusCode::OK {
        return Err(ReplicationError::FilterFetch(format!(
            "design document `_design/{ddoc}` answered {}",
            r.status
        )));
    }
    let doc: Value = r.json("design document")?;
    doc.get("filters")
        .and_then(|f| f.get(fname))
        .and_then(Value::as_str)
        // Untrimmed: the id code trims it the way CouchDB does.
        .map(str::to_owned)
        .ok_or_else(|| {
            ReplicationError::FilterFetch(format!("`_design/{ddoc}` has no filter `{fname}`"))
        })
}

/// Computes the replication id (fetching the filter code from the source when needed).
pub async fn compute_id(spec: &ReplicationSpec, ctx: &Context) -> Result<RepId> {
    let (src, _) = clients(spec, ctx)?;
    compute_id_with(&src, spec, ctx).await
}

async fn compute_id_with(src: &HttpClient, spec: &ReplicationSpec, ctx: &Context) -> Result<RepId> {
    Ok(compute_ids_with(src, spec, ctx).await?.0)
}

/// The id and the base ids of every id version (where checkpoints may be found).
async fn compute_ids_with(
    src: &HttpClient,
    spec: &ReplicationSpec,
    ctx: &Context,
) -> Result<(RepId, Vec<String>)> {
    let code = match super::rep_id::filter_needing_code(spec) {
        Some(name) => Some(filter_code(src, name).await?),
        None => None,
    };
    Ok((
        replication_id(&ctx.server_uuid, spec, code.as_deref()),
        checkpoint_ids(&ctx.server_uuid, spec, code.as_deref()),
    ))
}

/// `GET db` (D.2 step 2): returns the db info or the error class.
pub(crate) async fn open_db(c: &HttpClient) -> Result<Value> {
    // Jobs starting together on the same database share this read.
    let r = c.read_shared("").await?;
    let ep = c.endpoint().to_string();
    match r.status {
        StatusCode::OK => {
            let v: Value = r
                .json("database info")
                .map_err(|_| ReplicationError::DbNotFound(ep.clone()))?;
            if v.get("update_seq").is_none() {
                return Err(ReplicationError::DbNotFound(ep));
            }
            Ok(v)
        }
        StatusCode::UNAUTHORIZED => Err(c.unauthorized()),
        StatusCode::FORBIDDEN => Err(c.forbidden()),
        _ => Err(ReplicationError::DbNotFound(ep)),
    }
}

/// Creates the target; true when this request created it (201), so it holds nothing yet.
async fn create_target(tgt: &HttpClient, spec: &ReplicationSpec) -> Result<bool> {
    let mut q = String::new();
    for (k, v) in &spec.options.create_target_params {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        q.push(if q.is_empty() { '?' } else { '&' });
        q.push_str(&format!("{}={}", encode_query(k), encode_query(&v)));
    }
    let r = tgt
        .send(&Req {
            body: None,
            ..Req::json(Method::PUT, q, "")
        })
        .await?;
    match r.status {
        StatusCode::UNAUTHORIZED => Err(tgt.unauthorized()),
        StatusCode::FORBIDDEN => Err(tgt.forbidden()),
        StatusCode::CREATED => Ok(true),
        _ => Ok(false), // 412 exists, anything else shows up at GET db
    }
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
    window_stats: Arc<Mutex<WindowStats>>,
) -> Result<ReplicationStats> {
    let opened = open(&spec, &ctx).await?;
    let o = &spec.options;
    let Opened {
        src,
        tgt,
        src_info,
        keep_encoding,
        rep_id,
        checkpointer,
        start_point,
    } = opened;
    tracing::info!(rep_id = %rep_id, source = %spec.source, target = %spec.target, since = %start_point.seq, "replication starting");
    let counters = Arc::new(Counters::default());
    if let Some(seed) = &start_point.seed {
        counters.seed(seed);
    }
    let base = ReplicationStats {
        replication_id: rep_id.full(),
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
        skipper: Mutex::new(DiffSkipper::default()),
        bulk_get: Mutex::new(BulkGetGate::default()),
        keep_encoding,
        source_seq: Mutex::new(base.source_seq.clone()),
        moved: tokio::sync::Notify::new(),
        window: Mutex::new(new_window(o, ctx.in_flight_bytes, &src_info)),
        window_moved: tokio::sync::Notify::new(),
        window_stats,
    });
    let mut progress = Progress {
        shared: shared.clone(),
        base,
        checkpointer,
        stats_tx,
        metrics: ctx.metrics.clone(),
    };
    progress.publish();
    let tasks = spawn_tasks(&shared, &ctx, start_point.seq, instance_start_of(&src_info));
    supervise(&mut progress, tasks, stop, o.checkpoint_interval, &rep_id).await?;
    progress.finish(&rep_id).await
}

/// What start-up found: the endpoints' clients, the source's database info, the
/// replication id, and where to start (with the checkpointer that found it).
struct Opened {
    src: Arc<HttpClient>,
    tgt: Arc<HttpClient>,
    src_info: Value,
    keep_encoding: bool,
    rep_id: RepId,
    checkpointer: Option<Checkpointer>,
    start_point: StartPoint,
}

/// Start-up (CouchDB's couch_replicator_scheduler_job.erl init): the clients, the target
/// created when asked, both databases opened, the ids computed, the start point found.
async fn open(spec: &ReplicationSpec, ctx: &Context) -> Result<Opened> {
    let (src, tgt) = clients(spec, ctx)?;
    // The target is created first: overlapping its creation with the reads below made the
    // links bench fail with a 401 on CouchDB 3.4.3 (not yet understood), so it costs a
    // round trip of its own. A target created now holds no checkpoint.
    let created = spec.options.create_target && create_target(&tgt, spec).await?;
    // Both databases are opened while the checkpoints are read: on a long round trip each
    // step one after the other costs a round trip. A database that cannot be opened is the
    // error reported, whatever the checkpoint reads met.
    let (rep_id, checkpoint_ids) = compute_ids_with(&src, spec, ctx).await?;
    let (opened, found) = tokio::join!(
        async { tokio::try_join!(open_db(&src), open_db(&tgt)) },
        find_start(&src, &tgt, &spec.options, &checkpoint_ids, created)
    );
    let (src_info, tgt_info) = opened?;
    let (mut checkpointer, start_point) = found?;
    if let Some(cp) = checkpointer.as_mut() {
        cp.expect_instance_start(instance_start_of(&src_info), instance_start_of(&tgt_info));
    }
    // CouchDB (its database info names its storage's `disk_format_version`) sends
    // gzip-encoded attachments as stored in any multipart answer, and only a CouchDB target
    // stores them so; pouchdb-server would keep the gzip bytes as the content. So from a
    // CouchDB source to any other target, attachments travel decoded (JSON).
    let is_couch = |info: &Value| info.get("disk_format_version").is_some();
    let keep_encoding = is_couch(&tgt_info) || !is_couch(&src_info);
    Ok(Opened {
        src,
        tgt,
        src_info,
        keep_encoding,
        rep_id,
        checkpointer,
        start_point,
    })
}

/// Where the replication starts: the checkpoint found on both sides (under the current id
/// or an older one) and its sequence, unless checkpoints are off. `since_seq` overrides the
/// sequence but keeps the checkpoint's history and counters (CouchDB 3.4). A target created
/// just now holds no checkpoint, so the replication starts from scratch without looking.
async fn find_start(
    src: &Arc<HttpClient>,
    tgt: &Arc<HttpClient>,
    o: &ReplicationOptions,
    checkpoint_ids: &[String],
    new_target: bool,
) -> Result<(Option<Checkpointer>, StartPoint)> {
    let mut checkpointer = None;
    let mut start_point = StartPoint {
        seq: json!(0),
        seed: None,
    };
    if o.use_checkpoints {
        let (mut cp, sp) =
            Checkpointer::load(src.clone(), tgt.clone(), checkpoint_ids, new_target).await?;
        cp.set_doc_ids(matches!(o.filter, Filter::DocIds(_)));
        checkpointer = Some(cp);
        start_point = sp;
    }
    if let Some(since) = &o.since_seq {
        start_point.seq = since.clone();
        if let Some(cp) = checkpointer.as_mut() {
            cp.set_start_seq(since.clone());
        }
    }
    Ok((checkpointer, start_point))
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
) -> Tasks {
    let o = &shared.spec.options;
    // The reader runs ahead by two batches per batch the window may ever allow.
    let slots = shared.window_max();
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
    .expect_instance_start(src_instance);
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
