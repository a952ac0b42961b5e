//! Never twice (issue 25, point 5): two replicator nodes share a 3-member etcd; `n1` reaches
//! it only through TCP relays (one per member), `n2` directly. While `n1` runs some of the
//! continuous jobs, its relays are blocked (open connections dropped, new ones closed): `n1`
//! must stop those replications before the activity timeout lets `n2` take them, `n2` must
//! then run every job, and every target must end equal to its source. Both nodes' start and
//! stop events are recorded with their times; at no instant may one job run on both, also
//! after `n1` reaches etcd again. Skips when etcd is not installed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_replicator::replicator::{
    JobKind, NewJob, Replicator, ReplicatorEvent, ReplicatorSettings,
};
use couch_replicator::store::Db;
use couch_replicator::store::etcd::{EtcdConfig, EtcdStore};
use futures::StreamExt;
use serde_json::json;
use tokio::time::Instant;

use crate::support::couch::Couch;
use crate::support::etcd::EtcdCluster;
use crate::support::nodes::Nodes;
use crate::support::relay::Relay;
use crate::support::replicator::*;
use crate::support::{deadline, wait_for};

const JOBS: usize = 8;
/// The couch_jobs activity timeout, seconds (short: the test must stay under ~30 s).
const ACTIVITY_TIMEOUT_SEC: u64 = 3;

fn settings() -> ReplicatorSettings {
    ReplicatorSettings {
        max_jobs: JOBS,
        max_churn: JOBS,
        job_timeout: Duration::from_secs(ACTIVITY_TIMEOUT_SEC),
        ..test_settings()
    }
}

/// One recorded event: when, which node, started (true) or ended, which job.
type Event = (Instant, &'static str, bool, String);
type Log = Arc<Mutex<Vec<Event>>>;

fn record(log: &Log, node: &'static str, n: &Replicator) -> tokio::task::JoinHandle<()> {
    let mut rx = n.subscribe().expect("event bus");
    let log = log.clone();
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            let started = matches!(event, ReplicatorEvent::Started { .. });
            if let Some(job) = event.job_id() {
                let entry = (Instant::now(), node, started, job.to_string());
                log.lock().unwrap().push(entry);
            }
        }
    })
}

/// The two nodes' stores: the first reaches `cluster` only through a relay per member (the
/// relays, returned, cut it off), with short timeouts; the second reaches it directly.
async fn stores(cluster: &EtcdCluster) -> (Vec<Relay>, EtcdStore, EtcdStore) {
    let mut relays = Vec::new();
    for endpoint in cluster.endpoints() {
        let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
        relays.push(Relay::start(port).await.unwrap());
    }
    let via_relays = relays
        .iter()
        .map(|r| format!("http://127.0.0.1:{}", r.port))
        .collect();
    let mut cut_config = EtcdConfig::new(via_relays);
    cut_config.request_timeout = Duration::from_secs(2);
    cut_config.connect_timeout = Duration::from_secs(1);
    let store1 = EtcdStore::connect(&cut_config).await.unwrap();
    let store2 = EtcdStore::connect(&EtcdConfig::new(cluster.endpoints()))
        .await
        .unwrap();
    (relays, store1, store2)
}

/// The end of a cut-off test: the recorders stopped, `n2` shut down, `n1` (the node that was
/// cut off) killed, then the relays closed.
async fn stop(
    recorders: Vec<tokio::task::JoinHandle<()>>,
    n1: Replicator,
    n2: Replicator,
    relays: Vec<Relay>,
) {
    for r in recorders {
        r.abort();
    }
    n2.shutdown().await;
    n1.kill().await;
    drop(relays);
}

