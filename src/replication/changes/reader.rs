//! The changes reader (CouchDB's couch_replicator_changes_reader.erl): reads the source's `_changes` with `style=all_docs` from a
//! start sequence and hands batches of at most `worker_batch_size` rows to the workers,
//! running ahead of them through a bounded channel. One-shot replications read the normal
//! feed in one streamed request (resumed from the last batch if it breaks). Continuous ones
//! on a shared client read `feed=normal` pages whenever the source's shared change watch
//! (`super::watch`) sees a change, holding no socket while the source is quiet; on a
//! private client they stream `feed=continuous` line by line and reconnect from the last
//! sequence seen.
//! Filters: `doc_ids` via `POST filter=_doc_ids`, `selector` via `POST filter=_selector`,
//! named filters with `query_params` as query arguments (the request is built in
//! `reader/request.rs`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::backoff::Backoff;

use super::feed_line::{FeedLines, refused};
pub use super::feed_line::{Row, parse_feed_line};
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req, describe};
use crate::replication::pipeline::checkpoint::instance_start_of;

mod paged;
mod request;
mod watched;
use super::normal_feed::NormalFeed;
use crate::replication::options::spec::ReplicationOptions;
use crate::replication::pipeline::stats::Counters;
pub(crate) use request::feed_request;
use request::heartbeat;

/// One changed document: its id, sequence and the leaf revisions to replicate.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// Document id.
    pub id: String,
    /// Source sequence of this change.
    pub seq: Value,
    /// Leaf revisions.
    pub revs: Vec<String>,
}

/// A unit of work: changes plus the sequence the checkpoint may advance to once done.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Increasing batch number.
    pub index: u64,
    /// The changes (may be empty: a `last_seq` marker).
    pub changes: Vec<Change>,
    /// Sequence reached after this batch.
    pub last_seq: Value,
}

/// Called for each batch before it is queued (the checkpoint tracker registers it).
pub(crate) type OnBatch = Arc<dyn Fn(&Batch) + Send + Sync>;

/// Reads the feed and feeds the workers.
pub struct ChangesReader {
    client: Arc<HttpClient>,
    opts: ReplicationOptions,
    counters: Arc<Counters>,
    on_batch: OnBatch,
    next_index: u64,
    /// The source's `instance_start_time` when the replication started, if known.
    instance_start: Option<String>,
    /// When a watched feed's sequence last moved (see [`ChangesReader::read_page`]).
    moved: tokio::time::Instant,
    /// The answer to the one-shot feed's first request, sent ahead from this `since`.
    first: Option<(Value, reqwest::Response)>,
}

impl ChangesReader {
    /// A reader for the source.
    pub fn new(
        client: Arc<HttpClient>,
        opts: ReplicationOptions,
        counters: Arc<Counters>,
        on_batch: OnBatch,
    ) -> Self {
        Self {
            client,
            opts,
            counters,
            on_batch,
            next_index: 0,
            instance_start: None,
            moved: tokio::time::Instant::now(),
            first: None,
        }
    }

    /// The source's `instance_start_time` at start: a continuous feed that reconnects checks
    /// it, so a source deleted and re-created between two connections (whose new feed only
    /// sends heartbeats from a sequence it never reaches) ends the job instead of idling.
    pub fn expect_instance_start(mut self, instance: Option<String>) -> Self {
        self.instance_start = instance;
        self
    }

    /// Fails when the source is gone (404) or is another database than the feed was reading:
    /// its `instance_start_time` changed, or its integer `update_seq` is now below the
    /// sequence already read (an integer-sequence server such as pouchdb-server re-creates a
    /// deleted database, empty, when a request races the delete, and its feed would then
    /// idle forever below `since`). Any other answer (an unreachable server included) lets
    /// the reconnect find out. CouchDB's clustered sequences are opaque strings and its
    /// server resolves a stale `since` itself, so they are not compared.
    async fn check_same_source(&self, since: &Value) -> Result<()> {
        let expected = self.instance_start.as_deref().filter(|i| *i != "0");
        let since = integer_seq(since);
        if expected.is_none() && since.is_none() {
            return Ok(());
        }
        let Ok(r) = self.client.send(&Req::get("")).await else {
            return Ok(());
        };
        if r.status == reqwest::StatusCode::NOT_FOUND {
            return Err(gone(&self.client));
        }
        let Ok(info) = r.json::<Value>("database info") else {
            return Ok(());
        };
        let now = instance_start_of(&info);
        let recreated = match (expected, now.as_deref()) {
            (Some(e), Some(n)) => n != "0" && n != e,
            _ => false,
        };
        let behind = match (since, info.get("update_seq").and_then(integer_seq)) {
            (Some(read), Some(now)) => now < read,
            _ => false,
        };
        if recreated || behind {
            return Err(ReplicationError::DbNotFound(format!(
                "{} (re-created since the replication started)",
                self.client.endpoint()
            )));
        }
        Ok(())
    }

