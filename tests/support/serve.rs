//! Starts the real `couch-replicator serve` binary for end-to-end tests: on a free port
//! (`--port 0`), with a data dir and a config file of the test's choosing, and returns the
//! base URL the node prints once it listens. The process is killed when the handle drops.

use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

/// A running `serve` process.
pub struct ServeProcess {
    /// The process (killed on drop).
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

/// Starts `serve --data-dir DATA --config CONFIG --port 0 EXTRA..` with `RUST_LOG=log`,
/// stderr to `stderr`, and waits for its "listening on" line. Its stdout keeps being drained
/// so the child never blocks on a full pipe.
pub async fn spawn_serve(
    data: &Path,
    config: &Path,
    extra: &[&str],
    log: &str,
    stderr: Stdio,
) -> ServeProcess {
    spawn_serve_listening(data, config, extra, log, stderr, 1)
        .await
        .0
}

/// As [`spawn_serve`], waiting for `lines` "listening on" lines (2 when `[ssl]` adds an
/// HTTPS listener); returns the process (its `base` is the first URL) and every URL.
pub async fn spawn_serve_listening(
    data: &Path,
    config: &Path,
    extra: &[&str],
    log: &str,
    stderr: Stdio,
    lines: usize,
) -> (ServeProcess, Vec<String>) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .arg("--config")
        .arg(config)
        .args(["--port", "0"])
        .args(extra)
        .env("RUST_LOG", log)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn couch-replicator serve");
    let mut out = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut urls = Vec::new();
    while urls.len() < lines {
        let line = out
            .next_line()
            .await
            .expect("read serve's stdout")
            .expect("serve printed nothing");
        let url = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected line {line}"))
            .to_owned();
        urls.push(url);
    }
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    let base = urls[0].clone();
    (ServeProcess { child, base }, urls)
}

/// A `serve` process on its own temp dir with `ini` as its config (warn logs to stderr); the
/// dir lives as long as the returned handle.
pub async fn spawn_serve_with(ini: &str) -> (tempfile::TempDir, ServeProcess) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.ini");
    std::fs::write(&cfg, ini).unwrap();
    let node = spawn_serve(
        &dir.path().join("data"),
        &cfg,
        &[],
        "warn",
        Stdio::inherit(),
    )
    .await;
    (dir, node)
}
