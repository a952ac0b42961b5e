//! Continuous reading on a shared client (the changes reader's half for watched sources):
//! `feed=normal` pages from the job's own sequence, and between them a wait on the source's
//! shared change watch ([`crate::replication::changes::watch`]), so the job holds no socket while its
//! source is quiet. A `doc_ids` job reads only when one of its documents changed.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::{Batch, Change, ChangesReader, reconnect_backoff};
use crate::replication::changes::watch::{Tick, Watch, Watches};
use crate::replication::changes::watch_follower;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::options::spec::Filter;

/// Reads in a row that found changes, each within [`BUSY_GAP`] of the one before, after
/// which a job reads its own continuous feed (see [`ChangesReader::run_watched`]).
const BUSY_READS: u32 = 3;
/// How soon after the previous read a read must come to count as busy.
const BUSY_GAP: Duration = Duration::from_secs(1);
/// How long a busy job's own feed stays open without a change before it goes back to the
/// shared watch.
const BUSY_QUIET: Duration = Duration::from_secs(5);

/// What a tick of the change watch asks of a waiting job.
enum Wake {
    /// Read from its sequence.
    Read,
    /// Nothing it reads changed: wait again.
    Skip,
    /// The job is stopping.
    Stop,
}

impl ChangesReader {
    /// A continuous feed on a shared client: normal reads from `since`, and between them a
    /// wait for the database's shared watch ([`Watch`]) to see a change, so the
    /// job holds no socket while its source is quiet. A failed read is retried as a broken
    /// feed is; a break of the watch's own feed makes the job check its source first.
    ///
    /// A source under steady writes ([`BUSY_READS`] reads in a row finding changes) gets the
    /// job's own continuous feed until it is quiet for [`BUSY_QUIET`]: each change then
    /// arrives half a round trip after it was written, instead of a watch tick plus a read
    /// (one and a half), which on a long link is most of a change's latency. `doc_ids` jobs
    /// (many jobs on one busy source, each reading a few documents) stay on the watch.
    pub(crate) async fn run_watched(
        &mut self,
        watches: &Watches,
        mut since: Value,
        tx: mpsc::Sender<Batch>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<()> {
        let (client, beat) = (self.client.clone(), self.heartbeat());
        let watch = watches.subscribe(self.client.endpoint(), |sink| {
            watch_follower::start(client, beat, sink)
        });
        let watch = &*watch;
        let mut ticks = watch.ticks();
        // The tick is taken before each read, so a change during a read wakes the wait
        // after it at once.
        let mut seen = *ticks.borrow_and_update();
        let mut failures = 0u32;
        let mut wait = reconnect_backoff();
        let reader_stop = stop.clone();
        let doc_ids: Option<HashSet<String>> = match &self.opts.filter {
            Filter::DocIds(ids) => Some(ids.iter().cloned().collect()),
            _ => None,
        };
        let mut must_read = true;
        let (mut busy, mut last_read) = (0u32, tokio::time::Instant::now());
        loop {
            if !must_read {
                let woken = (&mut ticks, &mut seen, watch);
                match self.wait_change(woken, &since, &doc_ids, stop, &tx).await? {
                    Wake::Read => must_read = true,
                    Wake::Skip => {}
                    Wake::Stop => return Ok(()),
                }
                continue;
            }
            let stream = busy >= BUSY_READS && doc_ids.is_none();
            if stream {
                // Ticks of changes the feed will carry must not wake a read after it.
                seen = *ticks.borrow_and_update();
                busy = 0;
            }
            let read = tokio::select! {
                r = self.read_or_stream(stream, &mut since, &tx, &reader_stop) => r,
                _ = stop.wait_for(|s| *s) => return Ok(()),
            };
            match read {
                Ok(found) => {
                    failures = 0;
                    wait.reset();
                    let quick = last_read.elapsed() < BUSY_GAP;
                    busy = if found && !stream {
                        if quick { busy + 1 } else { 1 }
                    } else {
                        0
                    };
                    last_read = tokio::time::Instant::now();
                }
                Err(e) if e.ends_feed() => {
                    return Err(e);
                }
                Err(e) => {
                    failures += 1;
                    if failures > self.opts.retries_per_request {
                        return Err(e.into_changes_failure());
                    }
                    tracing::debug!(error = %e, "changes read failed, retrying");
                    tokio::select! {
                        _ = wait.wait() => {}
                        _ = stop.wait_for(|s| *s) => return Ok(()),
                    }
                    continue;
                }
            }
            must_read = false;
        }
    }

    /// Waits for the watch's next tick and says whether it calls for a read: a blind spot
    /// or a break of the watch's feed, or a change to a document this job reads (with a
    /// `doc_ids` filter, changes to other documents are skipped while the watch still knows
    /// their ids). Errors if the source is gone.
    async fn wait_change(
        &self,
        (ticks, seen, watch): (&mut watch::Receiver<Tick>, &mut Tick, &Watch),
        since: &Value,
        doc_ids: &Option<HashSet<String>>,
        stop: &mut watch::Receiver<bool>,
        tx: &mpsc::Sender<Batch>,
    ) -> Result<Wake> {
        if tx.is_closed() || *stop.borrow() {
            return Ok(Wake::Stop);
        }
        tokio::select! {
            r = ticks.changed() => if r.is_err() {
                return Err(ReplicationError::ChangesReqFailed(format!(
                    "{}: the change watch ended", self.client.endpoint()
                )));
            },
            _ = stop.wait_for(|s| *s) => return Ok(Wake::Stop),
            _ = tx.closed() => return Ok(Wake::Stop),
        }
        let now = *ticks.borrow_and_update();
        let before = std::mem::replace(seen, now);
        if now.breaks != before.breaks {
            self.check_same_source(since).await?;
        }
        let relevant = match doc_ids {
            Some(ids) if now.blind == before.blind && now.breaks == before.breaks => watch
                .any_changed(before.changes, now.changes, |id| ids.contains(id))
                .unwrap_or(true),
            _ => true,
        };
        Ok(if relevant { Wake::Read } else { Wake::Skip })
    }

    /// A busy job's own continuous feed until the source is quiet (`stream`), else
    /// [`Self::read_new`]; true when it found changes.
    async fn read_or_stream(
        &mut self,
        stream: bool,
        since: &mut Value,
        tx: &mpsc::Sender<Batch>,
        stop: &watch::Receiver<bool>,
    ) -> Result<bool> {
        if stream {
            let (_gone, progressed) = self.stream_once(since, tx, Some(BUSY_QUIET)).await?;
            return Ok(progressed);
        }
        self.read_new(since, tx, stop).await
    }

    /// Reads what is new since `since`: one page through the endpoint's gate (wake-ups come
    /// in bursts, one read per waiting job), then, if the page was full, the rest streamed.
    /// True when it found changes.
    async fn read_new(
        &mut self,
        since: &mut Value,
        tx: &mpsc::Sender<Batch>,
        stop: &watch::Receiver<bool>,
    ) -> Result<bool> {
        let (full, found) = self.read_page(since, tx).await?;
        if full && !tx.is_closed() {
            self.stream_normal(since, tx, stop).await?;
        }
        Ok(found)
    }

    /// One buffered page of at most `worker_batch_size` rows from `since`, emitted as a
    /// batch; (whether it was full, so more may follow; whether it held changes).
    async fn read_page(
        &mut self,
        since: &mut Value,
        tx: &mpsc::Sender<Batch>,
    ) -> Result<(bool, bool)> {
        let max = self.opts.worker_batch_size.max(1);
        let (rows, last) = self.read_normal_page(since, max, false).await?;
        let full = rows.len() >= max;
        let changes: Vec<Change> = rows.into_iter().filter_map(|r| self.to_change(r)).collect();
        // A page with nothing for this job moves its sequence only once a heartbeat period
        // has passed since it last moved, as a continuous feed's `last_seq` comes once per
        // `timeout`: each move is a checkpoint to write, and a job whose source changes
        // elsewhere would otherwise write one every turn. Reading again from the older
        // sequence finds the same (no) changes.
        let found = !changes.is_empty();
        let quiet = !found && self.moved.elapsed() < self.heartbeat();
        if !quiet && (found || last != *since) {
            self.moved = tokio::time::Instant::now();
            if !self.emit(tx, changes, last.clone()).await {
                return Ok((false, found));
            }
            *since = last;
        }
        Ok((full, found))
    }
}
