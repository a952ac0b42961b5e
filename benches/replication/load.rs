//! Raw endpoint traffic of the benchmark: filling a database with the data set through
//! `_bulk_docs` `new_edits=false` (also the target's write ceiling when timed on a fresh
//! database), and the source's read ceiling: `_changes?style=all_docs` and
//! `_bulk_get?revs=true&attachments=true` in batches of 500, one request at a time.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::data;

/// Documents per `_bulk_docs` / `_changes` page.
pub const BATCH: u64 = 500;

/// Writes documents `0..n` in batches of [`BATCH`]; returns the time spent in requests only
/// (bodies are built before each request starts).
pub async fn fill(http: &reqwest::Client, db: &str, n: u64) -> Result<Duration, String> {
    let mut spent = Duration::ZERO;
    let mut from = 0;
    while from < n {
        let to = (from + BATCH).min(n);
        let body = data::bulk_body(from, to);
        let t = Instant::now();
        let r = http
            .post(format!("{db}/_bulk_docs"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("_bulk_docs: {e}"))?;
        let status = r.status();
        let text = r.text().await.map_err(|e| format!("_bulk_docs: {e}"))?;
        spent += t.elapsed();
        if !status.is_success() {
            return Err(format!("_bulk_docs answered {status}"));
        }
        let results: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| format!("_bulk_docs reply: {e}"))?;
        if let Some(bad) = results.iter().find(|r| r.get("error").is_some()) {
            return Err(format!("_bulk_docs rejected a document: {bad}"));
        }
        from = to;
    }
    Ok(spent)
}

/// Reads the whole source as a replicator must (changes, then every leaf revision with its
/// history and attachment bodies); returns (documents, revisions read, elapsed).
pub async fn read_all(http: &reqwest::Client, db: &str) -> Result<(u64, u64, Duration), String> {
    let t = Instant::now();
    let mut since = json!(0);
    let (mut docs, mut revs) = (0u64, 0u64);
    loop {
        let url = format!("{db}/_changes?style=all_docs&limit={BATCH}&since={since}");
        let page: Value = get_json(http.get(url)).await?;
        let rows = page["results"].as_array().cloned().unwrap_or_default();
        let wanted: Vec<Value> = rows
            .iter()
            .flat_map(|r| {
                let id = r["id"].clone();
                r["changes"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |c| json!({"id": id, "rev": c["rev"]}))
            })
            .collect();
        if !wanted.is_empty() {
            let req = http
                .post(format!(
                    "{db}/_bulk_get?revs=true&latest=true&attachments=true"
                ))
                .header("content-type", "application/json")
                .body(json!({ "docs": wanted }).to_string());
            let got: Value = get_json(req).await?;
            let results = got["results"].as_array().cloned().unwrap_or_default();
            for r in &results {
                for d in r["docs"].as_array().into_iter().flatten() {
                    if d.get("ok").is_none() {
                        return Err(format!("_bulk_get could not read {}", r["id"]));
                    }
                    revs += 1;
                }
            }
        }
        docs += rows.len() as u64;
        since = page["last_seq"].clone();
        if (rows.len() as u64) < BATCH {
            return Ok((docs, revs, t.elapsed()));
        }
    }
}

/// Sends a request and parses the JSON reply (pouchdb-server often says `text/plain`).
pub async fn get_json(req: reqwest::RequestBuilder) -> Result<Value, String> {
    let r = req.send().await.map_err(|e| format!("request: {e}"))?;
    let status = r.status();
    let bytes = r.bytes().await.map_err(|e| format!("reply: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "answered {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("invalid JSON: {e}"))
}
