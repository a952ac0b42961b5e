//! Node loss at scale (issue 7, item 3): three replicator nodes on one store run 300
//! continuous replications; the node running the most is killed like a lost machine (its
//! tree killed, no terminate hook, its couch_jobs background gone). Every one of its jobs
//! must be running again on a surviving node within two activity timeouts of the kill, and
//! every target must end up equal to its source, leaf for leaf, including the docs written
//! while the node was dead.

use crate::support::{deadline, wait_for};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::support::couch::Couch;
use crate::support::nodes::Nodes;
use crate::support::replicator::*;
use couch_replicator::replicator::{
    JobId, JobKind, NewJob, NodeName, RepState, Replicator, ReplicatorSettings,
};
use futures::StreamExt;
use serde_json::json;

const JOBS: usize = 300;
const SERVERS: usize = 4;
const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// The couch_jobs activity timeout of the replication job type (`job_timeout`), seconds.
const ACTIVITY_TIMEOUT_SEC: u64 = 10;

fn settings() -> ReplicatorSettings {
    ReplicatorSettings {
        // Two survivors can hold every job, so recovery is not a rotation.
        max_jobs: JOBS / 2,
        max_churn: JOBS / 2,
        interval: Duration::from_secs(2),
        min_run_time: Duration::from_secs(5),
        job_timeout: Duration::from_secs(ACTIVITY_TIMEOUT_SEC),
        ..test_settings()
    }
}

/// `(node, state)` of every job, by job id.
async fn placement(n: &Replicator) -> HashMap<JobId, (Option<NodeName>, RepState)> {
    n.list()
        .await
        .unwrap()
        .into_iter()
        .map(|v| (v.job_id.clone(), (v.node.clone(), v.state)))
        .collect()
}

