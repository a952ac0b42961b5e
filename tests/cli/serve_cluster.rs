//! Three real `serve` processes on one etcd (issue 25, points 4 and 7): the jobs spread
//! evenly over them whichever node took the request, a node that joins takes its part, a
//! transient replication submitted to one node is listed and cancelled through another;
//! and, on a 3-member etcd, continuous jobs from a `_replicator` database and transient
//! ones survive the kill -9 of a node and of an etcd member, and one node cut off etcd (its
//! connections through relays blocked) while the sources change, with every target complete,
//! no job on two nodes at once, and every member's `hashkv` equal at the end. Skips when etcd
//! is not installed.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::etcd::EtcdCluster;
use crate::support::http::Pouch;
use crate::support::relay::Relay;
use crate::support::serve_cluster::{ServeCluster, libfaketime};
use crate::support::{deadline, wait_for};

fn bin() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_couch-replicator"))
}

/// A source database with `n` documents.
async fn source(pouch: &Pouch, name: &str, n: usize) {
    pouch.put(name, json!({})).await;
    add_docs(pouch, name, 0, n).await;
}

async fn add_docs(pouch: &Pouch, db: &str, from: usize, n: usize) {
    let docs: Vec<Value> = (from..from + n)
        .map(|i| json!({"_id": format!("d{i:04}"), "n": i}))
        .collect();
    let resp = reqwest::Client::new()
        .post(format!("{}/_bulk_docs", pouch.db(db)))
        .json(&json!({ "docs": docs }))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
}

async fn doc_count(pouch: &Pouch, db: &str) -> u64 {
    let (_, info) = pouch.get(db).await;
    info["doc_count"].as_u64().unwrap_or(0)
}

/// Jobs each running node's process runs, by node index.
async fn local_counts(cluster: &ServeCluster) -> BTreeMap<usize, usize> {
    let mut out = BTreeMap::new();
    for i in cluster.running() {
        out.insert(i, cluster.local_jobs(i).await.unwrap_or_default().len());
    }
    out
}

/// `Some(counts)` once `total` jobs run spread over the running nodes with max/min <= 1.5.
async fn spread(cluster: &ServeCluster, total: usize) -> Option<BTreeMap<usize, usize>> {
    let counts = local_counts(cluster).await;
    let sum: usize = counts.values().sum();
    let (max, min) = (counts.values().max()?, counts.values().min()?);
    (sum == total && *min > 0 && *max as f64 / *min as f64 <= 1.5).then_some(counts)
}

async fn replicate(cluster: &ServeCluster, node: usize, body: &Value) -> Value {
    let (status, answer) = cluster
        .call(node, Method::POST, "_replicate", Some(body))
        .await
        .unwrap();
    assert!(status == 200 || status == 202, "{status}: {answer}");
    answer
}

