//! A running replication: opens the endpoints (CouchDB's couch_replicator_scheduler_job.erl start-up), finds the start sequence, then runs the
//! pipeline — the changes reader running ahead, `worker_processes` workers each taking a batch
//! through `_revs_diff` → `_bulk_get` (+ one for small attachments, + individual fetches) →
//! `_bulk_docs`, so source reads and target writes overlap — and checkpoints on a timer at the through-sequence, which never
//! passes a batch still in flight. Takes: [`start`] / [`replicate`]; a [`ReplicationHandle`]
//! gives stats snapshots, a progress stream, a checkpoint-then-stop request and the result.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
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
use super::fetch::{BulkGetGate, Fetched, Wanted, bulk_get, open_revs};
use super::options::{Filter, ReplicationSpec};
use super::rate_limit::{Aimd, RateLimiter};
use super::rep_id::{RepId, checkpoint_ids, replication_id};
use super::revs_diff::{DiffSkipper, all_missing, revs_diff};
use super::stats::{Counters, ReplicationStats, unix_now};
use super::transport::Transports;
use super::write::{WriteResult, put_json, put_multipart, write_docs};
use crate::telemetry::{NodeMetrics, Series};

/// How often the stats snapshot is refreshed.
const STATS_PERIOD: Duration = Duration::from_millis(250);
/// Concurrent individual fetches per worker.
const INDIVIDUAL_FETCHES: usize = 4;

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
}

impl Default for Context {
    fn default() -> Self {
        Self {
            server_uuid: "couch-replicator-standalone".into(),
            limiter: Arc::new(Aimd::new()),
            transports: None,
            metrics: Arc::default(),
        }
    }
}

/// Orders batches so the checkpoint never passes one still in flight.
#[derive(Debug)]
struct Tracker {
    pending: BTreeMap<u64, (Value, bool)>,
    through: Value,
}

impl Tracker {
    fn register(&mut self, index: u64, seq: Value) {
        self.pending.insert(index, (seq, false));
    }

    fn complete(&mut self, index: u64) {
        if let Some(e) = self.pending.get_mut(&index) {
            e.1 = true;
        }
        while let Some(entry) = self.pending.first_entry() {
            if !entry.get().1 {
                break;
            }
            self.through = entry.remove().0;
        }
    }
}

struct Shared {
    src: Arc<HttpClient>,
    tgt: Arc<HttpClient>,
    spec: ReplicationSpec,
    counters: Arc<Counters>,
    metrics: Arc<NodeMetrics>,
    tracker: Mutex<Tracker>,
    skipper: Mutex<DiffSkipper>,
    bulk_get: Mutex<BulkGetGate>,
    source_seq: Mutex<Value>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A replication started with [`start`].
pub struct ReplicationHandle {
    stop: watch::Sender<bool>,
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
    // The caller's span (a job's) follows the replication into every task it spawns.
    let task = tokio::spawn(run(spec, ctx, stop_rx, stats_tx).in_current_span());
    ReplicationHandle {
        stop: stop_tx,
        stats: stats_rx,
        task: Some(task),
    }
}

/// Runs a replication to its end (for a continuous one: until it fails).
pub async fn replicate(spec: ReplicationSpec, ctx: Context) -> Result<ReplicationStats> {
    start(spec, ctx).wait().await
}

fn clients(spec: &ReplicationSpec, ctx: &Context) -> Result<(Arc<HttpClient>, Arc<HttpClient>)> {
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
async fn open_db(c: &HttpClient) -> Result<Value> {
    let r = c.send(&Req::get("")).await?;
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
        StatusCode::UNAUTHORIZED => Err(ReplicationError::Unauthorized(ep)),
        StatusCode::FORBIDDEN => Err(ReplicationError::Forbidden(ep)),
        _ => Err(ReplicationError::DbNotFound(ep)),
    }
}

async fn create_target(tgt: &HttpClient, spec: &ReplicationSpec) -> Result<()> {
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
        StatusCode::UNAUTHORIZED => Err(ReplicationError::Unauthorized(tgt.endpoint().to_string())),
        StatusCode::FORBIDDEN => Err(ReplicationError::Forbidden(tgt.endpoint().to_string())),
        _ => Ok(()), // 201 created, 412 exists, anything else shows up at GET db
    }
}

