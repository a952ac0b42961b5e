//! The workers' side of the pipeline (CouchDB's couch_replicator_worker.erl): what one worker
//! does with a batch of changes (`_revs_diff`, then `_bulk_get` plus a multipart one for
//! small attachments, kept encoded, plus individual fetches, then `_bulk_docs` and
//! `multipart/related` PUTs). The state the workers share with the changes reader and the
//! run loop (the checkpoint's tracker, the window, the counters) is `shared.rs`.

use std::sync::Arc;
use tokio::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::bulk_related::bulk_get_related;
use super::fetch::{Fetched, Wanted, bulk_get};
use super::open_revs::open_revs;
use super::revs_diff::{all_missing, revs_diff};
use super::shared::{Shared, lock};
use super::stats::Counters;
use super::write::{BULK_DOCS_BUFFER, WriteResult, put_json, put_multipart, write_docs};
use crate::replication::changes::reader::Batch;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::budget::UNBUDGETED_BYTES;
use crate::replication::http::client::HttpClient;
use crate::replication::pipeline::in_flight::Load;
use crate::telemetry::NodeMetrics;

/// Concurrent individual fetches per worker.
const INDIVIDUAL_FETCHES: usize = 4;

/// Concurrent `PUT`s per worker of documents fetched in bulk with their attachments (each is
/// one request to the target, so a few in flight keep it busy).
const RELATED_WRITES: usize = 8;

/// One worker: waits for room in the window, takes the next batch off the shared queue
/// (with the small ones queued behind it, up to `worker_batch_size` changes: a busy
/// continuous feed hands out a batch per chunk), copies it and gives the room back, until the
/// reader closes the queue.
pub(crate) async fn worker(
    sh: Arc<Shared>,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Batch>>>,
) -> Result<()> {
    let size = sh.spec.options.worker_batch_size.max(1);
    loop {
        let mut booked = admit(&sh, size).await;
        let (taken, backlog) = take(&rx, size).await;
        let Some(batch) = merge(&taken) else {
            lock(&sh.in_flight).release(booked);
            sh.in_flight_moved.notify_waiters();
            return Ok(());
        };
        let started = Instant::now();
        let exact = lock(&sh.in_flight).estimate(batch.changes.len());
        lock(&sh.in_flight).fetched(booked, 0, exact);
        booked = exact;
        let written = process(&sh, &batch, &mut booked).await?;
        {
            let mut tracker = lock(&sh.tracker);
            for b in &taken {
                tracker.complete(b.index);
            }
        }
        let load = Load {
            congestion: sh.src.congestion() + sh.tgt.congestion(),
            backlog,
        };
        let stats = {
            let mut w = lock(&sh.in_flight);
            w.done(booked, written, (started, Instant::now()), load);
            w.stats()
        };
        *lock(&sh.in_flight_stats) = stats;
        sh.in_flight_moved.notify_waiters();
        sh.moved.notify_one();
    }
}

/// Waits until the window admits a batch of `size` changes; returns the bytes booked.
async fn admit(sh: &Shared, size: usize) -> u64 {
    loop {
        let moved = sh.in_flight_moved.notified();
        tokio::pin!(moved);
        moved.as_mut().enable();
        {
            let mut w = lock(&sh.in_flight);
            let bytes = w.estimate(size);
            if w.try_admit(bytes) {
                return bytes;
            }
        }
        moved.await;
    }
}

/// The next batch and the ones queued right behind it, up to `size` changes in all, and
/// whether work was waiting (more than one batch queued: the window held it back).
async fn take(rx: &tokio::sync::Mutex<mpsc::Receiver<Batch>>, size: usize) -> (Vec<Batch>, bool) {
    let mut rx = rx.lock().await;
    let Some(first) = rx.recv().await else {
        return (Vec::new(), false);
    };
    let mut n = first.changes.len();
    let mut taken = vec![first];
    while n < size {
        match rx.try_recv() {
            Ok(b) if n + b.changes.len() <= size => {
                n += b.changes.len();
                taken.push(b);
            }
            Ok(b) => {
                // A batch cannot go back on the queue, so this one joins anyway: a merged
                // batch stays under twice `size`.
                taken.push(b);
                break;
            }
            Err(_) => break,
        }
    }
    let backlog = taken.len() > 1 || !rx.is_empty();
    (taken, backlog)
}

/// One batch of the changes of `taken`, ending at the last one's sequence.
fn merge(taken: &[Batch]) -> Option<Batch> {
    let last = taken.last()?;
    if taken.len() == 1 {
        return Some(last.clone());
    }
    Some(Batch {
        index: last.index,
        changes: taken.iter().flat_map(|b| b.changes.clone()).collect(),
        last_seq: last.last_seq.clone(),
    })
}