/// Submits `n` continuous replications of `src` (into `t0`..) to node 1.
async fn submit_continuous(cluster: &ServeCluster, pouch: &Pouch, n: usize) {
    for k in 0..n {
        let body = json!({"source": pouch.db("src"), "target": pouch.db(&format!("t{k}")),
            "continuous": true, "create_target": true});
        replicate(cluster, 0, &body).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_spread_over_serve_processes_and_transients_cancel_through_any_node() {
    let Some(etcd) = EtcdCluster::start(1).await else {
        return;
    };
    let pouch = Pouch::start().await;
    source(&pouch, "src", 20).await;
    let endpoints = etcd.endpoints().join(",");
    let mut cluster = ServeCluster::prepare(bin(), &endpoints, 3, "").unwrap();
    deadline(60, "jobs spread over the nodes", async {
        cluster.restart(0).await.unwrap();
        cluster.restart(1).await.unwrap();
        // Nine continuous replications, all submitted to node 1.
        submit_continuous(&cluster, &pouch, 9).await;
        let two = wait_for(20, "9 jobs spread over 2 nodes", || spread(&cluster, 9)).await;
        println!("2 nodes: {two:?}");
        // A third node joins and takes its part.
        cluster.restart(2).await.unwrap();
        let three = wait_for(20, "9 jobs spread over 3 nodes", || spread(&cluster, 9)).await;
        println!("3 nodes: {three:?}");

        // A transient replication submitted to node 1, listed and cancelled on node 2.
        let body = json!({"source": pouch.db("src"), "target": pouch.db("t-cancel"),
            "continuous": true, "create_target": true});
        let answer = replicate(&cluster, 0, &body).await;
        let id = answer["_local_id"].as_str().unwrap().to_owned();
        let listed = wait_for(10, "node 2 lists the new job", || async {
            let jobs = cluster.jobs(1).await.ok()?;
            jobs.into_iter()
                .find(|(rep_id, state, _)| *rep_id == id && state == "running")
        })
        .await;
        assert!(listed.2.starts_with("node"), "{listed:?}");
        let (status, cancelled) = cluster
            .call(
                1,
                Method::POST,
                "_replicate",
                Some(&json!({"replication_id": id, "cancel": true})),
            )
            .await
            .unwrap();
        assert_eq!(status, 200, "{cancelled}");
        wait_for(10, "the cancelled job stops on its node", || async {
            let gone = cluster.jobs(2).await.ok()?.iter().all(|(r, _, _)| *r != id);
            let total: usize = local_counts(&cluster).await.values().sum();
            (gone && total == 9).then_some(())
        })
        .await;
    })
    .await;
}

/// Failover is decided by `node_timeout`, not by the minute-long activity timeout: with
/// `job_timeout_sec = 61` (CouchDB's) and `node_timeout_sec = 6`, the jobs of a node killed
/// with SIGKILL run on the survivor within 20 s (they waited about a minute before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_jobs_run_elsewhere_within_the_node_timeout() {
    let Some(etcd) = EtcdCluster::start(1).await else {
        return;
    };
    let pouch = Pouch::start().await;
    source(&pouch, "src", 5).await;
    let endpoints = etcd.endpoints().join(",");
    let ini = "[replicator]\njob_timeout_sec = 61\nnode_timeout_sec = 6\n";
    let mut cluster = ServeCluster::prepare(bin(), &endpoints, 2, ini).unwrap();
    deadline(120, "failover within the node timeout", async {
        cluster.restart(0).await.unwrap();
        cluster.restart(1).await.unwrap();
        submit_continuous(&cluster, &pouch, 6).await;
        wait_for(30, "6 jobs spread over both nodes", || spread(&cluster, 6)).await;
        cluster.kill(1).await;
        let killed = std::time::Instant::now();
        wait_for(60, "the killed node's jobs run on the survivor", || async {
            let n = cluster.local_jobs(0).await.ok()?.len();
            (n == 6).then_some(())
        })
        .await;
        let took = killed.elapsed();
        eprintln!("failover took {took:?}");
        assert!(took < Duration::from_secs(20), "failover took {took:?}");
    })
    .await;
}

/// A rolling restart does not pause replications: with CouchDB's timings (`interval` 60 s,
/// `job_timeout` 61 s), node 1 runs 6 jobs, node 2 joins, node 1 is stopped with SIGTERM
/// (its jobs checkpoint and go back to pending): node 2 runs all 6 within 10 s. Before, it
/// took its half of them when they were enqueued and the rest only at its next interval,
/// once it read that node 1 had left (61 s in the field).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_nodes_jobs_run_elsewhere_at_once() {
    let Some(etcd) = EtcdCluster::start(1).await else {
        return;
    };
    let pouch = Pouch::start().await;
    source(&pouch, "src", 5).await;
    let endpoints = etcd.endpoints().join(",");
    let ini = "[replicator]\ninterval_sec = 60\njob_timeout_sec = 61\n";
    let mut cluster = ServeCluster::prepare(bin(), &endpoints, 2, ini).unwrap();
    deadline(150, "a stopped node's jobs move at once", async {
        cluster.restart(0).await.unwrap();
        submit_continuous(&cluster, &pouch, 6).await;
        wait_for(30, "node 1 runs the 6 jobs", || async {
            let n = cluster.local_jobs(0).await.ok()?.len();
            (n == 6).then_some(())
        })
        .await;
        cluster.restart(1).await.unwrap();
        // Node 2 is a member (node 1 saw it join) before node 1 stops.
        tokio::time::sleep(Duration::from_secs(3)).await;
        cluster.stop(0).await;
        let stopped = std::time::Instant::now();
        wait_for(90, "node 2 runs the stopped node's jobs", || async {
            let n = cluster.local_jobs(1).await.ok()?.len();
            (n == 6).then_some(())
        })
        .await;
        let took = stopped.elapsed();
        eprintln!("hand-over took {took:?}");
        assert!(took < Duration::from_secs(10), "hand-over took {took:?}");
    })
    .await;
}

