//! Several replicator nodes on one store: a node killed in a 3-node cluster loses no work —
//! its jobs are re-enqueued by the activity monitor and finish on the other nodes; jobs spread
//! evenly over the nodes whichever node took them, and a node that joins takes its part.

use crate::support::{deadline, wait_for};
use std::collections::HashMap;
use std::time::Duration;

use crate::support::nodes::Nodes;
use crate::support::replicator::*;
use couch_replicator::replicator::{
    JobKind, NewJob, NodeName, RepState, Replicator, ReplicatorSettings, WaitFor,
};
use serde_json::json;

/// A node that is still running.
fn alive(nodes: &[Option<Replicator>]) -> &Replicator {
    nodes.iter().flatten().next().expect("a live node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_three_nodes_moves_its_jobs_and_loses_no_doc() {
    deadline(
        280,
        "killing one of three nodes moves its jobs and loses no doc",
        async {
            let pouch = Pouch::start().await;
            let cluster = Nodes::on_disk();
            let mut nodes = Vec::new();
            for name in ["n1", "n2", "n3"] {
                nodes.push(Some(cluster.start(name, test_settings()).await));
            }
            let jobs = 6;
            let mut ids = Vec::new();
            for i in 0..jobs {
                let src = format!("s{i}");
                pouch.create_db(&src).await;
                pouch.put_docs(&src, "a", 20).await;
                let rep = json!({"source": pouch.url(&src), "target": pouch.url(&format!("t{i}")),
                             "create_target": true, "continuous": true,
                             "checkpoint_interval": 500});
                let n = nodes[i % 3].as_ref().unwrap();
                let v = n
                    .add(NewJob::from_body(
                        JobKind::Persistent {
                            db_name: "_replicator".into(),
                            doc_id: format!("job{i}"),
                        },
                        rep,
                    ))
                    .await
                    .unwrap();
                ids.push(v.job_id);
            }
            for id in &ids {
                alive(&nodes)
                    .wait(id, WaitFor::Running, Duration::from_secs(30))
                    .await
                    .unwrap();
            }
            for i in 0..jobs {
                pouch
                    .wait_count(&format!("t{i}"), 20, Duration::from_secs(30))
                    .await;
            }
            // Kill the node running the most jobs.
            let mut per_node: HashMap<String, usize> = HashMap::new();
            for id in &ids {
                let v = alive(&nodes).get(id).await.unwrap();
                *per_node.entry(v.node.unwrap().into_string()).or_default() += 1;
            }
            let (victim, moved) = per_node.iter().max_by_key(|(_, n)| **n).unwrap();
            let (victim, moved) = (victim.clone(), *moved);
            assert!(moved > 0);
            let idx = ["n1", "n2", "n3"]
                .iter()
                .position(|n| *n == victim)
                .unwrap();
            nodes[idx].take().unwrap().kill().await;
            // Work keeps arriving while the node is dead; a one-shot job is added too.
            for i in 0..jobs {
                pouch.put_docs(&format!("s{i}"), "b", 10).await;
            }
            pouch.create_db("once").await;
            pouch.put_docs("once", "o", 15).await;
            let once = alive(&nodes)
                .add(NewJob::from_body(
                    JobKind::Transient { user: None },
                    json!({"source": pouch.url("once"), "target": pouch.url("once_t"),
                            "create_target": true}),
                ))
                .await
                .unwrap();
            for i in 0..jobs {
                pouch
                    .wait_count(&format!("t{i}"), 30, Duration::from_secs(60))
                    .await;
            }
            let done = alive(&nodes)
                .wait(&once.job_id, WaitFor::Completed, Duration::from_secs(30))
                .await
                .unwrap();
            assert_ne!(
                done.node.as_ref().map(NodeName::as_str),
                Some(victim.as_str())
            );
            assert_eq!(pouch.doc_count("once_t").await, 15);
            // Every job runs on a survivor. Under injected store faults one may be between
            // a crash and its restart at this moment, so each gets a bounded wait.
            for id in &ids {
                let observer = alive(&nodes);
                let victim = victim.as_str();
                wait_for(30, &format!("{id} running on a survivor"), || async move {
                    let v = observer.get(id).await.unwrap();
                    (v.state == RepState::Running
                        && v.node.as_ref().is_some_and(|n| n.as_str() != victim))
                    .then_some(())
                })
                .await;
            }
            for n in nodes.into_iter().flatten() {
                n.shutdown().await;
            }
        },
    )
    .await;
}

/// `Some(counts)` once `total` jobs run on the live nodes with max/min <= 1.5.
fn spread(nodes: &[Option<Replicator>], total: usize) -> Option<Vec<usize>> {
    let counts: Vec<usize> = nodes
        .iter()
        .flatten()
        .map(|n| n.job_sup().which_children().len())
        .collect();
    let (max, min) = (*counts.iter().max()?, *counts.iter().min()?);
    let even = counts.iter().sum::<usize>() == total && min > 0;
    (even && max as f64 / min as f64 <= 1.5).then_some(counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_spread_evenly_whichever_node_took_them_and_a_joining_node_takes_its_part() {
    deadline(60, "jobs spread over the nodes", async {
        let pouch = Pouch::start().await;
        let cluster = Nodes::on_disk();
        pouch.create_db("src").await;
        pouch.put_docs("src", "a", 10).await;
        let mut nodes = vec![
            Some(cluster.start("n1", test_settings()).await),
            Some(cluster.start("n2", test_settings()).await),
        ];
        // Nine continuous transient jobs, all added through n1.
        for i in 0..9 {
            let rep = json!({"source": pouch.url("src"), "target": pouch.url(&format!("t{i}")),
                "create_target": true, "continuous": true});
            let first = nodes[0].as_ref().unwrap();
            first
                .add(NewJob::from_body(JobKind::Transient { user: None }, rep))
                .await
                .unwrap();
        }
        let two = wait_for(20, "9 jobs over 2 nodes", || async { spread(&nodes, 9) }).await;
        println!("2 nodes: {two:?}");
        nodes.push(Some(cluster.start("n3", test_settings()).await));
        let three = wait_for(20, "9 jobs over 3 nodes", || async { spread(&nodes, 9) }).await;
        println!("3 nodes: {three:?}");
        // A job added through n1 is cancelled through n3 and stops where it ran.
        let added = nodes[0]
            .as_ref()
            .unwrap()
            .add(NewJob::from_body(
                JobKind::Transient { user: None },
                json!({"source": pouch.url("src"), "target": pouch.url("t-cancel"),
                    "create_target": true, "continuous": true}),
            ))
            .await
            .unwrap();
        let third = nodes[2].as_ref().unwrap();
        let running = third
            .wait(&added.job_id, WaitFor::Running, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(running.node.is_some());
        third.cancel(&added.job_id).await.unwrap();
        wait_for(10, "the cancelled job stops on its node", || async {
            let runs = nodes
                .iter()
                .flatten()
                .any(|n| n.job_sup().which_child(added.job_id.as_str()).is_some());
            (!runs).then_some(())
        })
        .await;
        for n in nodes.into_iter().flatten() {
            n.shutdown().await;
        }
    })
    .await;
}

/// A node killed and started again under its name before any neighbour removed it: its
/// row beats again, so no neighbour ever re-enqueues what the killed run held. Those jobs
/// run again at once, not after the activity timeout (set to a minute here; the failover
/// drill saw them wait 90 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_at_once_runs_again_the_jobs_its_killed_run_held() {
    deadline(
        120,
        "a node restarted at once runs again its killed run's jobs",
        async {
            let settings = || ReplicatorSettings {
                job_timeout: Duration::from_secs(60),
                ..test_settings()
            };
            let pouch = Pouch::start().await;
            let cluster = Nodes::on_disk();
            let mut nodes = vec![
                Some(cluster.start("n1", settings()).await),
                Some(cluster.start("n2", settings()).await),
            ];
            let jobs = 4;
            for i in 0..jobs {
                let src = format!("s{i}");
                pouch.create_db(&src).await;
                pouch.put_docs(&src, "a", 3).await;
                let rep = json!({"source": pouch.url(&src), "target": pouch.url(&format!("t{i}")),
                             "create_target": true, "continuous": true});
                nodes[i % 2]
                    .as_ref()
                    .unwrap()
                    .add(NewJob::from_body(JobKind::Transient { user: None }, rep))
                    .await
                    .unwrap();
            }
            let counts = wait_for(60, "both nodes running jobs", || {
                let nodes = &nodes;
                async move { spread(nodes, jobs) }
            })
            .await;
            eprintln!("jobs per node before the kill: {counts:?}");
            nodes[1].take().unwrap().kill().await;
            nodes[1] = Some(cluster.start("n2", settings()).await);
            let restarted = tokio::time::Instant::now();
            for i in 0..jobs {
                pouch.put_docs(&format!("s{i}"), "b", 2).await;
            }
            for i in 0..jobs {
                pouch
                    .wait_count(&format!("t{i}"), 5, Duration::from_secs(20))
                    .await;
            }
            let running: usize = nodes
                .iter()
                .flatten()
                .map(|n| n.job_sup().which_children().len())
                .sum();
            assert_eq!(running, jobs, "job actors after the restart");
            eprintln!(
                "every target current {:?} after the restart",
                restarted.elapsed()
            );
            for n in nodes.into_iter().flatten() {
                n.shutdown().await;
            }
        },
    )
    .await;
}
