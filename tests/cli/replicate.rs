//! The built `couch-replicator replicate` binary: a real replication between two
//! pouchdb-server databases, one-line errors (no panic, no backtrace) for a bad URL and a
//! missing database, no password in them, and the persisted server uuid.

use std::process::Stdio;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::deadline;
use crate::support::server::PouchServer;

struct Run {
    code: Option<i32>,
    stderr: String,
}

async fn cli(home: &std::path::Path, args: &[&str]) -> Run {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
        .arg("replicate")
        .args(args)
        .env("COUCH_REPLICATOR_HOME", home)
        .env("RUST_BACKTRACE", "1")
        .env_remove("COUCH_REPLICATOR_UUID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the binary");
    let out = deadline(
        60,
        &format!("couch-replicator replicate {args:?}"),
        child.wait_with_output(),
    )
    .await
    .expect("binary output");
    Run {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn assert_one_line_error(r: &Run, must_contain: &str) {
    assert_eq!(r.code, Some(1), "stderr: {}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected, got: {}", r.stderr);
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(lines[0].contains(must_contain), "{}", lines[0]);
    assert!(
        !r.stderr.contains("panicked") && !r.stderr.contains("backtrace"),
        "{}",
        r.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicates_and_reports_errors_in_one_line() {
    let home = tempfile::tempdir().unwrap();
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.bulk_insert("src", &numbered_docs("cli", 250)).await;

    let ok = cli(
        home.path(),
        &[&a.db_url("src"), &a.db_url("tgt"), "--create-target"],
    )
    .await;
    assert_eq!(ok.code, Some(0), "stderr: {}", ok.stderr);
    assert!(ok.stderr.contains("250 written"), "{}", ok.stderr);
    c.assert_same("src", &c, "tgt").await;
    let uuid = std::fs::read_to_string(home.path().join("uuid")).expect("uuid persisted");
    assert_eq!(uuid.trim().len(), 32, "{uuid}");
    // Same uuid, same id: the second run resumes from the checkpoint and reads nothing new.
    let again = cli(home.path(), &[&a.db_url("src"), &a.db_url("tgt")]).await;
    assert_eq!(again.code, Some(0), "stderr: {}", again.stderr);
    assert_eq!(
        std::fs::read_to_string(home.path().join("uuid")).unwrap(),
        uuid
    );
    let id_of = |r: &Run| {
        let at = r
            .stderr
            .find("replication ")
            .expect("replication id printed")
            + 12;
        r.stderr[at..at + 32].to_owned()
    };
    assert_eq!(id_of(&again), id_of(&ok));
    assert!(again.stderr.contains("through seq 250"), "{}", again.stderr);
    // Another installation (another uuid) gets another replication id.
    let other = tempfile::tempdir().unwrap();
    let third = cli(other.path(), &[&a.db_url("src"), &a.db_url("tgt")]).await;
    assert_ne!(id_of(&third), id_of(&ok));

    let bad = cli(home.path(), &["not a url", &a.db_url("tgt")]).await;
    assert_one_line_error(&bad, "invalid endpoint");
    let bad = cli(home.path(), &["ftp://127.0.0.1/x", &a.db_url("tgt")]).await;
    assert_one_line_error(&bad, "unsupported protocol");

    let secret = "hunter22";
    let missing = a
        .db_url("nope")
        .replace("http://", &format!("http://admin:{secret}@"));
    let r = cli(home.path(), &[&missing, &a.db_url("tgt")]).await;
    assert_one_line_error(&r, "/nope");
    assert!(!r.stderr.contains(secret), "{}", r.stderr);
    let r = cli(home.path(), &[&a.db_url("src"), &a.db_url("absent")]).await;
    assert_one_line_error(&r, "db_not_found");
}
