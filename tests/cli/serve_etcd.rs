//! `serve --etcd-endpoints`: a node keeps its jobs in a real etcd (one member started by pid)
//! and replicates between two pouchdb-servers; a second node whose `[couchdb] uuid` differs
//! from the one the first node recorded in the store is refused at start, naming the uuid
//! to set; one with the same uuid joins.

use std::process::Stdio;
use std::time::Duration;

use crate::support::deadline;
use crate::support::etcd::EtcdCluster;
use crate::support::http::Pouch;
use serde_json::{Value, json};

const ADMIN: (&str, &str) = ("admin", "etcd-secret");

fn config(dir: &std::path::Path, name: &str, uuid: &str) -> std::path::PathBuf {
    let cfg = dir.join(format!("{name}.ini"));
    std::fs::write(
        &cfg,
        format!(
            "[replicator]\ninterval_sec = 1\nstartup_jitter = 100\n[admins]\n{} = {}\n\
             [couchdb]\nuuid = {uuid}\nnode_name = {name}@127.0.0.1\n",
            ADMIN.0, ADMIN.1
        ),
    )
    .unwrap();
    cfg
}

async fn refused(dir: &std::path::Path, endpoints: &str, uuid: &str) -> String {
    let cfg = config(dir, "other", uuid);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.join("data-other"))
        .arg("--config")
        .arg(&cfg)
        .args(["--port", "0", "--etcd-endpoints", endpoints])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("a refused node exits")
        .expect("run serve");
    assert!(
        !out.status.success(),
        "a node with another uuid must not start"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_jobs_in_etcd_and_refuses_another_uuid() {
    let Some(etcd) = EtcdCluster::start(1).await else {
        return;
    };
    deadline(120, "serve on etcd", async {
        let endpoints = etcd.endpoints().join(",");
        let (a, b) = tokio::join!(Pouch::start(), Pouch::start());
        a.put("src", json!({})).await;
        let docs: Vec<Value> = (0..50)
            .map(|i| json!({"_id": format!("d{i:03}")}))
            .collect();
        reqwest::Client::new()
            .post(format!("{}/_bulk_docs", a.db("src")))
            .json(&json!({ "docs": docs }))
            .send()
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), "n1", "cluster-uuid-1");
        let node = crate::support::serve::spawn_serve(
            &dir.path().join("data-n1"),
            &cfg,
            &["--etcd-endpoints", &endpoints],
            "warn",
            Stdio::inherit(),
        )
        .await;
        let resp = reqwest::Client::new()
            .post(format!("{}/_replicate", node.base))
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .json(&json!({"source": a.db("src"), "target": b.db("tgt"), "create_target": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let done: Value = resp.json().await.unwrap();
        assert_eq!(done["history"][0]["docs_written"], 50, "{done}");
        let (_, info) = b.get("tgt").await;
        assert_eq!(info["doc_count"], 50);
        // The engine's own counters are on /metrics: commits went to etcd as Txns, and the
        // replica served watches (a watch set before its first load goes to etcd).
        let metrics = reqwest::get(format!("{}/metrics", node.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let counter = |name: &str| {
            let line = metrics.lines().find(|l| l.starts_with(&format!("{name} ")));
            line.and_then(|l| l.split(' ').nth(1)?.parse::<f64>().ok())
        };
        let txns = counter("couch_replicator_store_etcd_txns_total");
        assert!(txns.is_some_and(|n| n > 0.0), "{metrics}");
        let served = counter("couch_replicator_store_etcd_replica_watches_total");
        assert!(served.is_some_and(|n| n > 0.0), "{metrics}");
        assert!(counter("couch_replicator_store_etcd_native_watches_total").is_some());

        let stderr = refused(dir.path(), &endpoints, "another-uuid").await;
        assert!(
            stderr.contains("cluster-uuid-1") && stderr.contains("[couchdb] uuid"),
            "{stderr}"
        );
        // The same uuid joins.
        let cfg2 = config(dir.path(), "n2", "cluster-uuid-1");
        let second = crate::support::serve::spawn_serve(
            &dir.path().join("data-n2"),
            &cfg2,
            &["--etcd-endpoints", &endpoints],
            "warn",
            Stdio::inherit(),
        )
        .await;
        let up = reqwest::get(format!("{}/_up", second.base)).await.unwrap();
        assert_eq!(up.status().as_u16(), 200);
    })
    .await;
}