/// Copies one batch: finds what the target lacks, fetches it (in bulk where the source
/// allows, else one by one) and writes it. `booked` follows the bytes the batch holds (the
/// window's byte cap); returns the documents written.
async fn process(sh: &Shared, batch: &Batch, booked: &mut u64) -> Result<u64> {
    if batch.changes.is_empty() {
        return Ok(0);
    }
    let c = &sh.counters;
    let wanted = missing_revisions(sh, batch).await?;
    if wanted.is_empty() {
        return Ok(0);
    }
    // Design documents are always fetched and written one by one (CouchDB's couch_replicator_worker.erl).
    let (design, wanted): (Vec<Wanted>, Vec<Wanted>) = wanted
        .into_iter()
        .partition(|w| w.id.starts_with("_design/"));
    let try_bulk = sh.spec.options.use_bulk_get && lock(&sh.bulk_get).should_try();
    let (mut docs, related, mut refetch) = if try_bulk && !wanted.is_empty() {
        fetch_in_bulk(sh, wanted).await?
    } else {
        (Vec::new(), Vec::new(), wanted)
    };
    let mut read = (docs.len() + related.len()) as u64;
    let held = held_bytes(&docs, &related);
    lock(&sh.in_flight).fetched(*booked, read as usize, held);
    *booked = held;
    let mut result = write_related(sh, related, &mut refetch).await?;
    refetch.extend(design);
    result += fetch_one_by_one(sh, refetch, &mut docs, &mut read).await?;
    Counters::add(&c.docs_read, read);
    result += write_docs(&sh.tgt, &docs).await?;
    Counters::add(&c.docs_written, result.written);
    Counters::add(&c.doc_write_failures, result.failures);
    NodeMetrics::add(&sh.metrics.docs_written, result.written);
    NodeMetrics::add(&sh.metrics.doc_write_failures, result.failures);
    Ok(result.written)
}

/// The bytes of documents fetched in bulk, as held until written.
fn held_bytes(docs: &[Bytes], related: &[(Wanted, Fetched)]) -> u64 {
    let json: usize = docs.iter().map(Bytes::len).sum();
    let with_atts: usize = related
        .iter()
        .map(|(_, f)| match f {
            Fetched::Json(b) => b.len(),
            Fetched::Multipart { json, parts, .. } => {
                json.len() + parts.iter().map(|(_, p)| p.len()).sum::<usize>()
            }
            Fetched::Written(_) => 0,
        })
        .sum();
    (json + with_atts) as u64
}

/// The revisions of the batch the target lacks (`_revs_diff`, unless the skipper has seen
/// the target lack nearly everything), counted as checked and found.
async fn missing_revisions(sh: &Shared, batch: &Batch) -> Result<Vec<Wanted>> {
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
    Ok(wanted)
}

/// Documents fetched in bulk: JSON ones for `_bulk_docs`, ones with attachment bodies (each
/// with the revision asked for) for `PUT ?new_edits=false`, and revisions left to fetch one
/// by one.
type InBulk = (Vec<Bytes>, Vec<(Wanted, Fetched)>, Vec<Wanted>);

/// `_bulk_get` for the wanted revisions (JSON, stubs only), then a multipart one for those
/// with small attachments, which come as stored (gzip-encoded ones stay so): the documents
/// ready to write, and the revisions left to fetch one by one (all of them when the source
/// has no usable `_bulk_get`).
async fn fetch_in_bulk(sh: &Shared, wanted: Vec<Wanted>) -> Result<InBulk> {
    let c = &sh.counters;
    let n = wanted.len();
    let mut out = bulk_get(&sh.src, wanted).await?;
    let failed = if out.supported { out.refetch.len() } else { n };
    lock(&sh.bulk_get).record(n, failed);
    if out.supported {
        Counters::add(&c.bulk_get_attempts, n as u64);
        Counters::add(&c.bulk_get_docs, out.docs.len() as u64);
    } else {
        tracing::debug!(source = %sh.spec.source, "_bulk_get unusable, fetching one by one");
    }
    let mut related = Vec::new();
    if !out.inline.is_empty() {
        let n = out.inline.len() as u64;
        let again =
            bulk_get_related(&sh.src, std::mem::take(&mut out.inline), sh.keep_encoding).await?;
        if again.supported {
            Counters::add(&c.bulk_get_attempts, n);
            Counters::add(
                &c.bulk_get_docs,
                (again.docs.len() + again.related.len()) as u64,
            );
        }
        out.docs.extend(again.docs);
        related = again.related;
        out.refetch.extend(again.refetch);
    }
    Ok((out.docs, related, out.refetch))
}

/// Writes documents fetched with their attachment bodies, a few at a time, each with
/// `PUT ?new_edits=false` as `multipart/related` (the attachments as they came: encoded ones
/// keep their encoding). A document the target refuses for a missing stub is not counted
/// but added to `refetch` without `atts_since`, to be fetched again in full.
async fn write_related(
    sh: &Shared,
    related: Vec<(Wanted, Fetched)>,
    refetch: &mut Vec<Wanted>,
) -> Result<WriteResult> {
    let tgt = &sh.tgt;
    let mut writes = futures::stream::iter(related)
        .map(|(w, doc)| async move {
            let r = match &doc {
                Fetched::Multipart { id, json, parts } => {
                    put_multipart(tgt, id, json, parts).await?
                }
                Fetched::Json(b) => put_json(tgt, &w.id, b).await?,
                Fetched::Written(r) => *r,
            };
            Ok::<_, ReplicationError>((w, r))
        })
        .buffer_unordered(RELATED_WRITES);
    let mut result = WriteResult::default();
    while let Some(done) = writes.next().await {
        let (w, r) = done?;
        if r.missing_stub > 0 {
            refetch.push(Wanted {
                atts_since: Vec::new(),
                ..w
            });
        } else {
            result += r;
        }
    }
    Ok(result)
}

