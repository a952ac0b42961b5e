//! The adaptive pipeline against real pouchdb-servers: the window of batches in flight grows
//! on a slow link (the shared relay with a round trip), shrinks on 429s and on timeouts (the
//! fault proxy), keeps fetched bytes under the cap with large documents, and the checkpoint
//! never covers a batch the target has not written while later ones are done (a target write
//! held back, so batches finish out of order).

use std::time::Duration;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::relay::{Link, Relay};
use crate::support::server::PouchServer;
use crate::support::{deadline, wait_for};
use axum::http::Method;
use couch_replicator::replication::{
    Context, Endpoint, InFlightStats, ReplicationSpec, ReplicationStats, start,
};
use serde_json::{Value, json};

fn spec_between(src: &str, tgt: &str) -> ReplicationSpec {
    ReplicationSpec::new(Endpoint::parse(src).unwrap(), Endpoint::parse(tgt).unwrap())
}

/// Runs `spec` to its end; the stats and the window's statistics.
async fn run(spec: ReplicationSpec, ctx: Context, what: &str) -> (ReplicationStats, InFlightStats) {
    let job = start(spec, ctx);
    let in_flight = job.in_flight();
    let stats = deadline(60, what, job.wait())
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let w = *in_flight.lock().unwrap();
    (stats, w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_grows_on_a_slow_link() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("w", 1200)).await;
    let relay = Relay::with_link(a.port(), Link::rtt(Duration::from_millis(60)))
        .await
        .unwrap();
    let mut s = spec_between(&relay.url("src"), &relay.url("tgt"));
    s.options.worker_processes = 2;
    s.options.worker_batch_size = 25;
    s.options.http_connections = 12;
    let (stats, w) = run(s, Context::default(), "replication over a 60 ms link").await;
    assert_eq!(stats.docs_written, 1200, "{stats:?}");
    c.assert_same("src", &c, "tgt").await;
    assert!(w.grows >= 1 && w.peak_limit > 2, "{w:?}");
    assert!(
        w.peak_limit <= 12,
        "http_connections bounds the window: {w:?}"
    );
}

/// A server with `src` (`n` docs of `text_len` bytes) and an empty `tgt`, and the fault proxy.
async fn behind_proxy(n: usize, text_len: usize) -> (PouchServer, Couch, FaultProxy) {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    let docs: Vec<Value> = (0..n)
        .map(|i| json!({"_id": format!("d{i:05}"), "n": i, "text": "x".repeat(text_len)}))
        .collect();
    for chunk in docs.chunks(100) {
        c.bulk_insert("src", chunk).await;
    }
    let p = FaultProxy::start(&a.root()).await;
    (a, c, p)
}

