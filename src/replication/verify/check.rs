//! The verification run: opens both databases, streams the source's changes feed from the
//! start (`style=all_docs`, or `main_only` with `winning_revs_only`) through the replication's
//! own changes reader, and lets `workers` tasks take its batches: `_revs_diff` on the target
//! for every leaf, then (deep) `_bulk_get` on both sides for the leaves the target holds.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;

use super::deep;
use super::report::{FIRST_IDS, MissingDoc, Progress, Tally, VerifyReport};
use crate::replication::changes::reader::{Batch, ChangesReader};
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::HttpClient;
use crate::replication::pipeline::revs_diff::revs_diff;
use crate::replication::pipeline::run::{Context, clients, open_db};
use crate::replication::pipeline::stats::Counters;
use crate::replication::{Filter, ReplicationSpec};

/// How a verification runs.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Also compare bodies and attachment digests/encodings of the leaves.
    pub deep: bool,
    /// Live counts for a progress display.
    pub progress: Option<Arc<Progress>>,
}

/// Verifies that `spec.target` holds every selected leaf of `spec.source`. The spec's
/// filter, `winning_revs_only`, batch size, worker count and connection options apply; its
/// `since_seq`, `continuous` and checkpoints do not (the whole feed is always read).
pub async fn verify(
    spec: &ReplicationSpec,
    ctx: &Context,
    opts: &VerifyOptions,
) -> Result<VerifyReport> {
    let mut spec = spec.clone();
    spec.options.continuous = false;
    // A named filter reads its code on the source; `_doc_ids` needs no feed at all but
    // the reader's POST form handles it the same way as a replication does.
    if let Filter::Named { name, .. } = &spec.options.filter
        && !name.contains('/')
    {
        return Err(ReplicationError::InvalidOptions(format!(
            "filter `{name}` is not `ddoc/name`"
        )));
    }
    let (src, tgt) = clients(&spec, ctx)?;
    let (info, _) = tokio::try_join!(open_db(&src), open_db(&tgt))?;
    if let (Some(p), Filter::None) = (&opts.progress, &spec.options.filter) {
        let n = |k: &str| info.get(k).and_then(Value::as_u64).unwrap_or(0);
        p.total
            .store(n("doc_count") + n("doc_del_count"), Ordering::Relaxed);
    }
    let workers = spec.options.worker_processes.max(1);
    let (tx, rx) = mpsc::channel::<Batch>(workers * 2);
    let reader = ChangesReader::new(
        src.clone(),
        spec.options.clone(),
        Arc::new(Counters::default()),
        Arc::new(|_: &Batch| {}),
    );
    // Pages of a few batches: the source builds the next while the workers check this one.
    let page = spec.options.worker_batch_size.max(1) * workers * 4;
    let mut set: JoinSet<Result<Tally>> = JoinSet::new();
    let rx = Arc::new(Mutex::new(rx));
    for _ in 0..workers {
        let (src, tgt, rx) = (src.clone(), tgt.clone(), rx.clone());
        let (deep, progress) = (opts.deep, opts.progress.clone());
        set.spawn(async move { worker(&src, &tgt, &rx, deep, progress.as_deref()).await });
    }
    let feed = reader.run_paged(Value::from(0), page, tx).await;
    let mut report = VerifyReport {
        source: spec.source.to_string(),
        target: spec.target.to_string(),
        deep: opts.deep,
        ..VerifyReport::default()
    };
    let mut failure = feed.err();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(t)) => report.absorb(t),
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(e) => failure = failure.or(Some(ReplicationError::WorkerDied(e.to_string()))),
        }
        if failure.is_some() {
            set.abort_all();
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    sort_first(&mut report);
    report.conclude();
    Ok(report)
}

/// Workers finish in any order: name the first ids alphabetically so two runs agree.
fn sort_first(r: &mut VerifyReport) {
    r.first_missing.sort_by(|a, b| a.id.cmp(&b.id));
    r.first_different
        .sort_by(|a, b| (&a.id, &a.rev).cmp(&(&b.id, &b.rev)));
}

/// Takes batches until the feed ends; returns everything this worker found.
async fn worker(
    src: &HttpClient,
    tgt: &HttpClient,
    rx: &Mutex<mpsc::Receiver<Batch>>,
    deep: bool,
    progress: Option<&Progress>,
) -> Result<Tally> {
    let mut all = Tally::default();
    loop {
        let next = { rx.lock().await.recv().await };
        let Some(batch) = next else { return Ok(all) };
        let t = check_batch(src, tgt, &batch, deep).await?;
        if let Some(p) = progress {
            p.record(&t);
        }
        all.merge(t);
    }
}

/// One batch: `_revs_diff` for every leaf, then (deep) a comparison of the present ones.
async fn check_batch(
    src: &HttpClient,
    tgt: &HttpClient,
    batch: &Batch,
    deep: bool,
) -> Result<Tally> {
    let mut t = Tally {
        docs: batch.changes.len() as u64,
        leaves: batch.changes.iter().map(|c| c.revs.len() as u64).sum(),
        ..Tally::default()
    };
    if batch.changes.is_empty() {
        return Ok(t);
    }
    let missing = revs_diff(tgt, &batch.changes).await?;
    if deep {
        let absent: HashSet<(&str, &str)> = missing
            .iter()
            .flat_map(|m| m.revs.iter().map(|r| (m.id.as_str(), r.as_str())))
            .collect();
        let present: Vec<(String, String)> = batch
            .changes
            .iter()
            .flat_map(|c| c.revs.iter().map(move |r| (c.id.as_str(), r.as_str())))
            .filter(|leaf| !absent.contains(leaf))
            .map(|(id, rev)| (id.to_owned(), rev.to_owned()))
            .collect();
        t.compared = present.len() as u64;
        let different = deep::compare(src, tgt, &present).await?;
        t.leaves_different = different.len() as u64;
        t.different = different.into_iter().take(FIRST_IDS).collect();
    }
    t.docs_missing = missing.len() as u64;
    t.leaves_missing = missing.iter().map(|m| m.revs.len() as u64).sum();
    t.missing = missing
        .into_iter()
        .take(FIRST_IDS)
        .map(|m| MissingDoc {
            id: m.id,
            revs: m.revs,
        })
        .collect();
    Ok(t)
}