/// Fetches the remaining revisions individually (`open_revs`, attachments streamed to the
/// target where possible), a few at a time. Small plain JSON documents join `docs` for one
/// `_bulk_docs`; the others are written by their fetch ([`write_unbatched`]). Every
/// document fetched counts in `read`.
async fn fetch_one_by_one(
    sh: &Shared,
    refetch: Vec<Wanted>,
    docs: &mut Vec<Bytes>,
    read: &mut u64,
) -> Result<WriteResult> {
    let mut result = WriteResult::default();
    let (src, tgt) = (sh.src.clone(), sh.tgt.clone());
    let retry_after = sh.spec.options.missing_doc_retry;
    let enc = sh.keep_encoding;
    let mut fetched = futures::stream::iter(refetch)
        .map(move |w| {
            let (src, tgt) = (src.clone(), tgt.clone());
            async move {
                let mut got = fetch_streamed(&src, &tgt, &w, enc).await?;
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
                    got = open_revs(&src, &again, None, enc).await?;
                }
                write_unbatched(&tgt, &w.id, got).await
            }
        })
        .buffered(INDIVIDUAL_FETCHES);
    let mut held: usize = docs.iter().map(Bytes::len).sum();
    while let Some(f) = fetched.next().await {
        let sorted = f?;
        *read += sorted.read;
        result += sorted.written;
        for b in sorted.batch {
            // Written as soon as they fill a `_bulk_docs` body: a batch of large documents
            // fetched one by one is not held whole (100 of 7.9 MB took the node to +824 MiB).
            held += b.len();
            docs.push(b);
            if held >= BULK_DOCS_BUFFER {
                result += write_docs(&sh.tgt, docs).await?;
                docs.clear();
                held = 0;
            }
        }
    }
    Ok(result)
}

/// One fetch's documents once [`write_unbatched`] has written what it writes.
struct Sorted {
    /// Documents fetched.
    read: u64,
    /// What was written already.
    written: WriteResult,
    /// Small plain JSON documents, left to gather into a `_bulk_docs`.
    batch: Vec<Bytes>,
}

/// Writes the documents of `got` that are not gathered into a `_bulk_docs`: design
/// documents, documents with attachments, and those that hold the node's response budget
/// (larger than the bytes every body reads free), in the fetch that read them. Returned in
/// order instead, one could wait behind an earlier fetch that waits for the very budget it
/// holds: with documents of 7.9 MB the same fetch waited 30 s three times over and the job
/// failed (`big_data` bench, 2026-11-29).
async fn write_unbatched(tgt: &HttpClient, id: &str, got: Vec<Fetched>) -> Result<Sorted> {
    let mut sorted = Sorted {
        read: got.len() as u64,
        written: WriteResult::default(),
        batch: Vec::new(),
    };
    let design = id.starts_with("_design/");
    for doc in got {
        sorted.written += match doc {
            Fetched::Json(b) if design => put_json(tgt, id, &b).await?,
            Fetched::Json(b) if b.len() as u64 > UNBUDGETED_BYTES => {
                write_docs(tgt, std::slice::from_ref(&b)).await?
            }
            Fetched::Json(b) => {
                sorted.batch.push(b);
                continue;
            }
            Fetched::Multipart { id, json, parts } => {
                put_multipart(tgt, &id, &json, &parts).await?
            }
            Fetched::Written(r) => r,
        };
    }
    Ok(sorted)
}

/// Streamed tries of one document at most, when each moved for a while before failing.
const STREAMED_TRIES: u32 = 3;

/// A streamed try that failed after this long is tried again streamed, not buffered.
const LONG_TRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Fetches a revision with its attachments streamed from source to target. A try that fails
/// at once is fetched again buffered (with the client's retries). One that failed after
/// moving for a while (a 1 GiB attachment the target gave up on: CouchDB's `fabric`
/// `request_timeout` bounds a document's whole upload) is tried again streamed, up to
/// [`STREAMED_TRIES`]: buffered, it would trip `max_response_bytes`.
async fn fetch_streamed(
    src: &HttpClient,
    tgt: &HttpClient,
    w: &Wanted,
    enc: bool,
) -> Result<Vec<Fetched>> {
    for attempt in 1..=STREAMED_TRIES {
        let started = Instant::now();
        match open_revs(src, w, Some(tgt), enc).await {
            Ok(g) => return Ok(g),
            Err(e) if attempt < STREAMED_TRIES && started.elapsed() >= LONG_TRY => {
                tracing::warn!(error = %e, attempt, "streamed fetch failed, trying it again");
                tokio::time::sleep(std::time::Duration::from_secs(u64::from(attempt))).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "streamed fetch failed, fetching buffered");
                break;
            }
        }
    }
    open_revs(src, w, None, enc).await
}
