//! `couch-replicator steps ...`: the built binary against a real `/_steps` server on a
//! loopback port (real store, real steps nodes): submit with `--watch` to success and to
//! failure (exit status 1), from standard input, `get`, `list --state`, a rejected job
//! file, wrong credentials.

use crate::support::deadline;
use std::process::Output;
use std::sync::Arc;

use crate::support::steps::{ADMIN, Cluster, Recorder, serve_steps, test_config};
use serde_json::Value;

/// Runs the binary with `args` against `url`; no credentials from the environment.
async fn cli(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
        .arg("steps")
        .arg("--url")
        .arg(url)
        .args(args)
        .env_remove("COUCH_REPLICATOR_AUTH")
        .env_remove("COUCH_REPLICATOR_URL")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

fn with_admin(base: &str) -> String {
    base.replacen("http://", &format!("http://{}:{}@", ADMIN.0, ADMIN.1), 1)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_watch_get_and_list() {
    deadline(90, "submit watch get and list", async {
        let mut c = Cluster::open(test_config()).await;
        let rec = Recorder::default();
        c.start_node("a", 2, Arc::new(rec.clone())).await;
        let (base, server) = serve_steps(c.api("front")).await;
        let url = with_admin(&base);
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.json");
        std::fs::write(
            &good,
            r#"{"steps": [{"target": "a", "command": "sleep 0.1"},
                          {"target": "any", "command": "flaky 1", "retry": {"max_retries": 2}}]}"#,
        )
        .unwrap();
        let out = cli(&url, &["submit", good.to_str().unwrap(), "--watch"]).await;
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        let id = stdout.lines().next().unwrap().trim().to_string();
        assert_eq!(id.len(), 32, "{stdout}");
        assert!(stdout.contains("step 0 [a] succeeded on a/"), "{stdout}");
        assert!(
            stdout.contains("step 1 [any] succeeded") && stdout.contains("after 2 attempt(s)"),
            "{stdout}"
        );
        assert!(
            stdout.trim_end().ends_with(&format!("job {id}: success")),
            "{stdout}"
        );

        let bad = dir.path().join("bad.json");
        std::fs::write(
            &bad,
            r#"{"steps": [{"target": "a", "command": "exit 5", "alt_command": "exit 6"}]}"#,
        )
        .unwrap();
        let out = cli(&url, &["submit", bad.to_str().unwrap(), "--watch"]).await;
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stdout}");
        let failed_id = stdout.lines().next().unwrap().trim().to_string();
        assert!(
            stdout.contains("step 0 [a] failed")
                && stdout.contains("exit 5")
                && stdout.contains("alternative exit 6"),
            "{stdout}"
        );
        assert!(text(&out.stderr).contains(&format!("job {failed_id} failed")));

        let out = cli(&url, &["get", &id]).await;
        assert!(out.status.success());
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (v["id"].as_str(), v["state"].as_str()),
            (Some(id.as_str()), Some("success"))
        );
        assert_eq!(v["steps"][1]["attempts"], 2);

        let out = cli(&url, &["list"]).await;
        let listing = text(&out.stdout);
        assert!(out.status.success());
        let row = |id: &str| {
            listing
                .lines()
                .find(|l| l.starts_with(id))
                .map(str::to_string)
        };
        assert!(row(&id).unwrap().contains("success"), "{listing}");
        assert!(row(&failed_id).unwrap().contains("failed"), "{listing}");
        let out = cli(&url, &["list", "--state", "failed"]).await;
        let listing = text(&out.stdout);
        assert!(
            listing.contains(&failed_id) && !listing.contains(&id),
            "{listing}"
        );
        let out = cli(&url, &["get", "no-such-job"]).await;
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains("404"), "{}", text(&out.stderr));
        server.abort();
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_files_and_wrong_credentials_fail_clearly() {
    deadline(
        60,
        "rejected files and wrong credentials fail clearly",
        async {
            let c = Cluster::open(test_config()).await;
            let (base, server) = serve_steps(c.api("front")).await;
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("job.json");
            std::fs::write(
                &file,
                r#"{"steps": [{"target": "no way", "command": "x"}]}"#,
            )
            .unwrap();
            let out = cli(&with_admin(&base), &["submit", file.to_str().unwrap()]).await;
            assert!(!out.status.success());
            let err = text(&out.stderr);
            assert!(
                err.contains("400") && err.contains("step 0: bad target"),
                "{err}"
            );
            assert!(out.stdout.is_empty());

            std::fs::write(&file, r#"{"steps": [{"target": "a", "command": "x"}]}"#).unwrap();
            let wrong = base.replacen("http://", &format!("http://{}:hunter2@", ADMIN.0), 1);
            let out = cli(&wrong, &["submit", file.to_str().unwrap()]).await;
            assert!(!out.status.success());
            let err = text(&out.stderr);
            assert!(err.contains("401") && err.contains("unauthorized"), "{err}");
            assert!(!err.contains("hunter2"), "a password was printed: {err}");
            // A job on standard input (`-`), submitted without watching.
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
                .args(["steps", "--url", &with_admin(&base), "submit", "-"])
                .env_remove("COUCH_REPLICATOR_AUTH")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            tokio::io::AsyncWriteExt::write_all(
                &mut stdin,
                br#"{"steps": [{"target": "z", "command": "x"}]}"#,
            )
            .await
            .unwrap();
            drop(stdin);
            let out = child.wait_with_output().await.unwrap();
            assert!(out.status.success());
            let piped_id = text(&out.stdout).trim().to_string();
            assert_eq!(piped_id.len(), 32);
            // Credentials from the environment work as well as in the URL.
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
                .args(["steps", "--url", &base, "list"])
                .env("COUCH_REPLICATOR_AUTH", format!("{}:{}", ADMIN.0, ADMIN.1))
                .output()
                .await
                .unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
            let listing = text(&out.stdout);
            assert_eq!(listing.lines().count(), 2, "{listing}");
            let row = listing.lines().nth(1).unwrap();
            assert!(
                row.starts_with(&piped_id) && row.contains("pending") && row.contains(" z"),
                "{row}"
            );
            // A node that is not there: a clear error, no password.
            server.abort();
            let dead = with_admin("http://127.0.0.1:9");
            let out = cli(&dead, &["list"]).await;
            assert!(!out.status.success());
            let err = text(&out.stderr);
            assert!(
                err.contains("request failed") && !err.contains(ADMIN.1),
                "{err}"
            );
        },
    )
    .await;
}