/// A node whose wall clock runs 90 s ahead (an unsynchronised VM: libfaketime, monotonic
/// clock untouched) takes nothing over: with an activity timeout of 5 s its view of the
/// others' heartbeats is 90 s old at every beat, yet for 20 s neither node removes the other
/// and the jobs stay on both. Before liveness was judged by what each node saw change, the
/// skewed node removed its neighbour at every heartbeat and ended up running every job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_runs_ahead_takes_nothing_over() {
    let Some(lib) = libfaketime() else {
        eprintln!("skipped: libfaketime is not installed (apt-get install faketime)");
        return;
    };
    let Some(etcd) = EtcdCluster::start(1).await else {
        return;
    };
    let pouch = Pouch::start().await;
    source(&pouch, "src", 5).await;
    let endpoints = etcd.endpoints().join(",");
    let mut cluster = ServeCluster::prepare(bin(), &endpoints, 2, "").unwrap();
    cluster.set_env(1, "LD_PRELOAD", lib);
    cluster.set_env(1, "FAKETIME", "+90s");
    cluster.set_env(1, "FAKETIME_DONT_FAKE_MONOTONIC", "1");
    deadline(90, "a skewed clock takes nothing over", async {
        cluster.restart(0).await.unwrap();
        cluster.restart(1).await.unwrap();
        submit_continuous(&cluster, &pouch, 6).await;
        wait_for(30, "6 jobs spread over both nodes", || spread(&cluster, 6)).await;
        for second in 0..20 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let counts = local_counts(&cluster).await;
            assert!(
                counts.values().all(|n| *n > 0) && counts.values().sum::<usize>() == 6,
                "after {second} s: {counts:?}"
            );
        }
        for i in 0..2 {
            let log = std::fs::read_to_string(cluster.log_path(i)).unwrap_or_default();
            assert!(
                !log.contains("removed dead neighbour") && !log.contains("removed as dead"),
                "node {}: {log}",
                i + 1
            );
        }
    })
    .await;
}

