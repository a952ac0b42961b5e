//! A real local cluster to try: a 3-member etcd (started here by pid on free loopback ports,
//! data in temp dirs) and N `couch-replicator serve` processes sharing it, each with its own
//! port, config and node name and the same `[couchdb] uuid`, as N machines would run them
//! (docs/operations.md, "Several machines"). Prints every node, then where each job runs
//! whenever that changes. Commands on stdin:
//!
//! * `jobs`: every job and the node that runs it (`_scheduler/jobs`);
//! * `kill I`: SIGKILL node I (`kill -9`; its jobs run elsewhere within two activity timeouts);
//! * `start I`: start node I again;
//! * `kill-etcd M` / `start-etcd M`: SIGKILL / restart etcd member M (0..2);
//! * `quit`.
//!
//! ```sh
//! cargo run --example cluster -- 3 [SOURCE_DB_URL TARGET_SERVER_URL JOBS]
//! ```
//! With a source database and a target server, submits JOBS (default 6) continuous
//! replications SOURCE → TARGET_SERVER/cluster-target-K as `POST /_replicate`, each to the
//! next node in turn: they run spread over the nodes whichever node took them. Builds the
//! `couch-replicator` binary first (`COUCH_REPLICATOR_BIN` names another one); needs
//! `etcd` on PATH or in `ETCD_BIN` (`bash scripts/deps` installs it). Nodes log to files
//! named at start (`CLUSTER_LOG=info` for more).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

#[path = "../tests/support/etcd.rs"]
#[allow(dead_code)]
mod etcd;
#[path = "../tests/support/serve_cluster.rs"]
#[allow(dead_code)]
mod serve_cluster;

type AnyError = Box<dyn std::error::Error>;

/// The `serve` binary: `COUCH_REPLICATOR_BIN`, else built now by cargo next to this example
/// (same profile).
fn serve_binary() -> Result<PathBuf, AnyError> {
    if let Some(bin) = std::env::var_os("COUCH_REPLICATOR_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/examples/cluster → target/<profile>/couch-replicator
    let profile_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .ok_or("cannot locate the target directory")?;
    let mut cargo = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
    cargo
        // With the example in the same build: the same features (dev-dependencies turn some
        // on), so the binary is not rebuilt with other ones.
        .args(["build", "--bin", "couch-replicator", "--example", "cluster"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.ends_with("release") {
        cargo.arg("--release");
    }
    println!("building the couch-replicator binary ...");
    if !cargo.status()?.success() {
        return Err("cargo build --bin couch-replicator failed".into());
    }
    Ok(profile_dir.join("couch-replicator"))
}

/// One line per node: jobs it runs, and the pending ones.
async fn placement(cluster: &serve_cluster::ServeCluster) -> Option<String> {
    let first = *cluster.running().first()?;
    let jobs = cluster.jobs(first).await.ok()?;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for (_, state, node) in &jobs {
        let at = if state == "running" { node } else { state };
        *per_node.entry(at.clone()).or_default() += 1;
    }
    Some(format!("{} jobs: {per_node:?}", jobs.len()))
}

async fn print_jobs(cluster: &serve_cluster::ServeCluster) {
    let Some(&first) = cluster.running().first() else {
        println!("no node runs");
        return;
    };
    match cluster.jobs(first).await {
        Ok(jobs) => {
            for (id, state, node) in jobs {
                println!("  {id:.20}  {state:<9} {node}");
            }
        }
        Err(e) => println!("cannot list the jobs: {e}"),
    }
}

async fn submit(cluster: &serve_cluster::ServeCluster, src: &str, tgt: &str, jobs: usize) {
    let n = cluster.nodes.len();
    for k in 0..jobs {
        let target = format!("{}/cluster-target-{k}", tgt.trim_end_matches('/'));
        let body = json!({"source": src, "target": target, "continuous": true,
            "create_target": true});
        let node = k % n;
        match cluster
            .call(node, reqwest::Method::POST, "_replicate", Some(&body))
            .await
        {
            Ok((status, answer)) => println!("POST node{}/_replicate: {status} {answer}", node + 1),
            Err(e) => println!("POST node{}/_replicate: {e}", node + 1),
        }
    }
}

/// Runs one stdin command; `false` to quit.
async fn command(
    line: &str,
    cluster: &mut serve_cluster::ServeCluster,
    etcd: &mut etcd::EtcdCluster,
) -> bool {
    let mut words = line.split_whitespace();
    let (cmd, arg) = (words.next(), words.next().and_then(|w| w.parse().ok()));
    let nodes = cluster.nodes.len();
    match (cmd, arg) {
        (Some("quit"), _) => return false,
        (Some("jobs"), _) => print_jobs(cluster).await,
        (Some("kill"), Some(i)) if (1..=nodes).contains(&i) => {
            let pid = cluster.pid(i - 1);
            cluster.kill(i - 1).await;
            println!("node{i} (pid {pid:?}) killed with SIGKILL");
        }
        (Some("start"), Some(i)) if (1..=nodes).contains(&i) => {
            if cluster.pid(i - 1).is_some() {
                println!("node{i} runs already");
            } else {
                match cluster.restart(i - 1).await {
                    Ok(()) => println!("node{i}: {}", cluster.nodes[i - 1].base),
                    Err(e) => println!("node{i} did not start: {e}"),
                }
            }
        }
        (Some("kill-etcd"), Some(m)) if m < 3 => {
            etcd.kill(m);
            println!("etcd member {m} killed with SIGKILL");
        }
        (Some("start-etcd"), Some(m)) if m < 3 && etcd.pid(m).is_none() => {
            etcd.restart(m);
            println!("etcd member {m} started again");
        }
        _ => println!(
            "commands: jobs | kill I | start I (1..={nodes}) | kill-etcd M | start-etcd M (0..2) | quit"
        ),
    }
    true
}

#[tokio::main]
async fn main() -> Result<(), AnyError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(3);
    let bin = serve_binary()?;
    let Some(mut etcd) = etcd::EtcdCluster::start(3).await else {
        return Err("etcd is not installed (bash scripts/deps installs it)".into());
    };
    let endpoints = etcd.endpoints().join(",");
    for m in 0..3 {
        println!(
            "etcd member {m}: {} (pid {:?})",
            etcd.endpoint(m),
            etcd.pid(m)
        );
    }
    let mut cluster = serve_cluster::ServeCluster::start(&bin, &endpoints, n, "").await?;
    for i in 0..n {
        println!(
            "{}: {} (pid {:?}, log {})",
            cluster.nodes[i].name,
            cluster.nodes[i].base,
            cluster.pid(i),
            cluster.log_path(i).display()
        );
    }
    println!(
        "admin:admin on every node, e.g. curl -u admin:admin {}/_scheduler/jobs",
        cluster.nodes[0].base
    );
    if let (Some(src), Some(tgt)) = (args.get(1), args.get(2)) {
        let jobs = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(6);
        submit(&cluster, src, tgt, jobs).await;
    }
    println!("commands: jobs | kill I | start I | kill-etcd M | start-etcd M | quit");

    // Lines from stdin on a plain thread (tokio's io-std feature is not enabled).
    let (line_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let mut last = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = placement(&cluster).await;
                if now.is_some() && now != last {
                    println!("{}", now.as_deref().unwrap_or_default());
                    last = now;
                }
            }
            line = lines.recv() => {
                let Some(line) = line else { break };
                if !command(&line, &mut cluster, &mut etcd).await {
                    break;
                }
            }
        }
    }
    // Dropping the cluster and etcd kills every process they started.
    Ok(())
}
