//! Checkpoints and continuous mode against real pouchdb-servers: a second one-shot run only
//! transfers new changes; a run stopped midway resumes from its checkpoint (checked on the
//! wire through the proxy); a continuous replication picks up writes made after it started.

use std::time::Duration;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::proxy::FaultProxy;
use crate::support::server::PouchServer;
use crate::support::{deadline, wait_for};
use couch_replicator::replication::{Context, Endpoint, ReplicationSpec, replicate, start};
use serde_json::Value;

fn spec(src: &str, tgt: &str) -> ReplicationSpec {
    ReplicationSpec::new(Endpoint::parse(src).unwrap(), Endpoint::parse(tgt).unwrap())
}

/// Revisions the replicator fetched with `_bulk_get`, from the proxy log (`_revs_diff` may be
/// skipped by the engine when the target is missing everything).
fn revs_fetched(p: &FaultProxy) -> usize {
    p.requests_to("_bulk_get")
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            v["docs"].as_array().unwrap().len()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_run_transfers_only_new_changes() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("a", 300)).await;
    let s = spec(&a.db_url("src"), &a.db_url("tgt"));
    let first = deadline(30, "first run", replicate(s.clone(), Context::default()))
        .await
        .unwrap();
    assert_eq!(first.revisions_checked, 300);
    assert_eq!(first.checkpointed_source_seq, serde_json::json!(300));
    c.bulk_insert("src", &numbered_docs("b", 40)).await;
    let second = deadline(30, "second run", replicate(s, Context::default()))
        .await
        .unwrap();
    assert_eq!(second.replication_id, first.replication_id);
    assert_eq!(
        second.revisions_checked - first.revisions_checked,
        40,
        "{second:?}"
    );
    assert_eq!(second.docs_read - first.docs_read, 40, "{second:?}");
    assert_eq!(second.docs_written, 340);
    c.assert_same("src", &c, "tgt").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_run_resumes_from_its_checkpoint() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("d", 3000)).await;
    let p = FaultProxy::start(&a.root()).await;
    let mut s = spec(&p.db_url("src"), &a.db_url("tgt"));
    s.options.worker_batch_size = 100;
    s.options.worker_processes = 1;
    // The pipeline window may hold up to `http_connections` batches in flight; one here, so
    // at most one batch abandoned by the stop can have reached the target (checked below).
    s.options.http_connections = 1;
    let h = start(s.clone(), Context::default());
    let mut progress = h.progress();
    deadline(30, "500 docs written before the stop", async {
        while progress.borrow().docs_written < 500 {
            progress.changed().await.unwrap();
        }
    })
    .await;
    h.stop();
    let stopped = deadline(30, "the stop", h.wait()).await.unwrap();
    let through = stopped
        .checkpointed_source_seq
        .as_u64()
        .expect("numeric checkpoint");
    assert!(
        (500..3000).contains(&through),
        "checkpoint at {through}: {stopped:?}"
    );
    assert_eq!(stopped.through_seq, stopped.checkpointed_source_seq);
    let before = revs_fetched(&p);
    let changes_before = p.requests_to("_changes").len();

    let done = deadline(60, "the resumed run", replicate(s, Context::default()))
        .await
        .unwrap();
    let resumed = &p.requests_to("_changes")[changes_before];
    assert!(
        resumed.path.contains(&format!("since={through}")),
        "resumed from {through}? {}",
        resumed.path
    );
    // Batches abandoned by the stop may have reached the target already: `_revs_diff` then
    // drops them, so at most one in-flight batch (100 revs) fewer is fetched.
    let fetched = revs_fetched(&p) - before;
    let after = 3000 - through as usize;
    assert!(
        fetched <= after && fetched + 100 >= after,
        "fetched {fetched} revs after resuming at {through}"
    );
    assert_eq!(done.checkpointed_source_seq, serde_json::json!(3000));
    c.assert_same("src", &c, "tgt").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_picks_up_later_writes() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("early", 20)).await;
    let mut s = spec(&a.db_url("src"), &a.db_url("tgt"));
    s.options.continuous = true;
    s.options.checkpoint_interval = Duration::from_millis(300);
    let h = start(s, Context::default());
    let count = |want: u64| {
        let c = c.clone();
        move || {
            let c = c.clone();
            async move {
                let (_, info) = c.db_info("tgt").await;
                (info["doc_count"].as_u64() == Some(want)).then_some(())
            }
        }
    };
    wait_for(30, "the 20 early docs on the target", count(20)).await;
    c.bulk_insert("src", &numbered_docs("late", 15)).await;
    wait_for(30, "the 15 later docs on the target", count(35)).await;
    assert!(h.stats().continuous);
    wait_for(30, "a checkpoint at seq 35", || {
        let st = h.stats();
        async move { (st.checkpointed_source_seq == serde_json::json!(35)).then_some(()) }
    })
    .await;
    h.stop();
    let end = deadline(30, "continuous stop", h.wait()).await.unwrap();
    assert_eq!(end.docs_written, 35);
    c.assert_same("src", &c, "tgt").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_fails_when_the_target_instance_changed() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("i", 10)).await;
    let p = FaultProxy::start(&a.root()).await;
    let mut s = spec(&a.db_url("src"), &p.db_url("tgt"));
    s.options.continuous = true;
    s.options.checkpoint_interval = Duration::from_millis(200);
    let h = start(s, Context::default());
    wait_for(30, "a first checkpoint at seq 10", || {
        let st = h.stats();
        async move { (st.checkpointed_source_seq == serde_json::json!(10)).then_some(()) }
    })
    .await;
    // The target now reports another instance (as after a re-creation or a restart).
    let body = bytes::Bytes::from(r#"{"ok":true,"instance_start_time":"42"}"#);
    p.add(crate::support::proxy::Rule::new(
        None,
        "/tgt/_ensure_full_commit",
        100,
        crate::support::proxy::Fault::Respond(201, "application/json".into(), body),
    ));
    c.bulk_insert("src", &numbered_docs("j", 5)).await;
    let err = deadline(30, "the checkpoint failure", h.wait())
        .await
        .expect_err("a changed instance_start_time must fail the checkpoint");
    assert_eq!(err.reason(), "checkpoint_commit_failure", "{err}");
    assert!(err.to_string().contains("instance_start_time"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_seq_overrides_the_checkpoint_and_keeps_its_counters() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("a", 30)).await;
    let s = spec(&a.db_url("src"), &a.db_url("tgt"));
    let first = deadline(30, "first run", replicate(s.clone(), Context::default()))
        .await
        .unwrap();
    assert_eq!(first.revisions_checked, 30);
    // Same id (since_seq is not part of it), but the run starts at since_seq: every
    // revision is checked again, counted on top of the checkpoint's (as CouchDB 3.4 does).
    let mut again = s.clone();
    again.options.since_seq = Some(serde_json::json!(0));
    let second = deadline(30, "since_seq run", replicate(again, Context::default()))
        .await
        .unwrap();
    assert_eq!(second.replication_id, first.replication_id);
    assert_eq!(second.revisions_checked, 60, "{second:?}");
}

/// A target the replication creates holds no checkpoint: the start reads only the source's
/// current checkpoint document (for the revision the first checkpoint replaces), none on the
/// target, and asks it no `_revs_diff`. A re-created target is filled from scratch, and the source's checkpoint left by
/// the first run is replaced, not refused as a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_target_is_filled_from_scratch_without_looking_for_checkpoints() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.bulk_insert("src", &numbered_docs("a", 50)).await;
    let proxy = FaultProxy::start(&a.root()).await;
    let mut s = spec(&proxy.db_url("src"), &proxy.db_url("tgt"));
    s.options.create_target = true;
    for round in 0..2 {
        let before = proxy.requests_to("_local/").len();
        let diffs_before = proxy.requests_to("/tgt/_revs_diff").len();
        let done = deadline(30, "run", replicate(s.clone(), Context::default()))
            .await
            .unwrap();
        assert_eq!(done.docs_written, 50, "round {round}: {done:?}");
        let reads: Vec<String> = proxy.requests_to("_local/")[before..]
            .iter()
            .filter(|r| r.method == reqwest::Method::GET)
            .map(|r| r.path.clone())
            .collect();
        assert_eq!(reads.len(), 1, "round {round}: checkpoint reads {reads:?}");
        assert!(reads[0].starts_with("/src/"), "{reads:?}");
        // Nor is the created target asked which revisions it lacks: all of them.
        let diffs = proxy.requests_to("/tgt/_revs_diff").len() - diffs_before;
        assert_eq!(diffs, 0, "round {round}: _revs_diff into a created target");
        c.assert_same("src", &c, "tgt").await;
        assert_eq!(c.delete_db("tgt").await, 200);
    }
}