/// Waits until every target `t{i}` holds `docs` documents.
async fn wait_targets(pouches: &[Pouch], docs: u64, what: &str) {
    let t0 = Instant::now();
    let mut left: Vec<usize> = (0..JOBS).collect();
    while !left.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{what}: {} targets still short of {docs} docs, e.g. t{}",
            left.len(),
            left[0]
        );
        left = futures::stream::iter(left)
            .map(|i| async move {
                let n = pouches[i % SERVERS].doc_count(&format!("t{i}")).await;
                (n < docs).then_some(i)
            })
            .buffer_unordered(32)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "{what}: all {JOBS} targets at {docs} docs after {:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_of_three_nodes_with_300_replications_reruns_every_job_in_two_timeouts() {
    deadline( 280, "losing one of three nodes with 300 replications reruns every job in two timeouts", async {
        let mut pouches = Vec::new();
        for _ in 0..SERVERS {
            pouches.push(Pouch::start().await);
        }
        let pouches = &pouches;
        futures::stream::iter(0..JOBS)
            .for_each_concurrent(16, |i| async move {
                let p = &pouches[i % SERVERS];
                p.create_db(&format!("s{i}")).await;
                p.put_docs(&format!("s{i}"), "a", 2).await;
            })
            .await;
        let cluster = Nodes::on_disk();
        let mut nodes = Vec::new();
        for name in NODES {
            nodes.push(Some(cluster.start(name, settings()).await));
        }
        // Sixteen adds at a time, spread over the three nodes.
        let nodes_ref = &nodes;
        let ids: Vec<JobId> = futures::stream::iter(0..JOBS)
            .map(|i| async move {
                let p = &pouches[i % SERVERS];
                let rep = json!({"source": p.url(&format!("s{i}")), "target": p.url(&format!("t{i}")),
                                 "create_target": true, "continuous": true,
                                 "checkpoint_interval": 1000});
                nodes_ref[i % NODES.len()]
                    .as_ref()
                    .unwrap()
                    .add(NewJob::from_body(JobKind::Persistent {
                            db_name: "_replicator".into(),
                            doc_id: format!("r{i}"),
                        }, rep))
                    .await
                    .unwrap()
                    .job_id
            })
            .buffered(16)
            .collect()
            .await;
        wait_targets(pouches, 2, "before the loss").await;
        let observer = nodes[0].as_ref().unwrap();
        // Every job copied its first docs; on a loaded machine one may be between a crash
        // and its restart at this moment, so wait (bounded) until all run at once.
        let before = wait_for(60, "every job running before the loss", || async {
            let p = placement(observer).await;
            p.values()
                .all(|(_, s)| *s == RepState::Running)
                .then_some(p)
        })
        .await;
        let mut per_node: HashMap<String, usize> = HashMap::new();
        for (node, _) in before.values() {
            *per_node
                .entry(node.clone().unwrap_or_default().into_string())
                .or_default() += 1;
        }
        eprintln!("jobs per node before the loss: {per_node:?}");
        // Kill the busiest node other than n1 (n1 is the observer).
        let (victim, lost) = per_node
            .iter()
            .filter(|(n, _)| n.as_str() != "n1")
            .max_by_key(|(_, c)| **c)
            .map(|(n, c)| (n.clone(), *c))
            .unwrap();
        assert!(lost > 0);
        let idx = NODES.iter().position(|n| *n == victim).unwrap();
        let killed_at = Instant::now();
        nodes[idx].take().unwrap().kill().await;
        let observer = nodes[0].as_ref().unwrap();
        // Work keeps arriving while the node is dead.
        futures::stream::iter(0..JOBS)
            .for_each_concurrent(16, |i| async move {
                pouches[i % SERVERS]
                    .put_docs(&format!("s{i}"), "b", 2)
                    .await;
            })
            .await;
        let bound = Duration::from_secs(2 * ACTIVITY_TIMEOUT_SEC);
        // The victim's jobs. A full survivor may rotate one of its own jobs out to make room
        // for one of them (pending jobs get a turn); that job is rescheduled, not lost.
        let lost_ids: Vec<&JobId> = before
            .iter()
            .filter(|(_, (n, _))| n.as_ref().is_some_and(|n| *n == victim))
            .map(|(id, _)| id)
            .collect();
        let recovered = loop {
            let now = placement(observer).await;
            let stranded = lost_ids
                .iter()
                .filter(|id| {
                    now.get(id.as_str()).is_none_or(|(n, s)| {
                        *s != RepState::Running || n.as_ref().is_some_and(|n| *n == victim)
                    })
                })
                .count();
            if stranded == 0 {
                break killed_at.elapsed();
            }
            assert!(
                killed_at.elapsed() < bound,
                "{stranded} of {lost} lost jobs not running again {:?} after the kill",
                killed_at.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        eprintln!(
            "RECOVERY {lost} jobs of {victim} running again on the survivors {:.1} s after \
             the kill (bound {} s)",
            recovered.as_secs_f64(),
            bound.as_secs()
        );
        wait_targets(pouches, 4, "after the loss").await;
        // Leaf for leaf: nothing lost, nothing invented.
        let checked: usize = futures::stream::iter(0..JOBS)
            .map(|i| async move {
                let c = Couch::new(&format!("http://127.0.0.1:{}", pouches[i % SERVERS].port));
                c.assert_same(&format!("s{i}"), &c, &format!("t{i}")).await
            })
            .buffer_unordered(16)
            .fold(0, |acc, n| async move { acc + n })
            .await;
        assert_eq!(checked, JOBS * 4);
        let after = placement(observer).await;
        assert_eq!(after.len(), JOBS);
        for id in &ids {
            let (n, s) = &after[id];
            assert_eq!(*s, RepState::Running, "{id}");
            assert_ne!(n.as_ref().map(NodeName::as_str), Some(victim.as_str()), "{id} on the dead node");
        }
        for n in nodes.into_iter().flatten() {
            n.shutdown().await;
        }
    })
    .await;
}