/// One sample of every node's own jobs, twice in a row (A B C A B C): a job that node X
/// showed in both of its samples ran there all along, so any other node showing it in
/// between ran it at the same time.
async fn doubled(cluster: &ServeCluster) -> Vec<String> {
    let nodes = cluster.running();
    let mut rounds: Vec<Vec<HashSet<String>>> = Vec::new();
    for _ in 0..2 {
        let mut round = Vec::new();
        for &i in &nodes {
            let jobs = cluster.local_jobs(i).await.unwrap_or_default();
            round.push(jobs.into_iter().collect::<HashSet<_>>());
        }
        rounds.push(round);
    }
    let mut out = Vec::new();
    for x in 0..nodes.len() {
        for job in rounds[0][x].intersection(&rounds[1][x]) {
            // Samples between X's two: the later nodes of round 1, the earlier of round 2.
            let between = (x + 1..nodes.len())
                .map(|y| &rounds[0][y])
                .chain((0..x).map(|y| &rounds[1][y]));
            if between.into_iter().any(|s| s.contains(job)) {
                out.push(job.clone());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_serve_processes_survive_node_and_etcd_member_kills_and_a_cut_off() {
    let Some(mut etcd) = EtcdCluster::start(3).await else {
        return;
    };
    let pouch = Pouch::start().await;
    let endpoints = etcd.endpoints().join(",");
    pouch.put("jobs_replicator", json!({})).await;
    let ini = format!(
        "[replicator_dbs]\njobs_replicator = {}\n",
        pouch.db("jobs_replicator")
    );
    // Node 3 reaches etcd only through relays, one per member, to be cut off later.
    let mut relays = Vec::new();
    for endpoint in etcd.endpoints() {
        let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
        relays.push(Relay::start(port).await.unwrap());
    }
    let via_relays: Vec<String> = relays
        .iter()
        .map(|r| format!("http://127.0.0.1:{}", r.port))
        .collect();
    let mut cluster = ServeCluster::prepare(bin(), &endpoints, 3, &ini).unwrap();
    cluster.set_endpoints(2, via_relays.join(","));
    for i in 0..3 {
        cluster.restart(i).await.unwrap();
    }
    let persistent = 6;
    let transient = 3;
    for k in 0..persistent + transient {
        source(&pouch, &format!("s{k}"), 30).await;
    }
    for k in 0..persistent {
        pouch
            .put(
                &format!("jobs_replicator/r{k}"),
                json!({"source": pouch.db(&format!("s{k}")),
                    "target": pouch.db(&format!("t{k}")), "continuous": true,
                    "create_target": true}),
            )
            .await;
    }
    deadline(
        150,
        "a cluster that loses a node and an etcd member and has one cut off",
        async {
            // Transient one-shot jobs, one through each node.
            let mut waits = Vec::new();
            for k in persistent..persistent + transient {
                let body = json!({"source": pouch.db(&format!("s{k}")),
                "target": pouch.db(&format!("t{k}")), "create_target": true});
                let (node, base) = (k % 3, cluster.nodes[k % 3].base.clone());
                waits.push(tokio::spawn(async move {
                    let resp = reqwest::Client::new()
                        .post(format!("{base}/_replicate"))
                        .basic_auth("admin", Some("admin"))
                        .json(&body)
                        .timeout(Duration::from_secs(60))
                        .send()
                        .await;
                    (node, resp.map(|r| r.status().as_u16()))
                }));
            }
            // A transient job exists once its node has stored it; its target (created by the
            // job) says it did, so the node killed below has a job to lose, not a request.
            wait_for(
                30,
                "every continuous job running, every transient one started",
                || async {
                    let jobs = cluster.jobs(0).await.ok()?;
                    let running = jobs.iter().filter(|(_, s, _)| s == "running").count();
                    for k in persistent..persistent + transient {
                        if pouch.get(&format!("t{k}")).await.0 != 200 {
                            return None;
                        }
                    }
                    (running >= persistent).then_some(())
                },
            )
            .await;
            eprintln!("step: every continuous job running, every transient one started");
            let mut seen_twice = Vec::new();
            seen_twice.extend(doubled(&cluster).await);
            cluster.kill(1).await;
            etcd.kill(0);
            for k in 0..persistent {
                add_docs(&pouch, &format!("s{k}"), 30, 10).await;
            }
            for _ in 0..10 {
                seen_twice.extend(doubled(&cluster).await);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            etcd.restart(0);
            eprintln!("step: node 2 and etcd member 1 killed, member 1 restarted");
            for w in waits {
                let (node, status) = w.await.unwrap();
                // The killed node's own request dies with it; its job runs elsewhere.
                if node != 1 {
                    assert_eq!(status.ok(), Some(200), "transient through node {node}");
                }
            }
            eprintln!("step: transient replies in");
            // Node 3 cut off etcd while it runs jobs and the sources change: it must stop
            // them before node 1 (the only other node left) may take them over.
            wait_for(30, "node 3 running jobs before the cut", || async {
                let n = cluster.local_jobs(2).await.ok()?.len();
                (n > 0).then_some(())
            })
            .await;
            for r in &relays {
                r.block();
            }
            for k in 0..persistent {
                add_docs(&pouch, &format!("s{k}"), 40, 10).await;
            }
            // Sampled all along: the doubled-job check is the point of this phase.
            let cut_at = std::time::Instant::now();
            loop {
                seen_twice.extend(doubled(&cluster).await);
                let on_1 = cluster.local_jobs(0).await.map_or(0, |j| j.len());
                let on_3 = cluster.local_jobs(2).await.map_or(usize::MAX, |j| j.len());
                if on_1 >= persistent && on_3 == 0 {
                    break;
                }
                assert!(
                    cut_at.elapsed() < Duration::from_secs(40),
                    "40 s after the cut node 1 runs {on_1} jobs and node 3 {on_3}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            eprintln!("step: node 3 cut off, its jobs moved to node 1");
            for r in &relays {
                r.unblock();
            }
            // Node 3 reaches etcd again and finds its locks gone: still never twice.
            for _ in 0..10 {
                seen_twice.extend(doubled(&cluster).await);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            // Every target complete, sampling the nodes all along.
            let mut last_short = None;
            loop {
                seen_twice.extend(doubled(&cluster).await);
                let mut short = Vec::new();
                for k in 0..persistent + transient {
                    let want = if k < persistent { 50 } else { 30 };
                    let have = doc_count(&pouch, &format!("t{k}")).await;
                    if have != want {
                        short.push((k, have, want));
                    }
                }
                if last_short.as_ref() != Some(&short) {
                    eprintln!("step: targets short (k, have, want): {short:?}");
                    last_short = Some(short.clone());
                }
                if short.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            assert!(
                seen_twice.is_empty(),
                "jobs on two nodes at once: {seen_twice:?}"
            );
            // Quiet, then every member at one revision with one hash (the restarted one
            // catches up).
            for i in cluster.running() {
                cluster.kill(i).await;
            }
            wait_for(20, "hashkv equal on every member", || async {
                let h = etcd.hashkv().await;
                let same = h.len() == 3 && h.iter().all(|m| (m.1, m.2) == (h[0].1, h[0].2));
                same.then_some(h)
            })
            .await;
        },
    )
    .await;
}