/// The jobs each node runs after replaying the log; panics at the first instant a job
/// runs on two nodes. Also returns, per job that moved, the gap between its stop on one
/// node and its start on the other.
fn replay(log: &[Event]) -> (HashMap<&'static str, HashSet<String>>, Vec<Duration>) {
    let mut log = log.to_vec();
    log.sort_by_key(|e| e.0);
    let mut running: HashMap<&'static str, HashSet<String>> = HashMap::new();
    let mut ended: HashMap<String, (Instant, &'static str)> = HashMap::new();
    let mut gaps = Vec::new();
    for (at, node, started, job) in log {
        if started {
            for (other, jobs) in &running {
                assert!(
                    *other == node || !jobs.contains(&job),
                    "{job} started on {node} while running on {other}"
                );
            }
            if let Some((t, from)) = ended.get(&job)
                && *from != node
            {
                gaps.push(at - *t);
            }
            running.entry(node).or_default().insert(job);
        } else if running.entry(node).or_default().remove(&job) {
            ended.insert(job, (at, node));
        }
    }
    (running, gaps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_etcd_stops_its_jobs_before_another_node_runs_them() {
    deadline(
        120,
        "a node cut off etcd stops its jobs before another runs them",
        async {
            let Some(cluster) = EtcdCluster::start(3).await else {
                return;
            };
            let pouch = Pouch::start().await;
            let pouch = &pouch;
            futures::stream::iter(0..JOBS)
                .for_each_concurrent(8, |i| async move {
                    pouch.create_db(&format!("s{i}")).await;
                    pouch.put_docs(&format!("s{i}"), "a", 3).await;
                })
                .await;
            let (relays, store1, store2) = stores(&cluster).await;
            // n1 alone first, so that it runs every job when the cut comes (with both up,
            // whichever node accepts first may take them all).
            let nodes = Nodes::on_disk();
            let n1 = nodes
                .start_on(&Db::new(Arc::new(store1)), "n1", settings())
                .await;
            let log: Log = Arc::default();
            let mut recorders = vec![record(&log, "n1", &n1)];
            for i in 0..JOBS {
                let rep = json!({"source": pouch.url(&format!("s{i}")),
                             "target": pouch.url(&format!("t{i}")),
                             "create_target": true, "continuous": true,
                             "checkpoint_interval": 500});
                n1.add(NewJob::from_body(
                    JobKind::Persistent {
                        db_name: "_replicator".into(),
                        doc_id: format!("r{i}"),
                    },
                    rep,
                ))
                .await
                .unwrap();
            }
            let seen = Mutex::new(String::new());
            let on_n1 = wait_for(60, "n1 running every job", || async {
                let (running, _) = replay(&log.lock().unwrap());
                let n1_jobs = running.get("n1").cloned().unwrap_or_default();
                let total: usize = running.values().map(HashSet::len).sum();
                let now = format!("n1 runs {}, both {total}", n1_jobs.len());
                if *seen.lock().unwrap() != now {
                    eprintln!("{now}");
                    *seen.lock().unwrap() = now;
                }
                (n1_jobs.len() == JOBS).then_some(n1_jobs)
            })
            .await;
            for i in 0..JOBS {
                pouch
                    .wait_count(&format!("t{i}"), 3, Duration::from_secs(20))
                    .await;
            }
            let n2 = nodes
                .start_on(&Db::new(Arc::new(store2)), "n2", settings())
                .await;
            recorders.push(record(&log, "n2", &n2));
            eprintln!("before the cut: n1 runs {} of {JOBS} jobs", on_n1.len());
            let cut_at = Instant::now();
            for r in &relays {
                r.block();
            }
            // Work keeps arriving while n1 is cut off.
            for i in 0..JOBS {
                pouch.put_docs(&format!("s{i}"), "b", 3).await;
            }
            let moved_at = wait_for(40, "n2 running every job", || async {
                let (running, _) = replay(&log.lock().unwrap());
                let n1_left = running.get("n1").map_or(0, HashSet::len);
                let n2_runs = running.get("n2").map_or(0, HashSet::len);
                (n1_left == 0 && n2_runs == JOBS).then(|| cut_at.elapsed())
            })
            .await;
            for i in 0..JOBS {
                pouch
                    .wait_count(&format!("t{i}"), 6, Duration::from_secs(20))
                    .await;
            }
            let (_, gaps) = replay(&log.lock().unwrap());
            let n1_stops: Vec<Duration> = log
                .lock()
                .unwrap()
                .iter()
                .filter(|(at, node, started, _)| *node == "n1" && !*started && *at > cut_at)
                .map(|(at, ..)| *at - cut_at)
                .collect();
            eprintln!(
                "n1 stopped its jobs {:?} after the cut; n2 ran all {JOBS} after {moved_at:?}; \
             stop-to-start gaps of the moved jobs: {gaps:?}",
                n1_stops
            );
            assert_eq!(gaps.len(), on_n1.len(), "every job of n1 moved once");
            // n1 reaches etcd again: it finds itself removed and its jobs' locks gone, so
            // nothing it does may start a job n2 runs (the replay below checks again).
            for r in &relays {
                r.unblock();
            }
            tokio::time::sleep(Duration::from_secs(ACTIVITY_TIMEOUT_SEC + 1)).await;
            for i in 0..JOBS {
                pouch.put_docs(&format!("s{i}"), "c", 3).await;
            }
            for i in 0..JOBS {
                pouch
                    .wait_count(&format!("t{i}"), 9, Duration::from_secs(20))
                    .await;
            }
            // Every job runs once after the heal. The healed n1 rejoins and takes its part
            // back, so a job may be between nodes at one instant: wait for a settled picture
            // (the replay asserts at every start that no job ever ran on both).
            let settled = wait_for(20, "every job running once after the heal", || async {
                let (running, _) = replay(&log.lock().unwrap());
                let total: usize = running.values().map(HashSet::len).sum();
                (total == JOBS).then_some(total)
            })
            .await;
            assert_eq!(settled, JOBS);
            let c = Couch::new(&format!("http://127.0.0.1:{}", pouch.port));
            for i in 0..JOBS {
                let leaves = c.assert_same(&format!("s{i}"), &c, &format!("t{i}")).await;
                assert_eq!(leaves, 9);
            }
            stop(recorders, n1, n2, relays).await;
        },
    )
    .await;
}

/// Point 5 for whole-server jobs: `n1` (through relays) runs a continuous server job over
/// two source databases when it is cut off etcd. Its run must stop on its lease, `n2` must
/// take the server job over and pick up a database created during the cut, the per-database
/// replications must never run on both nodes, and after the heal the server job must stay
/// on `n2` and hold each source database once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_job_cut_off_etcd_moves_to_another_node() {
    deadline(120, "a server job cut off etcd moves", async {
        let Some(cluster) = EtcdCluster::start(3).await else {
            return;
        };
        let (src, tgt) = tokio::join!(Pouch::start(), Pouch::start());
        for db in ["a", "b"] {
            src.create_db(db).await;
            src.put_docs(db, "x", 3).await;
        }
        let (relays, store1, store2) = stores(&cluster).await;
        let nodes = Nodes::on_disk();
        let n1 = nodes
            .start_on(&Db::new(Arc::new(store1)), "n1", settings())
            .await;
        let log: Log = Arc::default();
        let mut recorders = vec![record(&log, "n1", &n1)];
        let body = json!({"all_dbs": true, "source": src.url(""), "target": tgt.url(""),
                          "create_target": true, "continuous": true});
        let job = n1.add_server_job(&body, None).await.unwrap();
        let on = |n: &'static str| {
            move |v: &couch_replicator::replicator::ServerJobView| {
                v.node.as_ref().is_some_and(|x| x.as_str() == n)
            }
        };
        wait_for(
            60,
            "n1 running the server job over both databases",
            || async {
                let v = n1.server_job(&job.id).await.ok()?;
                (on("n1")(&v) && v.total == 2).then_some(())
            },
        )
        .await;
        for db in ["a", "b"] {
            tgt.wait_count(db, 3, Duration::from_secs(20)).await;
        }
        let n2 = nodes
            .start_on(&Db::new(Arc::new(store2)), "n2", settings())
            .await;
        recorders.push(record(&log, "n2", &n2));
        let cut_at = Instant::now();
        for r in &relays {
            r.block();
        }
        // A database created during the cut: only a live run of the server job adds it.
        src.create_db("late").await;
        src.put_docs("late", "y", 4).await;
        let moved = wait_for(40, "n2 running the server job", || async {
            let v = n2.server_job(&job.id).await.ok()?;
            on("n2")(&v).then(|| cut_at.elapsed())
        })
        .await;
        tgt.wait_count("late", 4, Duration::from_secs(30)).await;
        eprintln!("the server job ran on n2 {moved:?} after the cut");
        for r in &relays {
            r.unblock();
        }
        tokio::time::sleep(Duration::from_secs(ACTIVITY_TIMEOUT_SEC + 1)).await;
        for db in ["a", "b", "late"] {
            src.put_docs(db, "z", 2).await;
        }
        for (db, n) in [("a", 5), ("b", 5), ("late", 6)] {
            tgt.wait_count(db, n, Duration::from_secs(20)).await;
        }
        let v = n2.server_job(&job.id).await.unwrap();
        assert!(on("n2")(&v), "the server job stays on n2: {:?}", v.node);
        assert_eq!(v.total, 3, "each source database once: {:?}", v.dbs.keys());
        // The replay panics if a replication ever ran on both nodes at once; after the
        // heal `n1` may take its part of them back, each still runs once.
        let (running, _) = replay(&log.lock().unwrap());
        let total: usize = running.values().map(HashSet::len).sum();
        assert_eq!(
            total, 3,
            "each database's replication runs once: {running:?}"
        );
        stop(recorders, n1, n2, relays).await;
    })
    .await;
}
