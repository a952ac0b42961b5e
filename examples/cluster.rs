//! N replicator nodes in one process on one embedded store, each with its own tree and HTTP
//! port, like N machines sharing a FoundationDB cluster. Prints where every job runs every
//! two seconds. Commands on stdin: `kill I` (crash node I: its jobs are re-enqueued by the
//! activity monitor and picked up by the others), `stop I` (graceful), `quit`.
//!
//! ```sh
//! cargo run --example cluster -- 3 [SOURCE_URL TARGET_SERVER_URL JOBS]
//! ```
//! With a source database and a target server, adds JOBS (default 6) continuous
//! replications SOURCE → TARGET_SERVER/cluster-target-K. With `ETCD_ENDPOINTS=URL[,URL]` the
//! nodes share that etcd cluster (under the prefix `couch-replicator-example/`) instead of an
//! embedded store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::http::{self, AppState, HttpConfig, auth::Users};
use couch_replicator::replicator::{JobKind, NewJob, Replicator, ReplicatorConfig};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use couch_replicator::store::etcd::{EtcdConfig, EtcdStore};
use serde_json::json;

struct Node {
    replicator: Arc<Replicator>,
    server: tokio::task::JoinHandle<()>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(3);
    let dir = std::env::temp_dir().join(format!("couch-replicator-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = match std::env::var("ETCD_ENDPOINTS") {
        Ok(endpoints) => {
            let endpoints = endpoints.split(',').map(str::to_owned).collect();
            let config = EtcdConfig::new(endpoints).with_prefix("couch-replicator-example/");
            println!("job store: etcd {:?}", config.endpoints);
            Db::new(Arc::new(EtcdStore::connect(&config).await?))
        }
        Err(_) => Db::new(Arc::new(EmbeddedStore::open(dir.join("jobs.redb"))?)),
    };

    let mut nodes: BTreeMap<usize, Node> = BTreeMap::new();
    for i in 1..=n {
        let mut config = ReplicatorConfig::new(db.clone());
        config.node = format!("node{i}@127.0.0.1");
        config.server_uuid = "example-cluster".into();
        config.settings.startup_jitter = Duration::from_millis(200);
        config.settings.job_timeout = Duration::from_secs(10);
        config.settings.interval = Duration::from_secs(2);
        // Notice dead nodes' jobs within seconds rather than minutes.
        config.jobs.config.type_check_period = Duration::from_millis(500);
        config.jobs.config.activity_monitor_max_jitter = Duration::from_millis(500);
        let replicator = Arc::new(Replicator::start(config).await?);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("node{i}: http://{}", listener.local_addr()?);
        let state = AppState::new(
            replicator.clone(),
            HttpConfig {
                users: Users::new([("admin".to_string(), "admin".to_string())], []),
                ..HttpConfig::default()
            },
        );
        let server = tokio::spawn(async move {
            let _ = http::serve(listener, state, std::future::pending()).await;
        });
        nodes.insert(i, Node { replicator, server });
    }

    if let (Some(src), Some(tgt)) = (args.get(1), args.get(2)) {
        let jobs: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(6);
        let first = nodes.values().next().ok_or("no nodes")?;
        for k in 0..jobs {
            let target = format!("{}/cluster-target-{k}", tgt.trim_end_matches('/'));
            first
                .replicator
                .add(NewJob {
                    kind: JobKind::Transient { user: None },
                    rep: json!({"source": src, "target": target, "continuous": true,
                        "create_target": true}),
                })
                .await?;
        }
        println!("added {jobs} continuous replications");
    }
    println!("commands: kill I | stop I | quit");

    // Lines from stdin on a plain thread (tokio's stdin is not enabled in this crate).
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
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let Some(any) = nodes.values().next() else { break };
                let jobs = any.replicator.list().await?;
                let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
                for j in &jobs {
                    let at = j.node.clone().unwrap_or_else(|| "-".into());
                    println!("  job {:.12}  {:<9} on {at}", j.job_id, j.state.as_str());
                    *per_node.entry(at).or_default() += 1;
                }
                println!("jobs per node: {per_node:?}");
            }
            line = lines.recv() => {
                let Some(line) = line else { break };
                let mut words = line.split_whitespace();
                match (words.next(), words.next().and_then(|w| w.parse::<usize>().ok())) {
                    (Some("kill"), Some(i)) => match nodes.remove(&i) {
                        Some(node) => {
                            node.server.abort();
                            let _ = node.server.await;
                            match Arc::try_unwrap(node.replicator) {
                                Ok(r) => r.kill().await,
                                Err(_) => eprintln!("node{i} is still in use"),
                            }
                            println!("node{i} killed");
                        }
                        None => println!("no node{i}"),
                    },
                    (Some("stop"), Some(i)) => match nodes.remove(&i) {
                        Some(node) => {
                            node.server.abort();
                            let _ = node.server.await;
                            if let Ok(r) = Arc::try_unwrap(node.replicator) {
                                r.shutdown().await;
                            }
                            println!("node{i} stopped");
                        }
                        None => println!("no node{i}"),
                    },
                    (Some("quit"), _) => break,
                    _ => println!("commands: kill I | stop I | quit"),
                }
            }
        }
    }
    for (_, node) in nodes {
        node.server.abort();
        let _ = node.server.await;
        if let Ok(r) = Arc::try_unwrap(node.replicator) {
            r.shutdown().await;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
