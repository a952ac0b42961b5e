//! Lag in seconds (issue 41): a running job's `info.lag_seconds` in `_scheduler/jobs` and
//! the `couch_replicator_job_lag_seconds` families on `/metrics` are 0 while the job is
//! caught up with its source, grow while its target holds its writes (a fault proxy stalls
//! `_bulk_docs` in front of a real pouchdb-server), and are 0 again once it caught up.

use crate::support::{deadline, wait_for};
use std::time::Duration;

use crate::support::http::{ADMIN, Node};
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::replicator::Pouch as Server;
use couch_replicator::http::HttpConfig;
use reqwest::Method;
use serde_json::{Value, json};

/// The job's `info.lag_seconds` as `_scheduler/jobs` shows it.
async fn lag(node: &Node) -> Option<u64> {
    let (_, jobs) = node.get("/_scheduler/jobs", Some(ADMIN)).await;
    jobs["jobs"][0]["info"]["lag_seconds"].as_u64()
}

/// `couch_replicator_job_lag_seconds_max` on `/metrics`.
async fn lag_max(node: &Node) -> Option<u64> {
    let (_, m) = node.get("/metrics", Some(ADMIN)).await;
    let text = m.as_str().unwrap_or_default().to_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("couch_replicator_job_lag_seconds_max "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_is_zero_when_caught_up_and_grows_while_the_target_holds_writes() {
    deadline(120, "lag in seconds", async {
        let pouch = Server::start().await;
        pouch.create_db("src").await;
        pouch.create_db("dst").await;
        pouch.put_docs("src", "a", 2).await;
        let proxy = FaultProxy::start(&format!("http://127.0.0.1:{}/", pouch.port)).await;
        let node = Node::start(HttpConfig::default()).await;
        let body = json!({"source": pouch.url("src"), "target": proxy.db_url("dst"),
            "continuous": true});
        let (s, e) = node
            .post("/_replicate", Some(ADMIN), &body.to_string())
            .await;
        assert_eq!(s, 202, "{e}");
        pouch.wait_count("dst", 2, Duration::from_secs(30)).await;
        wait_for(20, "lag 0 while caught up", || async {
            (lag(&node).await == Some(0)).then_some(())
        })
        .await;
        wait_for(20, "lag 0 on /metrics", || async {
            (lag_max(&node).await == Some(0)).then_some(())
        })
        .await;

        // The target holds the next write for 12 s: the job falls behind.
        proxy.add(Rule::new(
            Some(Method::POST),
            "_bulk_docs",
            1,
            Fault::Stall(Duration::from_secs(12)),
        ));
        pouch.put_docs("src", "b", 1).await;
        let behind = wait_for(20, "lag of 3 s or more", || async {
            lag(&node).await.filter(|l| *l >= 3)
        })
        .await;
        assert!(behind < 20, "lag {behind} s after a 12 s stall");
        wait_for(20, "the lag on /metrics", || async {
            lag_max(&node).await.filter(|l| *l >= 3)
        })
        .await;

        // Released: caught up again.
        pouch.wait_count("dst", 3, Duration::from_secs(40)).await;
        wait_for(30, "lag 0 again", || async {
            (lag(&node).await == Some(0)).then_some(())
        })
        .await;
        let (_, jobs) = node.get("/_scheduler/jobs", Some(ADMIN)).await;
        let info: &Value = &jobs["jobs"][0]["info"];
        assert_eq!(info["source_seq"], info["through_seq"], "{info}");
    })
    .await;
}