    /// One page of the normal feed from `since`, at most `limit` rows: the rows and the
    /// page's `last_seq` (a gone database and a refusal are errors).
    /// One `feed=normal` page of at most `limit` rows. `sparse_seqs`: the caller needs only
    /// the page's `last_seq`, so CouchDB is asked (`seq_interval`) to compute a row's sequence
    /// once a page instead of once a row, which was most of its work for the feed (100,000
    /// rows: 3.8-5.6 s without, 1.4 s with; docs/decisions/2026-11-27-verify-seq-interval.md).
    async fn read_normal_page(
        &self,
        since: &Value,
        limit: usize,
        sparse_seqs: bool,
    ) -> Result<(Vec<Row>, Value)> {
        let mut req = self.request("normal", since, Some(limit));
        if sparse_seqs {
            req.path.push_str(&format!("&seq_interval={limit}"));
        }
        let r = self.client.send(&req).await?;
        if r.status == reqwest::StatusCode::NOT_FOUND {
            return Err(gone(&self.client));
        }
        if !r.status.is_success() {
            return Err(refused(self.client.endpoint(), r.status));
        }
        let mut feed = NormalFeed::new(self.client.limits().max_feed_line_bytes);
        let from = self.feed_place();
        let rows = feed.push::<Row>(&r.body).map_err(|e| e.at(&from))?;
        let last = feed.finish().map_err(|e| e.at(&from))?;
        Ok((rows, last))
    }

    /// The feed's request as errors name it (no credentials).
    fn feed_place(&self) -> String {
        format!("GET {}/_changes", self.client.endpoint())
    }

    fn request(&self, feed: &str, since: &Value, limit: Option<usize>) -> Req {
        feed_request(&self.opts, feed, since, limit)
    }

    /// A third of the inactivity timeout, at least a second: what a live feed asks for.
    fn heartbeat(&self) -> Duration {
        heartbeat(&self.opts)
    }

    /// Hands the reader the answer to its first request, sent ahead by the start-up (see
    /// [`feed_request`]): the one-shot feed from `since` then needs no request of its own.
    /// Ignored unless the feed starts at that `since`.
    pub(crate) fn with_first_response(mut self, first: Option<(Value, reqwest::Response)>) -> Self {
        self.first = first;
        self
    }

    fn to_change(&self, row: Row) -> Option<Change> {
        let id = row.id?;
        let seq = row.seq?;
        if id.is_empty() {
            return None;
        }
        if self
            .opts
            .max_document_id_length
            .is_some_and(|max| id.len() > max)
        {
            Counters::add(&self.counters.doc_write_failures, 1);
            return None;
        }
        let mut revs: Vec<String> = row.changes.into_iter().map(|r| r.rev).collect();
        if row.removed && !revs.is_empty() {
            revs.remove(0);
        }
        if revs.is_empty() {
            None
        } else {
            Some(Change { id, seq, revs })
        }
    }

    async fn emit(
        &mut self,
        tx: &mpsc::Sender<Batch>,
        changes: Vec<Change>,
        last_seq: Value,
    ) -> bool {
        let batch = Batch {
            index: self.next_index,
            changes,
            last_seq,
        };
        self.next_index += 1;
        (self.on_batch)(&batch);
        tx.send(batch).await.is_ok()
    }