fn proxied(p: &FaultProxy, batch: usize, workers: usize) -> ReplicationSpec {
    let mut s = spec_between(&p.db_url("src"), &p.db_url("tgt"));
    s.options.worker_processes = workers;
    s.options.worker_batch_size = batch;
    s.options.http_connections = workers;
    s.options.connection_timeout = Duration::from_millis(800);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_shrinks_on_429() {
    let (_a, c, p) = behind_proxy(400, 10).await;
    p.add(Rule::new(Some(Method::POST), "/tgt/_bulk_docs", 2, Fault::Status(429)).skip(1));
    let (stats, w) = run(proxied(&p, 20, 8), Context::default(), "through 429s").await;
    assert_eq!(stats.docs_written, 400, "{stats:?}");
    c.assert_same("src", &c, "tgt").await;
    assert_eq!(p.fired(), vec![2]);
    assert!(w.shrinks >= 1, "{w:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_shrinks_on_timeouts() {
    let (_a, c, p) = behind_proxy(400, 10).await;
    // Stalls past the inactivity timeout: the request times out and is retried.
    p.add(
        Rule::new(
            Some(Method::POST),
            "/src/_bulk_get",
            1,
            Fault::Stall(Duration::from_secs(2)),
        )
        .skip(2),
    );
    let (stats, w) = run(proxied(&p, 20, 8), Context::default(), "through a timeout").await;
    assert_eq!(stats.docs_written, 400, "{stats:?}");
    c.assert_same("src", &c, "tgt").await;
    assert_eq!(p.fired(), vec![1]);
    assert!(w.shrinks >= 1, "{w:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_bytes_stay_under_the_cap_with_large_documents() {
    // 48 documents of ~100 KB, 4 to a batch (~400 KB), a cap of 1 MB: at most two batches
    // at once although the window alone would allow eight.
    let (_a, c, p) = behind_proxy(48, 100_000).await;
    let cap = 1_000_000;
    let ctx = Context {
        in_flight_bytes: cap,
        ..Context::default()
    };
    let (stats, w) = run(proxied(&p, 4, 8), ctx, "large documents").await;
    assert_eq!(stats.docs_written, 48, "{stats:?}");
    c.assert_same("src", &c, "tgt").await;
    // Estimates come from the documents already fetched, so a batch may come in a little
    // above its estimate; never far.
    assert!(w.peak_bytes <= cap + cap / 4, "{w:?}");
    assert!(w.peak_bytes >= 400_000, "the documents were counted: {w:?}");
}

/// The `source_last_seq` of the checkpoint on the target, if one was written.
async fn checkpointed_seq(c: &Couch, p: &FaultProxy) -> Option<u64> {
    let put = p
        .requests_to("/tgt/_local/")
        .into_iter()
        .find(|r| r.method == Method::PUT)?;
    let path = put.path.split('?').next()?.trim_start_matches("/tgt/");
    let (status, doc) = c.get_doc("tgt", path).await;
    assert_eq!(status, 200, "{doc}");
    doc["source_last_seq"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_never_passes_a_batch_the_target_has_not_written() {
    let (_a, c, p) = behind_proxy(400, 10).await;
    // The target holds back its third `_bulk_docs` until told; the others answer at once,
    // and one answers slowly, so batches finish out of order.
    let (open, held) = tokio::sync::watch::channel(false);
    p.add(Rule::new(Some(Method::POST), "/tgt/_bulk_docs", 1, Fault::Hold(held)).skip(2));
    p.add(
        Rule::new(
            Some(Method::POST),
            "/tgt/_bulk_docs",
            1,
            Fault::Stall(Duration::from_millis(300)),
        )
        .skip(3),
    );
    let mut s = proxied(&p, 25, 6);
    s.options.checkpoint_interval = Duration::from_millis(100);
    s.options.connection_timeout = Duration::from_secs(30);
    let job = start(s, Context::default());
    // Every batch but the held one is written.
    wait_for(30, "all but the held batch written", || async {
        let (_, info) = c.db_info("tgt").await;
        (info["doc_count"].as_u64() == Some(375)).then_some(())
    })
    .await;
    // The held batch: the lowest source sequence among its documents.
    let held_body = p
        .requests_to("/tgt/_bulk_docs")
        .into_iter()
        .find(|r| r.fault.as_deref().is_some_and(|f| f.starts_with("Hold")))
        .expect("the held request")
        .body;
    let held: Value = serde_json::from_slice(&held_body).unwrap();
    let ids: Vec<&str> = held["docs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["_id"].as_str())
        .collect();
    let (_, changes) = c.get_doc("src", "_changes").await;
    let first_held = changes["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| ids.contains(&r["id"].as_str().unwrap_or_default()))
        .filter_map(|r| r["seq"].as_u64())
        .min()
        .expect("sequences of the held documents");
    // Several checkpoint intervals pass while the later batches are done.
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Every batch before the held one is written, so the checkpoint stands right before it
    // (nowhere, when the held batch is the first), however far the later ones are.
    let expected = (first_held > 1).then(|| first_held - 1);
    assert_eq!(
        checkpointed_seq(&c, &p).await,
        expected,
        "the held batch starts at sequence {first_held}"
    );
    open.send(true).unwrap();
    let stats = deadline(30, "the end after the release", job.wait())
        .await
        .unwrap();
    assert_eq!(stats.docs_written, 400, "{stats:?}");
    c.assert_same("src", &c, "tgt").await;
    let last = changes["last_seq"].as_u64().unwrap();
    assert_eq!(checkpointed_seq(&c, &p).await, Some(last));
}

/// The continuous feed requests (`style=` marks a job's own; the shared watch sends none).
fn own_feeds(p: &FaultProxy) -> usize {
    p.requests_to("_changes?feed=continuous&style=").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_job_streams_its_own_feed_while_its_source_is_busy() {
    use couch_replicator::replication::Transports;
    let (_a, c, p) = behind_proxy(0, 0).await;
    let ctx = Context {
        transports: Some(std::sync::Arc::new(Transports::new(
            Duration::from_secs(30),
            4,
            8,
        ))),
        ..Context::default()
    };
    let mut s = spec_between(&p.db_url("src"), &p.db_url("tgt"));
    s.options.continuous = true;
    let job = start(s, ctx);
    let arrived = |n: u64| {
        let c = c.clone();
        async move {
            let (_, info) = c.db_info("tgt").await;
            (info["doc_count"].as_u64() == Some(n)).then_some(())
        }
    };
    // Quiet: writes a second and a half apart are read through the watch, one read each.
    for i in 0..2u64 {
        c.put_doc("src", &format!("quiet{i}"), &json!({})).await;
        wait_for(20, "a quiet write copied", || arrived(i + 1)).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert_eq!(
        own_feeds(&p),
        0,
        "a quiet source gets no feed of the job's own"
    );
    // Busy: a write every 50 ms for 1.5 s.
    for i in 0..30u64 {
        c.put_doc("src", &format!("busy{i:02}"), &json!({"n": i}))
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for(20, "every busy write copied", || arrived(32)).await;
    assert_eq!(
        own_feeds(&p),
        1,
        "a busy source gets one feed of the job's own"
    );
    // The feed closes once the source is quiet again: the next write is read through the
    // watch (a normal read), not carried by a feed still open.
    let reads = || p.requests_to("_changes?feed=normal").len();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let before = reads();
    c.put_doc("src", "after", &json!({})).await;
    wait_for(20, "a write after the busy spell copied", || arrived(33)).await;
    assert!(
        reads() > before,
        "the write after the busy spell was read through the watch"
    );
    assert_eq!(own_feeds(&p), 1, "no new feed for a single write");
    job.stop();
    let stats = deadline(20, "the job stops", job.wait()).await.unwrap();
    assert_eq!(stats.docs_written, 33, "{stats:?}");
}
