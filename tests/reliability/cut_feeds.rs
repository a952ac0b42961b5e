//! Feeds cut under a running job (issue 41, point 6): a continuous job whose every
//! connection (the continuous `_changes` feed included) is cut every 2 s by the network
//! between it and pouchdb-server, while a writer adds a document every 250 ms. The job never
//! crashes or backs off (no `crashed` event, error count 0, still running), each document
//! reaches the target, and none waits long: a cut costs a reconnect, not a restart.

use crate::support::deadline;
use std::time::Duration;

use crate::support::http::Node;
use crate::support::relay::Relay;
use crate::support::replicator::Pouch as Server;
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::{HistoryKind, JobKind, NewJob, RepState, WaitFor};
use serde_json::json;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_connections_are_cut_every_two_seconds_reconnects_without_a_restart() {
    deadline(120, "a job under cut connections", async {
        if std::env::var_os("CUT_FEEDS_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter("couch_replicator::replication=debug")
                .try_init();
        }
        let pouch = Server::start().await;
        pouch.create_db("src").await;
        pouch.create_db("dst").await;
        let relay = Relay::start(pouch.port).await.unwrap();
        let node = Node::start(HttpConfig::default()).await;
        let rep = node.replicator.clone();
        let job = rep
            .add(NewJob::from_body(
                JobKind::Transient { user: None },
                json!({"source": relay.url("src"), "target": relay.url("dst"),
                    "continuous": true}),
            ))
            .await
            .unwrap();
        rep.wait(&job.job_id, WaitFor::Running, Duration::from_secs(30))
            .await
            .unwrap();
        let began = Instant::now();
        let mut next_cut = began + Duration::from_secs(2);
        let mut slowest = Duration::ZERO;
        for i in 0..40u64 {
            pouch.put_docs("src", &format!("w{i}-"), 1).await;
            let written = Instant::now();
            if written >= next_cut {
                relay.cut();
                next_cut += Duration::from_secs(2);
            }
            // Wait (bounded) for it to arrive; the writer's pace is 4 documents a second.
            while pouch.doc_count("dst").await < i + 1 {
                assert!(
                    written.elapsed() < Duration::from_secs(20),
                    "document {i} never arrived"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            slowest = slowest.max(written.elapsed());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        eprintln!(
            "40 documents over {:?}, {} connections dropped, slowest arrival {slowest:?}",
            began.elapsed(),
            relay.dropped()
        );
        assert!(
            relay.dropped() >= 5,
            "the relay cut {} connections",
            relay.dropped()
        );
        let v = rep.get(&job.job_id).await.unwrap();
        assert_eq!(v.state, RepState::Running);
        assert_eq!(v.error_count, 0);
        assert!(
            v.history.iter().all(|h| h.kind != HistoryKind::Crashed),
            "{:?}",
            v.history
        );
        assert!(
            slowest < Duration::from_secs(5),
            "a document took {slowest:?}"
        );
    })
    .await;
}
