//! 1,000 continuous replications on one node with `max_jobs = 100`: the job server's
//! rotation (extra acceptors every interval, trimming the longest-running back to max_jobs)
//! gives every job a turn; none starves.

mod replicator_support;

use std::time::{Duration, Instant};

use couch_replicator::replicator::{JobKind, NewJob, ReplicatorSettings};
use futures::StreamExt;
use replicator_support::*;
use serde_json::json;

const JOBS: usize = 1000;
const SERVERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_continuous_jobs_all_progress_with_max_jobs_100() {
    deadline(600, async {
        let mut pouches = Vec::new();
        for _ in 0..SERVERS {
            pouches.push(Pouch::start().await);
        }
        let pouches = &pouches;
        let t0 = Instant::now();
        futures::stream::iter(0..JOBS)
            .for_each_concurrent(16, |i| async move {
                let p = &pouches[i % SERVERS];
                p.create_db(&format!("s{i}")).await;
                p.put_docs(&format!("s{i}"), "d", 1).await;
            })
            .await;
        eprintln!("{JOBS} source dbs in {:?}", t0.elapsed());
        let store = Store::open();
        let settings = ReplicatorSettings {
            max_jobs: 100,
            max_churn: 100,
            ..test_settings()
        };
        let n = node(&store.db, "n1", settings).await;
        for i in 0..JOBS {
            let p = &pouches[i % SERVERS];
            n.add(NewJob {
                kind: JobKind::Persistent {
                    db_name: "_replicator".into(),
                    doc_id: format!("r{i}"),
                },
                rep: json!({"source": p.url(&format!("s{i}")), "target": p.url(&format!("t{i}")),
                            "create_target": true, "continuous": true,
                            "worker_processes": 1, "http_connections": 2}),
            })
            .await
            .unwrap();
        }
        eprintln!("{JOBS} jobs added at {:?}", t0.elapsed());
        let started = Instant::now();
        let mut max_running = 0;
        let mut left: Vec<usize> = (0..JOBS).collect();
        while !left.is_empty() {
            let running = n.active_tasks().await.unwrap().len();
            max_running = max_running.max(running);
            left = futures::stream::iter(left)
                .map(|i| async move {
                    let n = pouches[i % SERVERS].doc_count(&format!("t{i}")).await;
                    (n < 1).then_some(i)
                })
                .buffer_unordered(32)
                .filter_map(|x| async move { x })
                .collect()
                .await;
            eprintln!(
                "{:>5.1}s: {} of {JOBS} replicated, {running} running",
                started.elapsed().as_secs_f64(),
                JOBS - left.len()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        // Running jobs stay near max_jobs: up to max_jobs + max_churn between trims.
        assert!(max_running <= 200, "{max_running} running at once");
        let views = n.list().await.unwrap();
        assert_eq!(views.len(), JOBS);
        assert!(
            views
                .iter()
                .all(|v| v.history.iter().any(|h| h.kind == "started"))
        );
        let rotated = views
            .iter()
            .filter(|v| v.history.iter().any(|h| h.kind == "stopped"))
            .count();
        assert!(
            rotated >= JOBS - 200,
            "only {rotated} jobs were ever rotated out"
        );
        eprintln!("all {JOBS} progressed in {:?}", started.elapsed());
        n.shutdown().await;
    })
    .await;
}
