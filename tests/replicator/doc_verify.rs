//! A `_replicator` document with `"verify": {"deep": true}` (on pouchdb-server, in a
//! `jobs_replicator` database as the doc processor tests use): once its one-shot replication
//! completes, the document is written `completed` with the target's verification report in
//! `_replication_stats.verify`, next to CouchDB's counters.

use crate::support::couch::Couch;
use crate::support::deadline;
use crate::support::http::{Node, Pouch};
use crate::support::verify as fixture;
use couch_replicator::replicator::replicator_db::doc_processor::{
    DocProcessor, DocProcessorConfig, ReplicatorDb,
};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_document_carries_its_verification() {
    deadline(90, "a verified _replicator document", async {
        let pouch = Pouch::start().await;
        let c = Couch::new(&pouch.url);
        let want = fixture::incomplete(&c, "src", &c, "tgt").await;
        pouch.put("jobs_replicator", json!({})).await;
        let node = Node::start(Default::default()).await;
        let doc = json!({"source": pouch.db("src"), "target": pouch.db("copy"),
            "create_target": true, "verify": {"deep": true}});
        pouch.put("jobs_replicator/v", doc).await;
        let db = ReplicatorDb::from_url(&pouch.db("jobs_replicator")).unwrap();
        let cfg = DocProcessorConfig {
            dbs: vec![db],
            poll_timeout: Duration::from_millis(500),
            retry_delay: Duration::from_millis(200),
            rescan_interval: Duration::from_millis(300),
            ..DocProcessorConfig::default()
        };
        let _dp = DocProcessor::start(node.replicator.clone(), cfg).unwrap();
        let d = crate::support::wait_for(60, "the document completed", || async {
            let (_, d) = pouch.get("jobs_replicator/v").await;
            (d["_replication_state"] == "completed").then_some(d)
        })
        .await;
        let stats = &d["_replication_stats"];
        assert_eq!(
            stats["docs_written"],
            want.leaves + 1,
            "one per revision: {d}"
        );
        let v = &stats["verify"];
        assert_eq!(v["complete"], true, "{d}");
        assert_eq!(v["deep"], true, "{d}");
        assert_eq!(v["leaves_checked"], want.leaves + 1, "{d}");
        assert_eq!(v["leaves_compared"], want.leaves + 1, "{d}");
    })
    .await;
}
