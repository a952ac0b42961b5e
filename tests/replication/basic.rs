//! One-shot replication against real pouchdb-servers: 10,000 docs verified leaf by leaf,
//! updates and deletions, conflicts (several leaves written with `new_edits=false`), inline
//! attachments, `create_target`, and the error class of a missing database.

use crate::support::couch::{Couch, numbered_docs};
use crate::support::deadline;
use crate::support::server::PouchServer;
use base64::Engine as _;
use couch_replicator::replication::{
    Context, Endpoint, ErrorClass, ReplicationError, ReplicationSpec, replicate,
};
use serde_json::json;

fn spec(src: &str, tgt: &str) -> ReplicationSpec {
    ReplicationSpec::new(Endpoint::parse(src).unwrap(), Endpoint::parse(tgt).unwrap())
}

async fn run(s: ReplicationSpec, what: &str) -> couch_replicator::replication::ReplicationStats {
    deadline(60, what, replicate(s, Context::default()))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_docs_one_shot() {
    let (a, b) = tokio::join!(PouchServer::start(), PouchServer::start());
    let (ca, cb) = (Couch::new(&a.root()), Couch::new(&b.root()));
    ca.create_db("src").await;
    cb.create_db("tgt").await;
    ca.bulk_insert("src", &numbered_docs("doc-", 10_000)).await;
    // A generous deadline: the two servers share 2 cores with other test processes.
    let stats = deadline(
        120,
        "replicating 10,000 docs",
        replicate(spec(&a.db_url("src"), &b.db_url("tgt")), Context::default()),
    )
    .await
    .expect("replicating 10,000 docs");
    assert_eq!(stats.docs_written, 10_000, "{stats:?}");
    assert_eq!(stats.docs_read, 10_000);
    assert_eq!(stats.revisions_checked, 10_000);
    assert_eq!(stats.doc_write_failures, 0);
    let n = deadline(
        60,
        "comparing source and target",
        ca.assert_same("src", &cb, "tgt"),
    )
    .await;
    assert_eq!(n, 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_and_deletions_follow() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    let mut docs = numbered_docs("d", 60);
    let revs = c.bulk_insert("src", &docs).await;
    let first = run(
        spec(&a.db_url("src"), &a.db_url("tgt")),
        "first replication",
    )
    .await;
    // Update 20 docs, delete 10 others.
    for (i, d) in docs.iter_mut().enumerate().take(30) {
        d["_rev"] = json!(revs[i]);
        if i < 20 {
            d["text"] = json!("updated");
        } else {
            d["_deleted"] = json!(true);
        }
    }
    c.bulk_insert("src", &docs[..30]).await;
    let stats = run(
        spec(&a.db_url("src"), &a.db_url("tgt")),
        "second replication",
    )
    .await;
    // Stats are cumulative (seeded from the checkpoint history, as CouchDB does).
    assert_eq!(
        stats.docs_written - first.docs_written,
        30,
        "only the 30 changed docs: {stats:?}"
    );
    assert_eq!(stats.revisions_checked - first.revisions_checked, 30);
    c.assert_same("src", &c, "tgt").await;
    let (s, v) = c.get_doc("tgt", "d00025").await;
    assert_eq!(s, 404, "deleted doc still readable on target: {v}");
    let (s, v) = c.get_doc("tgt", "d00005").await;
    assert_eq!((s, v["text"].as_str()), (200, Some("updated")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_arrive_as_conflicts() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    let leaf = |id: &str, rev: &str, extra: serde_json::Value| {
        let mut d = json!({"_id": id, "_rev": format!("3-{rev}"),
            "_revisions": {"start": 3, "ids": [rev, format!("m{rev}"), "base"]}, "who": rev});
        if let (Some(o), Some(e)) = (d.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        d
    };
    let mut docs = Vec::new();
    for i in 0..20 {
        let id = format!("c{i:02}");
        docs.push(leaf(&id, "aaaa", json!({})));
        docs.push(leaf(&id, "bbbb", json!({})));
        docs.push(leaf(&id, "cccc", json!({"_deleted": true})));
    }
    c.bulk_no_edits("src", &docs).await;
    let stats = run(
        spec(&a.db_url("src"), &a.db_url("tgt")),
        "replicating conflicts",
    )
    .await;
    assert_eq!(stats.revisions_checked, 60, "{stats:?}");
    assert_eq!(stats.docs_written, 60, "{stats:?}");
    let n = c.assert_same("src", &c, "tgt").await;
    assert_eq!(n, 60);
    let (s, v) = c
        .get_doc("tgt", "c07?conflicts=true&deleted_conflicts=true")
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["_rev"], json!("3-bbbb"), "winner: {v}");
    assert_eq!(v["_conflicts"], json!(["3-aaaa"]), "{v}");
    let (_, on_src) = c
        .get_doc("src", "c07?conflicts=true&deleted_conflicts=true")
        .await;
    assert_eq!(v, on_src);

    // winning_revs_only: only the winner of each document travels.
    c.create_db("winners").await;
    let mut s = spec(&a.db_url("src"), &a.db_url("winners"));
    s.options.winning_revs_only = true;
    let stats = run(s, "winning_revs_only").await;
    assert_eq!(stats.docs_written, 20, "{stats:?}");
    let leaves = c.leaf_revs("winners").await;
    assert_eq!(leaves.len(), 20);
    assert!(
        leaves.values().all(|r| r == &vec!["3-bbbb".to_owned()]),
        "{leaves:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_attachments_are_copied_byte_for_byte() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    let mut docs = Vec::new();
    for i in 0..10 {
        docs.push(json!({"_id": format!("a{i}"), "_attachments": {
            "small.txt": {"content_type": "text/plain", "data": b64(format!("hello {i}").as_bytes())},
            "big.bin": {"content_type": "application/octet-stream", "data": b64(&big)},
        }}));
    }
    docs.push(json!({"_id": "plain"}));
    let revs = c.bulk_insert("src", &docs).await;
    // A second revision of a0 keeping one attachment and adding another.
    let (s, _) = c
        .put_doc(
            "src",
            "a0",
            &json!({"_rev": revs[0], "_attachments": {
            "small.txt": {"content_type": "text/plain", "data": b64(b"changed")}}}),
        )
        .await;
    assert_eq!(s, 201);
    let stats = run(
        spec(&a.db_url("src"), &a.db_url("tgt")),
        "replicating attachments",
    )
    .await;
    assert_eq!(stats.docs_written, 11, "{stats:?}");
    assert_eq!(stats.doc_write_failures, 0);
    c.assert_same("src", &c, "tgt").await;
    assert_eq!(c.attachment("tgt", "a3", "big.bin").await, big);
    assert_eq!(c.attachment("tgt", "a0", "small.txt").await, b"changed");
    assert_eq!(c.attachment("tgt", "a5", "small.txt").await, b"hello 5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_target_and_missing_databases() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.bulk_insert("src", &numbered_docs("x", 5)).await;
    // Without create_target a missing target is db_not_found.
    let err = deadline(
        30,
        "missing target",
        replicate(
            spec(&a.db_url("src"), &a.db_url("nope")),
            Context::default(),
        ),
    )
    .await
    .expect_err("missing target must fail");
    assert!(matches!(err, ReplicationError::DbNotFound(_)), "{err:?}");
    assert_eq!(err.reason(), "db_not_found");
    assert!(err.to_string().contains("/nope"), "{err}");
    // A missing source is the same class, transient (it may be created later).
    let err = deadline(
        30,
        "missing source",
        replicate(
            spec(&a.db_url("gone"), &a.db_url("src")),
            Context::default(),
        ),
    )
    .await
    .expect_err("missing source must fail");
    assert!(matches!(err, ReplicationError::DbNotFound(_)), "{err:?}");
    assert!(err.to_string().contains("/gone"), "{err}");
    assert_eq!(err.class(), ErrorClass::Transient);
    // create_target makes it.
    let mut s = spec(&a.db_url("src"), &a.db_url("made"));
    s.options.create_target = true;
    let stats = run(s, "create_target").await;
    assert_eq!(stats.docs_written, 5);
    let (st, info) = c.db_info("made").await;
    assert_eq!((st, info["doc_count"].as_u64()), (200, Some(5)), "{info}");
}