/// Endpoints in stats are shown as CouchDB shows them: without credentials.
fn display(ep: &Endpoint) -> String {
    ep.couch_url()
}

async fn run(
    spec: ReplicationSpec,
    ctx: Context,
    mut stop: watch::Receiver<bool>,
    stats_tx: watch::Sender<ReplicationStats>,
) -> Result<ReplicationStats> {
    let (src, tgt) = clients(&spec, &ctx)?;
    let o = spec.options.clone();
    if o.create_target {
        create_target(&tgt, &spec).await?;
    }
    let (src_info, tgt_info) = tokio::try_join!(open_db(&src), open_db(&tgt))?;
    let (rep_id, checkpoint_ids) = compute_ids_with(&src, &spec, &ctx).await?;
    let mut checkpointer = None;
    let mut start_point = StartPoint {
        seq: json!(0),
        seed: None,
    };
    if o.use_checkpoints {
        let (mut cp, sp) = Checkpointer::load(src.clone(), tgt.clone(), &checkpoint_ids).await?;
        cp.expect_instance_start(instance_start_of(&src_info), instance_start_of(&tgt_info));
        cp.set_doc_ids(matches!(o.filter, Filter::DocIds(_)));
        checkpointer = Some(cp);
        start_point = sp;
    }
    // `since_seq` overrides the checkpoint's sequence; its history and counters are kept (3.4).
    if let Some(since) = &o.since_seq {
        start_point.seq = since.clone();
        if let Some(cp) = checkpointer.as_mut() {
            cp.set_start_seq(since.clone());
        }
    }
    tracing::info!(rep_id = %rep_id, source = %spec.source, target = %spec.target, since = %start_point.seq, "replication starting");
    let counters = Arc::new(Counters::default());
    if let Some(seed) = &start_point.seed {
        counters.seed(seed);
    }
    let mut base = ReplicationStats {
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
        src: src.clone(),
        tgt: tgt.clone(),
        spec: spec.clone(),
        counters: counters.clone(),
        metrics: ctx.metrics.clone(),
        tracker: Mutex::new(Tracker {
            pending: BTreeMap::new(),
            through: start_point.seq.clone(),
        }),
        skipper: Mutex::new(DiffSkipper::default()),
        bulk_get: Mutex::new(BulkGetGate::default()),
        source_seq: Mutex::new(base.source_seq.clone()),
    });
    let snapshot = |base: &mut ReplicationStats, sh: &Shared| {
        base.through_seq = lock(&sh.tracker).through.clone();
        base.source_seq = lock(&sh.source_seq).clone();
        base.fill(&sh.counters);
        base.clone()
    };
    stats_tx.send_replace(snapshot(&mut base, &shared));

    // The queue holds two batches per worker so workers never wait on the feed.
    let (tx, rx) = mpsc::channel::<Batch>(o.worker_processes * 2);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let (reader_stop_tx, reader_stop_rx) = watch::channel(false);
    let sh = shared.clone();
    let on_batch = Arc::new(move |b: &Batch| {
        lock(&sh.tracker).register(b.index, b.last_seq.clone());
        let mut seq = lock(&sh.source_seq);
        match (seq.as_u64(), b.last_seq.as_u64()) {
            (Some(cur), Some(new)) if new <= cur => {}
            _ => *seq = b.last_seq.clone(),
        }
    });
    let reader = ChangesReader::new(src.clone(), o.clone(), counters.clone(), on_batch);
    let mut tasks: JoinSet<Result<()>> = JoinSet::new();
    let m = ctx.metrics.clone();
    let reading = reader.run(start_point.seq.clone(), tx, reader_stop_rx);
    tasks.spawn(
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
    for _ in 0..o.worker_processes {
        ctx.metrics.inc(Series::WorkersStarted);
        let m = ctx.metrics.clone();
        let working = worker(shared.clone(), rx.clone());
        tasks.spawn(
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

    let mut ckpt_timer = tokio::time::interval(o.checkpoint_interval);
    ckpt_timer.reset();
    let mut stats_timer = tokio::time::interval(STATS_PERIOD);
    let mut stopped = false;
    loop {
        tokio::select! {
            _ = ckpt_timer.tick() => {
                let s = snapshot(&mut base, &shared);
                if let Some(cp) = checkpointer.as_mut() {
                    checkpoint(cp, &mut base, &s, &ctx.metrics).await?;
                }
            }
            _ = stats_timer.tick() => {
                // Only a change wakes the watchers: an idle continuous job costs nothing
                // between its changes.
                // `updated_on` moves only with progress, as in CouchDB's task status.
                let mut s = snapshot(&mut base, &shared);
                stats_tx.send_if_modified(|cur| {
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
            joined = tasks.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                // Tasks aborted by a stop request: not a failure, the final checkpoint follows.
                Some(Err(e)) if stopped && e.is_cancelled() => {}
                Some(Ok(Err(e))) => {
                    tasks.abort_all();
                    tracing::warn!(rep_id = %rep_id, error = %e, "replication failed");
                    return Err(e);
                }
                // Tasks aborted by a stop end as cancelled: that is the expected ending.
                Some(Err(e)) if stopped && e.is_cancelled() => {}
                Some(Err(e)) => {
                    tasks.abort_all();
                    return Err(ReplicationError::WorkerDied(e.to_string()));
                }
            },
            changed = stop.changed(), if !stopped => {
                if changed.is_err() || *stop.borrow() {
                    stopped = true;
                    let _ = reader_stop_tx.send(true);
                    // In-flight batches are abandoned: the through-sequence excludes them.
                    tasks.abort_all();
                }
            }
        }
    }
    let s = snapshot(&mut base, &shared);
    if let Some(cp) = checkpointer.as_mut() {
        checkpoint(cp, &mut base, &s, &ctx.metrics).await?;
    }
    base.checkpoint_record = Some(checkpointer.as_ref().map_or_else(
        || json!({"use_checkpoints": false}),
        |cp| cp.record().clone(),
    ));
    let s = snapshot(&mut base, &shared);
    stats_tx.send_replace(s.clone());
    tracing::info!(rep_id = %rep_id, docs_written = s.docs_written, "replication finished");
    Ok(s)
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

async fn worker(sh: Arc<Shared>, rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Batch>>>) -> Result<()> {
    loop {
        let next = { rx.lock().await.recv().await };
        let Some(batch) = next else { return Ok(()) };
        process(&sh, &batch).await?;
        lock(&sh.tracker).complete(batch.index);
    }
}

async fn process(sh: &Shared, batch: &Batch) -> Result<()> {
    if batch.changes.is_empty() {
        return Ok(());
    }
    let c = &sh.counters;
    let checked: u64 = batch.changes.iter().map(|ch| ch.revs.len() as u64).sum();
    Counters::add(&c.revisions_checked, checked);
    NodeMetrics::add(&sh.metrics.revisions_checked, checked);
    let call = lock(&sh.skipper).should_call();
    let missing = if call {
        let m = revs_diff(&sh.tgt, &batch.changes).await?;
        let found: u64 = m.iter().map(|x| x.revs.len() as u64).sum();
        lock(&sh.skipper).record(checked, found);
        m
    } else {
        all_missing(&batch.changes)
    };
    let wanted: Vec<Wanted> = missing
        .into_iter()
        .flat_map(|m| {
            let anc = m.possible_ancestors;
            m.revs.into_iter().map(move |rev| Wanted {
                id: m.id.clone(),
                rev,
                atts_since: anc.clone(),
            })
        })
        .collect();
    Counters::add(&c.missing_revisions_found, wanted.len() as u64);
    NodeMetrics::add(&sh.metrics.missing_revisions_found, wanted.len() as u64);
    if wanted.is_empty() {
        return Ok(());
    }
    // Design documents are always fetched and written one by one (CouchDB's couch_replicator_worker.erl).
    let (design, wanted): (Vec<Wanted>, Vec<Wanted>) = wanted
        .into_iter()
        .partition(|w| w.id.starts_with("_design/"));
    let try_bulk = sh.spec.options.use_bulk_get && lock(&sh.bulk_get).should_try();
    let (mut docs, mut refetch) = if try_bulk && !wanted.is_empty() {
        let n = wanted.len();
        let mut out = bulk_get(&sh.src, wanted, false).await?;
        let failed = if out.supported { out.refetch.len() } else { n };
        lock(&sh.bulk_get).record(n, failed);
        if out.supported {
            Counters::add(&c.bulk_get_attempts, n as u64);
            Counters::add(&c.bulk_get_docs, out.docs.len() as u64);
        } else {
            tracing::debug!(source = %sh.spec.source, "_bulk_get unusable, fetching one by one");
        }
        // Documents with small attachments: one more `_bulk_get` for all of them.
        if !out.inline.is_empty() {
            let n = out.inline.len() as u64;
            let again = bulk_get(&sh.src, std::mem::take(&mut out.inline), true).await?;
            if again.supported {
                Counters::add(&c.bulk_get_attempts, n);
                Counters::add(&c.bulk_get_docs, again.docs.len() as u64);
            }
            out.docs.extend(again.docs);
            out.refetch.extend(again.refetch);
            out.refetch.extend(again.inline);
        }
        (out.docs, out.refetch)
    } else {
        (Vec::new(), wanted)
    };
    refetch.extend(design);
    let mut result = WriteResult::default();
    let (src, tgt) = (sh.src.clone(), sh.tgt.clone());
    let retry_after = sh.spec.options.missing_doc_retry;
    let mut fetched = futures::stream::iter(refetch)
        .map(move |w| {
            let (src, tgt) = (src.clone(), tgt.clone());
            async move {
                // Attachments stream from source to target; on failure fetch again buffered.
                let mut got = match open_revs(&src, &w, Some(&tgt)).await {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::debug!(error = %e, "streamed fetch failed, fetching buffered");
                        open_revs(&src, &w, None).await?
                    }
                };
                let missing_stub = got
                    .iter()
                    .any(|f| matches!(f, Fetched::Written(r) if r.missing_stub > 0));
                if got.is_empty() || missing_stub {
                    // Reported missing (common while the source's shards catch up), or the
                    // target lacks an attachment atts_since left out: wait, then fetch once
                    // more in full; the first write's rejection is replaced by this one.
                    tokio::time::sleep(retry_after).await;
                    let again = Wanted {
                        atts_since: Vec::new(),
                        ..w.clone()
                    };
                    got = open_revs(&src, &again, None).await?;
                }
                Ok::<_, ReplicationError>((w.id, got))
            }
        })
        .buffered(INDIVIDUAL_FETCHES);
    let mut read = docs.len() as u64;
    while let Some(f) = fetched.next().await {
        let (id, got) = f?;
        for doc in got {
            read += 1;
            match doc {
                Fetched::Json(b) if id.starts_with("_design/") => {
                    result += put_json(&sh.tgt, &id, &b).await?
                }
                Fetched::Json(b) => docs.push(b),
                Fetched::Multipart { id, json, parts } => {
                    result += put_multipart(&sh.tgt, &id, &json, &parts).await?
                }
                Fetched::Written(r) => result += r,
            }
        }
    }
    Counters::add(&c.docs_read, read);
    result += write_docs(&sh.tgt, &docs).await?;
    Counters::add(&c.docs_written, result.written);
    Counters::add(&c.doc_write_failures, result.failures);
    NodeMetrics::add(&sh.metrics.docs_written, result.written);
    NodeMetrics::add(&sh.metrics.doc_write_failures, result.failures);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn through_seq_never_passes_an_unfinished_batch() {
        let mut t = Tracker {
            pending: BTreeMap::new(),
            through: json!(0),
        };
        for i in 0..3 {
            t.register(i, json!((i + 1) * 10));
        }
        t.complete(1);
        assert_eq!(t.through, json!(0));
        t.complete(2);
        assert_eq!(t.through, json!(0));
        t.complete(0);
        assert_eq!(t.through, json!(30));
    }
}
