//! End to end: a whole-server replication started over `POST /_replicate` on a real
//! `couch-replicator serve` survives `kill -9` of that process: restarted on the same data
//! dir, the node takes the server job and its per-database replications back (once the
//! activity timeout found them abandoned) and every database ends complete and equal to its
//! source.

use std::process::Stdio;

use serde_json::{Value, json};

use crate::support::couch::{Couch, numbered_docs};
use crate::support::replicator::Pouch;
use crate::support::serve::{ServeProcess, spawn_serve};
use crate::support::{deadline, wait_for};

const ADMIN: (&str, &str) = ("admin", "all-dbs-secret");

async fn start(dir: &std::path::Path) -> ServeProcess {
    let cfg = dir.join("node.ini");
    std::fs::write(
        &cfg,
        format!(
            "[replicator]\ninterval_sec = 1\nstartup_jitter = 100\nstats_update_interval_sec = 1\n\
             job_timeout_sec = 3\n[admins]\n{} = {}\n[users]\nbob = bob-pw\n",
            ADMIN.0, ADMIN.1
        ),
    )
    .unwrap();
    spawn_serve(&dir.join("data"), &cfg, &[], "warn", Stdio::inherit()).await
}

async fn call(node: &ServeProcess, m: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let (status, v) = call_as(node, ADMIN, m, path, body).await;
    assert!(status < 300, "{path}: {status} {v}");
    v
}

async fn call_as(
    node: &ServeProcess,
    who: (&str, &str),
    m: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = reqwest::Client::new()
        .request(m, format!("{}{path}", node.base))
        .basic_auth(who.0, Some(who.1));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Bad requests get CouchDB-style errors: a non-admin 403, a bad option 400, an unknown job
/// 404.
async fn refusals(node: &ServeProcess, body: &Value) {
    let post = reqwest::Method::POST;
    let (s, v) = call_as(
        node,
        ("bob", "bob-pw"),
        post.clone(),
        "/_replicate",
        Some(body.clone()),
    )
    .await;
    assert_eq!((s, v["error"].as_str()), (403, Some("forbidden")), "{v}");
    let mut bad = body.clone();
    bad["include"] = json!("db-*");
    let (s, v) = call_as(node, ADMIN, post, "/_replicate", Some(bad)).await;
    assert_eq!((s, v["error"].as_str()), (400, Some("bad_request")), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("include"), "{v}");
    let get = reqwest::Method::GET;
    let (s, v) = call_as(node, ADMIN, get, "/_scheduler/all_dbs/nope", None).await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_job_survives_kill_9_of_its_node() {
    deadline(300, "a server job across kill -9", async {
        let (src, tgt) = tokio::join!(Pouch::start(), Pouch::start());
        let (cs, ct) = (Couch::new(&src.url("")), Couch::new(&tgt.url("")));
        let mut names = Vec::new();
        for i in 0..50 {
            let db = format!("db-{i:02}");
            cs.create_db(&db).await;
            cs.bulk_insert(&db, &numbered_docs("d", 200)).await;
            names.push(db);
        }
        let dir = tempfile::tempdir().unwrap();
        let mut node = start(dir.path()).await;
        let body = json!({"all_dbs": true, "source": src.url(""), "target": tgt.url(""),
            "create_target": true});
        refusals(&node, &body).await;
        let added = call(&node, reqwest::Method::POST, "/_replicate", Some(body)).await;
        let id = added["id"].as_str().unwrap().to_owned();
        let path = format!("/_scheduler/all_dbs/{id}");
        // Kill as soon as the job has listed the source and started replicating.
        wait_for(60, "the server job to list the source", || async {
            let v = call(&node, reqwest::Method::GET, &path, None).await;
            (v["total"] == 50).then_some(())
        })
        .await;
        let before = call(&node, reqwest::Method::GET, &path, None).await;
        node.child.start_kill().unwrap();
        node.child.wait().await.unwrap();

        let node = start(dir.path()).await;
        let done = wait_for(180, "the server job to complete after restart", || async {
            let v = call(&node, reqwest::Method::GET, &path, None).await;
            (v["state"] == "completed").then_some(v)
        })
        .await;
        eprintln!(
            "completed before kill: {}, after restart: {}",
            before["completed"], done["completed"]
        );
        assert_eq!(
            (done["total"].clone(), done["failed"].clone()),
            (json!(50), json!(0))
        );
        assert_eq!(done["completed"], 50);
        for db in &names {
            assert_eq!(cs.assert_same(db, &ct, db).await, 200, "{db}");
        }
        // And the operator's own check agrees: `verify --all-dbs` exits 0.
        verify_all_dbs(&src.url(""), &tgt.url(""), names.len()).await;
        // The listing shows it too, without credentials.
        let all = call(&node, reqwest::Method::GET, "/_scheduler/all_dbs", None).await;
        assert_eq!(all["total_rows"], 1);
        assert_eq!(all["jobs"][0]["source"], src.url("").trim_end_matches('/'));
        // Its replications come from no `_replicator` document.
        let docs = call(&node, reqwest::Method::GET, "/_scheduler/docs", None).await;
        assert_eq!(docs["total_rows"], 0, "{docs}");
    })
    .await;
}

/// `couch-replicator verify --all-dbs SRC TGT --json` reports all `dbs` databases complete.
async fn verify_all_dbs(src: &str, tgt: &str, dbs: usize) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
        .args(["verify", "--all-dbs", "--json", src, tgt])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = deadline(120, "verify --all-dbs", out).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verify --all-dbs: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["complete"], true, "{stdout}");
    assert_eq!(
        report["databases"].as_array().map(Vec::len),
        Some(dbs),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_replicate_all_dbs_copies_a_server() {
    let (src, tgt) = tokio::join!(Pouch::start(), Pouch::start());
    let (cs, ct) = (Couch::new(&src.url("")), Couch::new(&tgt.url("")));
    for db in ["a1", "a2", "a3", "skip"] {
        cs.create_db(db).await;
        cs.bulk_insert(db, &numbered_docs("d", 20)).await;
    }
    let home = tempfile::tempdir().unwrap();
    let (s, t) = (src.url(""), tgt.url(""));
    let args = [
        "replicate",
        "--all-dbs",
        &s,
        &t,
        "--create-target",
        "--exclude",
        "skip",
    ];
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
        .args(args)
        .env("COUCH_REPLICATOR_HOME", home.path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = deadline(120, "replicate --all-dbs", out).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("done: 3 databases, 3 completed, 0 failed, 60 docs written"),
        "{stderr}"
    );
    for db in ["a1", "a2", "a3"] {
        assert_eq!(cs.assert_same(db, &ct, db).await, 20, "{db}");
    }
    assert_eq!(ct.db_info("skip").await.0, 404);
}
