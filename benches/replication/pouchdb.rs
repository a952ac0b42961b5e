//! The peer: PouchDB's own replicator (`pouchdb` from node_modules) run by
//! `scripts/pouchdb-replicate.js` in a node process, HTTP to HTTP, one-shot. The script times
//! the replication call itself and reports its process's CPU seconds (getrusage self, through
//! `process.cpuUsage`), so node's start-up is not counted against it.

use std::path::Path;

use serde_json::Value;

/// What the PouchDB run reported.
#[derive(Debug)]
pub struct PouchRun {
    /// Wall seconds of the replication call.
    pub wall_s: f64,
    /// CPU seconds of the node process during it.
    pub cpu_s: f64,
    /// Documents written, as PouchDB counts them.
    pub docs_written: u64,
    /// The options it ran with.
    pub options: Value,
}

/// Replicates `source` to `target` with PouchDB.
pub async fn replicate(source: &str, target: &str) -> Result<PouchRun, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tokio::process::Command::new("node")
        .arg(root.join("scripts/pouchdb-replicate.js"))
        .args([source, target])
        .current_dir(root)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run node: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "PouchDB replication failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(line.trim().lines().last().unwrap_or(""))
        .map_err(|e| format!("PouchDB script output: {e}"))?;
    if v["ok"] != Value::Bool(true) {
        return Err(format!("PouchDB replication not ok: {v}"));
    }
    Ok(PouchRun {
        wall_s: v["wall_s"].as_f64().unwrap_or(0.0),
        cpu_s: v["cpu_s"].as_f64().unwrap_or(0.0),
        docs_written: v["docs_written"].as_u64().unwrap_or(0),
        options: v["options"].clone(),
    })
}