    /// Runs the feed from `since` until its end (one-shot), or until `stop` turns true or the
    /// workers go away (continuous).
    pub async fn run(
        mut self,
        since: Value,
        tx: mpsc::Sender<Batch>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        if self.opts.continuous {
            return self.run_continuous(since, tx, &mut stop).await;
        }
        let mut since = since;
        let mut failures = 0u32;
        let mut wait = reconnect_backoff();
        loop {
            let before = since.clone();
            match self.stream_normal(&mut since, &tx, &stop).await {
                Ok(()) => return Ok(()),
                Err(e) if e.ends_feed() => {
                    return Err(e);
                }
                Err(e) => {
                    if since != before {
                        failures = 0;
                        wait.reset();
                    }
                    failures += 1;
                    if failures > self.opts.retries_per_request {
                        return Err(e.into_changes_failure());
                    }
                    tracing::debug!(error = %e, "one-shot changes feed interrupted, resuming");
                    wait.wait().await;
                }
            }
        }
    }

    /// Reads the one-shot feed from `since` to its end in one streamed request, emitting
    /// batches as rows arrive; `since` follows the last batch emitted.
    async fn stream_normal(
        &mut self,
        since: &mut Value,
        tx: &mpsc::Sender<Batch>,
        stop: &watch::Receiver<bool>,
    ) -> Result<()> {
        let resp = match self.first.take() {
            Some((from, resp)) if from == *since => resp,
            _ => {
                self.client
                    .send_streaming(&self.request("normal", since, None))
                    .await?
            }
        };
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(gone(&self.client));
        }
        if !resp.status().is_success() {
            return Err(refused(self.client.endpoint(), resp.status()));
        }
        let max = self.opts.worker_batch_size.max(1);
        let mut feed = NormalFeed::new(self.client.limits().max_feed_line_bytes);
        let mut pending: Vec<Change> = Vec::new();
        let mut pending_seq: Option<Value> = None;
        let mut body = resp.bytes_stream();
        let mut pace = self.client.limits().pace(self.opts.connection_timeout);
        let from = self.feed_place();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| ReplicationError::ChangesReqFailed(describe(&e)))?;
            let rows = feed.push::<Row>(&chunk).map_err(|e| e.at(&from))?;
            // Only an unfinished row is held to the pace (heartbeats hold nothing).
            if !rows.is_empty() || feed.held() == 0 {
                pace.restart();
            } else if tokio::time::Instant::now() > pace.deadline(feed.held() as u64) {
                return Err(ReplicationError::EndpointResponseTooSlow(format!(
                    "{}: _changes sent {} bytes of one row in {:.0} s, slower than {} bytes per second",
                    self.client.endpoint(),
                    feed.held(),
                    pace.elapsed().as_secs_f64(),
                    pace.rate()
                )));
            }
            for row in rows {
                if let Some(seq) = row.seq.clone() {
                    pending_seq = Some(seq);
                }
                if let Some(c) = self.to_change(row) {
                    pending.push(c);
                }
                if pending.len() >= max
                    && let Some(seq) = pending_seq.clone()
                {
                    if !self
                        .emit(tx, std::mem::take(&mut pending), seq.clone())
                        .await
                        || *stop.borrow()
                    {
                        return Ok(());
                    }
                    *since = seq;
                }
            }
        }
        // The feed must have ended properly, but a one-shot run ends at the last change it
        // read, not at `last_seq`, as CouchDB's does: a run that read no change (an empty
        // source, `doc_ids` or a filter that matched nothing) writes no checkpoint and
        // answers `no_changes`.
        feed.finish().map_err(|e| e.at(&from))?;
        if let Some(seq) = pending_seq.filter(|s| !pending.is_empty() || s != since) {
            self.emit(tx, pending, seq.clone()).await;
            *since = seq;
        }
        Ok(())
    }

    async fn run_continuous(
        &mut self,
        mut since: Value,
        tx: mpsc::Sender<Batch>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<()> {
        if let Some(watches) = self.client.watches().cloned() {
            return self.run_watched(&watches, since, tx, stop).await;
        }
        let mut failures_without_progress = 0u32;
        let mut wait = reconnect_backoff();
        let mut first = true;
        loop {
            let progressed;
            if !std::mem::take(&mut first) {
                self.check_same_source(&since).await?;
            }
            let outcome = tokio::select! {
                r = self.stream_once(&mut since, &tx, None) => r,
                _ = stop.wait_for(|s| *s) => return Ok(()),
            };
            match outcome {
                Ok((true, _)) => return Ok(()), // workers gone
                Ok((false, p)) => {
                    progressed = p;
                }
                Err(e) => {
                    if e.ends_feed() {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "changes feed interrupted");
                    progressed = false;
                    failures_without_progress += 1;
                    if failures_without_progress > self.opts.retries_per_request {
                        return Err(e.into_changes_failure());
                    }
                }
            }
            if progressed {
                failures_without_progress = 0;
                wait.reset();
            } else {
                wait.wait().await;
            }
        }
    }

    /// One continuous request. Returns (workers_gone, made_progress). With `quiet_after`,
    /// the request ends once that long passed without a change (heartbeats do not count).
    async fn stream_once(
        &mut self,
        since: &mut Value,
        tx: &mpsc::Sender<Batch>,
        quiet_after: Option<Duration>,
    ) -> Result<(bool, bool)> {
        let resp = self
            .client
            .send_streaming(&self.request("continuous", since, None))
            .await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(gone(&self.client));
        }
        if !resp.status().is_success() {
            return Err(refused(self.client.endpoint(), resp.status()));
        }
        let mut body = resp.bytes_stream();
        let mut lines = FeedLines::new(self.client.limits(), self.opts.connection_timeout);
        let from = self.feed_place();
        let mut progressed = false;
        let max = self.opts.worker_batch_size;
        let far = Duration::from_secs(86_400 * 365);
        let mut quiet_at = tokio::time::Instant::now() + quiet_after.unwrap_or(far);
        loop {
            let next = tokio::select! {
                n = body.next() => n,
                _ = tokio::time::sleep_until(quiet_at) => return Ok((false, progressed)),
            };
            let Some(chunk) = next else { break };
            let chunk = chunk.map_err(|e| ReplicationError::ChangesReqFailed(describe(&e)))?;
            lines.push(&chunk).map_err(|e| e.at(&from))?;
            let mut pending: Vec<Change> = Vec::new();
            let mut pending_seq: Option<Value> = None;
            let mut ended = false;
            while let Some(line) = lines.next_line().map_err(|e| e.at(&from))? {
                let Some(row) = parse_feed_line(line.as_bytes()).map_err(|e| e.at(&from))? else {
                    continue; // heartbeat
                };
                if let Some(ls) = row.last_seq.clone() {
                    pending_seq = Some(ls);
                    ended = true;
                    break;
                }
                if let Some(seq) = row.seq.clone() {
                    pending_seq = Some(seq);
                }
                if let Some(c) = self.to_change(row) {
                    pending.push(c);
                    if let Some(d) = quiet_after {
                        quiet_at = tokio::time::Instant::now() + d;
                    }
                }
                if pending.len() >= max {
                    let seq = pending_seq.clone().unwrap_or_else(|| since.clone());
                    if !self
                        .emit(tx, std::mem::take(&mut pending), seq.clone())
                        .await
                    {
                        return Ok((true, progressed));
                    }
                    *since = seq;
                    progressed = true;
                }
            }
            if let Some(seq) = pending_seq
                && (seq != *since || !pending.is_empty())
            {
                if !self.emit(tx, pending, seq.clone()).await {
                    return Ok((true, progressed));
                }
                *since = seq;
                progressed = true;
            }
            if ended {
                return Ok((false, progressed));
            }
        }
        Ok((false, progressed))
    }
}

/// A sequence that is a plain integer (a JSON number, or a string of digits): the kind an
/// integer-sequence server hands out, which can be compared.
fn integer_seq(seq: &Value) -> Option<u64> {
    match seq {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Waits between reconnects of the changes feed: 250 ms doubling to a minute, reset after
/// progress.
fn reconnect_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(250), Duration::from_secs(60))
}

/// The error for a `_changes` request answered 404: the source database was deleted (CouchDB
/// ends its feeds too). Retrying the same feed cannot help, so the job ends at once and the
/// scheduler's crash backoff decides when to try again (a re-created database is then
/// replicated from scratch).
fn gone(client: &HttpClient) -> ReplicationError {
    ReplicationError::DbNotFound(format!("{} (its _changes answered 404)", client.endpoint()))
}
