//! The real CouchDB 3.4.3 the attachments benchmark runs on: started through the peer script
//! (`COUCHDB_PEER_SCRIPT`, else `/work/shared/peers/couchdb.sh` or `../shared/peers/couchdb.sh`
//! when present) and stopped on drop; filling a source with text attachments (which CouchDB
//! stores gzip-encoded) and reading a database's attachment stubs back.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;

use base64::Engine;
use serde_json::{Value, json};

/// One CouchDB node (admin `admin:admin`).
pub struct Couch {
    script: PathBuf,
    dir: tempfile::TempDir,
    /// Its HTTP port.
    pub port: u16,
}

impl Drop for Couch {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

fn peer_script() -> Result<PathBuf, String> {
    if let Some(s) = std::env::var_os("COUCHDB_PEER_SCRIPT") {
        return Ok(PathBuf::from(s));
    }
    [
        "/work/shared/peers/couchdb.sh",
        "../shared/peers/couchdb.sh",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .ok_or_else(|| "set COUCHDB_PEER_SCRIPT to the CouchDB 3.4.3 peer script".to_owned())
}

impl Couch {
    /// Starts one on a free loopback port.
    pub fn start() -> Result<Self, String> {
        let script = peer_script()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(port.to_string())
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "CouchDB did not start: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(Self { script, dir, port })
    }

    /// `http://admin:admin@127.0.0.1:{port}/{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://admin:admin@127.0.0.1:{}/{path}", self.port)
    }
}

/// Compressible text of `len` bytes, different for each document.
fn text(seed: usize, len: usize) -> String {
    let mut s = String::with_capacity(len + 80);
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!(
            "{seed:06}-{i:04} status=ok user=u{} latency_ms={} path=/api/items/{}\n",
            (seed * 31 + i) % 97,
            (seed + i * 7) % 1000,
            i * 13
        ));
        i += 1;
    }
    s.truncate(len);
    s
}

/// Creates `db` and writes `n` documents, each with one text attachment of `att_len` bytes.
pub async fn fill(
    http: &reqwest::Client,
    couch: &Couch,
    db: &str,
    n: usize,
    att_len: usize,
) -> Result<(), String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    fill_with(http, couch, db, n, 200, |i| {
        json!({
            "_id": format!("doc{i:06}"),
            "kind": "log",
            "n": i,
            "_attachments": {"log.txt": {
                "content_type": "text/plain",
                "data": b64.encode(text(i, att_len)),
            }},
        })
    })
    .await
}

/// Creates `db` and writes the documents `doc(i)` for `i < n`, `chunk` per `_bulk_docs`.
pub async fn fill_with(
    http: &reqwest::Client,
    couch: &Couch,
    db: &str,
    n: usize,
    chunk: usize,
    doc: impl Fn(usize) -> Value,
) -> Result<(), String> {
    let r = http
        .put(couch.url(db))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("PUT /{db}: {}", r.status()));
    }
    for start in (0..n).step_by(chunk.max(1)) {
        let docs: Vec<Value> = (start..n.min(start + chunk.max(1))).map(&doc).collect();
        let r = http
            .post(couch.url(&format!("{db}/_bulk_docs")))
            .json(&json!({"docs": docs}))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("_bulk_docs: {}", r.status()));
        }
    }
    Ok(())
}

/// CouchDB's own one-shot `_replicate` of `source` into `target` (created when missing);
/// returns when CouchDB answered that it completed.
pub async fn couch_replicate(
    http: &reqwest::Client,
    couch: &Couch,
    source: &str,
    target: &str,
) -> Result<(), String> {
    let body = json!({"source": source, "target": target, "create_target": true});
    let r = http
        .post(couch.url("_replicate"))
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("_replicate: {e}"))?;
    let status = r.status();
    let text = r.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(format!("CouchDB's _replicate: {status} {text}"));
    }
    Ok(())
}

/// Every document's `_rev` and attachment stubs with their encoding, by id.
pub async fn stubs(http: &reqwest::Client, couch: &Couch, db: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let r = http
        .get(couch.url(&format!("{db}/_all_docs")))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let all: Value = r.json().await.map_err(|e| e.to_string())?;
    for row in all["rows"].as_array().into_iter().flatten() {
        let id = row["id"].as_str().unwrap_or_default();
        let r = http
            .get(couch.url(&format!("{db}/{id}?att_encoding_info=true")))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let doc: Value = r.json().await.map_err(|e| e.to_string())?;
        out.push(json!({"id": id, "rev": doc["_rev"], "atts": doc["_attachments"]}));
    }
    Ok(out)
}
