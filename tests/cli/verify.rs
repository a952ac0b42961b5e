//! The built `couch-replicator verify` binary against pouchdb-servers: exit code 1 and the
//! missing leaves for an incomplete target (summary and `--json`), 0 with a `doc_ids` filter
//! that selects only what the target holds, 2 with a one-line error for a missing database,
//! and `--all-dbs` over two servers (system databases left out unless `--include`d).

use std::process::Stdio;

use crate::support::couch::Couch;
use crate::support::deadline;
use crate::support::server::PouchServer;
use crate::support::verify::{self as fixture, missing_of};
use serde_json::Value;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn verify(args: &[&str]) -> Run {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
        .arg("verify")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the binary");
    let out = deadline(60, &format!("verify {args:?}"), child.wait_with_output())
        .await
        .expect("binary output");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn json(r: &Run) -> Value {
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_says_whether_the_target_is_complete() {
    let a = PouchServer::start().await;
    let b = PouchServer::start().await;
    let want =
        fixture::incomplete(&Couch::new(&a.root()), "src", &Couch::new(&b.root()), "tgt").await;
    let (src, tgt) = (a.db_url("src"), b.db_url("tgt"));

    let r = verify(&[&src, &tgt]).await;
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.starts_with("INCOMPLETE"), "{}", r.stdout);
    assert!(r.stdout.contains(&fixture::rev(2, "l2")), "{}", r.stdout);

    let r = verify(&[
        "--json",
        "--deep",
        "--doc-ids",
        "att,conflict,deleted,leaf,same",
        &src,
        &tgt,
    ])
    .await;
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let v = json(&r);
    assert_eq!(missing_of(&v), want.missing, "{v}");
    assert_eq!(v["leaves_different"], 1, "{v}");

    let r = verify(&["--json", "--deep", "--doc-ids", "same", &src, &tgt]).await;
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert_eq!(json(&r)["leaves_checked"], 1);

    let r = verify(&[&src, &b.db_url("nowhere")]).await;
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].starts_with("error: db_not_found"), "{}", lines[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_dbs_checks_every_database_of_the_source_server() {
    let a = PouchServer::start().await;
    let b = PouchServer::start().await;
    let (ca, cb) = (Couch::new(&a.root()), Couch::new(&b.root()));
    for db in ["one", "two"] {
        ca.create_db(db).await;
        cb.create_db(db).await;
        let docs = [fixture::revision("d", &["x"], serde_json::json!({}))];
        ca.bulk_no_edits(db, &docs).await;
        cb.bulk_no_edits(db, &docs).await;
    }
    let r = verify(&["--all-dbs", "--json", &a.root(), &b.root()]).await;
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let v = json(&r);
    let dbs: Vec<&str> = v["databases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["db"].as_str().unwrap())
        .collect();
    assert!(dbs.contains(&"one") && dbs.contains(&"two"), "{v}");
    assert!(dbs.iter().all(|d| !d.starts_with('_')), "{v}");

    // A database the target lacks makes the run incomplete, not a failure.
    ca.create_db("three").await;
    ca.bulk_no_edits(
        "three",
        &[fixture::revision("d", &["x"], serde_json::json!({}))],
    )
    .await;
    let r = verify(&["--all-dbs", "--json", &a.root(), &b.root()]).await;
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    let v = json(&r);
    let three = v["databases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["db"] == "three")
        .cloned()
        .unwrap_or_default();
    assert!(
        three["error"]
            .as_str()
            .is_some_and(|e| e.contains("db_not_found")),
        "{v}"
    );
}
