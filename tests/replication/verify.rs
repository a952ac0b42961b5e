//! `verify` against pouchdb-servers (the library call; the binary and `POST /_verify` have
//! their own tests): a missing leaf, a missing conflict, a missing deleted leaf, a different
//! attachment (deep only), a document outside the `doc_ids` filter ignored, and a target
//! made complete by a replication passing, deep included.

use crate::support::couch::Couch;
use crate::support::deadline;
use crate::support::server::PouchServer;
use crate::support::verify::{self as fixture, different_of, missing_of, run};
use couch_replicator::replication::{Context, Endpoint, Filter, ReplicationSpec, replicate};

fn spec(src: &str, tgt: &str) -> ReplicationSpec {
    ReplicationSpec::new(Endpoint::parse(src).unwrap(), Endpoint::parse(tgt).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_missing_leaves_and_different_attachments_within_the_filter() {
    let a = PouchServer::start().await;
    let b = PouchServer::start().await;
    let (ca, cb) = (Couch::new(&a.root()), Couch::new(&b.root()));
    let want = fixture::incomplete(&ca, "src", &cb, "tgt").await;
    let mut s = spec(&a.db_url("src"), &b.db_url("tgt"));
    s.options.filter = Filter::DocIds(fixture::doc_ids());

    let shallow = run(&s, false).await;
    assert_eq!(shallow["complete"], false, "{shallow}");
    assert_eq!(missing_of(&shallow), want.missing, "{shallow}");
    assert_eq!(shallow["docs_checked"], want.docs, "{shallow}");
    assert_eq!(shallow["leaves_checked"], want.leaves, "{shallow}");
    assert_eq!(shallow["leaves_missing"], 3);
    assert_eq!(shallow["docs_missing"], 3);
    assert_eq!(shallow["leaves_different"], 0, "not compared unless deep");

    let deep = run(&s, true).await;
    assert_eq!(missing_of(&deep), want.missing, "{deep}");
    assert_eq!(different_of(&deep), [want.different], "{deep}");
    assert_eq!(deep["leaves_compared"], want.leaves - 3, "{deep}");

    // Without the filter the document left out is missing too.
    s.options.filter = Filter::None;
    let all = run(&s, false).await;
    assert!(
        missing_of(&all).contains(&("zz-outside".into(), fixture::rev(1, "o1"))),
        "{all}"
    );
    assert_eq!(all["docs_checked"], want.docs + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_target_is_complete() {
    let a = PouchServer::start().await;
    let b = PouchServer::start().await;
    let (ca, cb) = (Couch::new(&a.root()), Couch::new(&b.root()));
    let want = fixture::incomplete(&ca, "src", &cb, "tgt").await;
    // Only the attachment conflicts with what the replication would bring: start it over.
    cb.delete_db("tgt").await;
    cb.create_db("tgt").await;
    let s = spec(&a.db_url("src"), &b.db_url("tgt"));
    deadline(60, "replicate", replicate(s.clone(), Context::default()))
        .await
        .unwrap();
    let r = run(&s, true).await;
    assert_eq!(r["complete"], true, "{r}");
    assert_eq!(r["leaves_checked"], want.leaves + 1, "{r}");
    assert_eq!(r["leaves_compared"], want.leaves + 1, "{r}");
    assert_eq!(r["leaves_missing"], 0);
    assert_eq!(r["leaves_different"], 0);
}
