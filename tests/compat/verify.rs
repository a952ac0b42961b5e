//! `verify` against a real CouchDB 3.4.3 (both databases on it): a missing leaf, a missing
//! conflict, a missing deleted leaf and a different attachment (deep) found with a `selector`
//! that leaves one more missing document out; a replicated copy verified complete, deep
//! included, until a conflict leaf is purged from it, which `verify` then reports.

use crate::support::couch::Couch;
use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::verify::{self as fixture, different_of, missing_of, run};
use couch_replicator::replication::{Context, Endpoint, Filter, ReplicationSpec, replicate};
use serde_json::json;

fn spec(peer: &CouchPeer, src: &str, tgt: &str) -> ReplicationSpec {
    let url = |db: &str| Endpoint::parse(&format!("{}/{db}", peer.admin_url())).unwrap();
    ReplicationSpec::new(url(src), url(tgt))
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_on_couchdb_finds_what_the_target_lacks() {
    let Some(peer) = CouchPeer::start("verify_on_couchdb_finds_what_the_target_lacks", None) else {
        return;
    };
    peer.warm_up_sessions().await;
    let c = Couch::new(&peer.admin_url());
    let want = fixture::incomplete(&c, "src", &c, "tgt").await;
    let mut s = spec(&peer, "src", "tgt");
    s.options.filter = Filter::Selector(fixture::selector());

    let r = run(&s, true).await;
    assert_eq!(r["complete"], false, "{r}");
    assert_eq!(missing_of(&r), want.missing, "{r}");
    assert_eq!(different_of(&r), [want.different], "{r}");
    assert_eq!(r["docs_checked"], want.docs, "{r}");
    assert_eq!(r["leaves_checked"], want.leaves, "{r}");

    // Pages of 4 rows, each asking CouchDB for one row sequence a page (`seq_interval`):
    // the same verdict.
    let mut paged = s.clone();
    paged.options.worker_batch_size = 1;
    paged.options.worker_processes = 1;
    let r = run(&paged, true).await;
    assert_eq!(missing_of(&r), want.missing, "pages of 4: {r}");
    assert_eq!(r["docs_checked"], want.docs, "pages of 4: {r}");
    assert_eq!(r["leaves_checked"], want.leaves, "pages of 4: {r}");

    let r = run(&spec(&peer, "src", "tgt"), false).await;
    assert!(
        missing_of(&r).contains(&("zz-outside".into(), fixture::rev(1, "o1"))),
        "without the selector the left-out document is missing too: {r}"
    );
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_on_couchdb_sees_a_purged_leaf() {
    let Some(peer) = CouchPeer::start("verify_on_couchdb_sees_a_purged_leaf", None) else {
        return;
    };
    peer.warm_up_sessions().await;
    let c = Couch::new(&peer.admin_url());
    let want = fixture::incomplete(&c, "src", &c, "tgt").await;
    let s = spec(&peer, "src", "copy");
    c.create_db("copy").await;
    deadline(60, "replicate", replicate(s.clone(), Context::default()))
        .await
        .unwrap();
    let r = run(&s, true).await;
    assert_eq!(r["complete"], true, "{r}");
    assert_eq!(r["leaves_compared"], want.leaves + 1, "{r}");

    let purged = fixture::rev(2, "c2b");
    let resp = reqwest::Client::new()
        .post(format!("{}/copy/_purge", peer.admin_url()))
        .json(&json!({"conflict": [purged]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
    let r = run(&s, false).await;
    assert_eq!(r["complete"], false, "{r}");
    assert_eq!(missing_of(&r), [("conflict".to_owned(), purged)], "{r}");
}
