//! The big data the `big_data` benchmark copies, written into a real CouchDB: one document
//! with a large attachment of incompressible bytes (`tests/support/generated.rs`) and
//! documents just under CouchDB's `max_document_size` (8,000,000 bytes), one at a time.

use std::time::Duration;

use serde_json::{Value, json};

use super::couch::Couch;
use super::generated::generated;

/// Text of `len` bytes (JSON-safe), different for each `seed`.
fn text(seed: usize, len: usize) -> String {
    let mut s = String::with_capacity(len + 64);
    let mut i = 0usize;
    while s.len() < len {
        s.push_str(&format!(
            "{seed:04}-{i:08} the quick brown fox {} ",
            i * 7919 % 10007
        ));
        i += 1;
    }
    s.truncate(len);
    s
}

async fn check(r: reqwest::Response, what: &str) -> Result<(), String> {
    let status = r.status();
    if status.is_success() {
        return Ok(());
    }
    let body = r.text().await.unwrap_or_default();
    Err(format!("{what}: {status} {body}"))
}

/// Creates `db` holding `big` (one `att_bytes` attachment) and `docs` documents of about
/// `doc_bytes` each. Returns how long CouchDB took to take the attachment alone (one plain
/// `PUT` with a `Content-Length`, nothing else running): the ceiling of any copy of it.
pub async fn fill(
    http: &reqwest::Client,
    couch: &Couch,
    db: &str,
    att_bytes: u64,
    docs: usize,
    doc_bytes: usize,
) -> Result<Duration, String> {
    let long = Duration::from_secs(3600);
    let r = http
        .put(couch.url(db))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    check(r, "PUT db").await?;
    let t0 = std::time::Instant::now();
    let r = http
        .put(couch.url(&format!("{db}/big/blob.bin")))
        .header("content-type", "application/octet-stream")
        .header("content-length", att_bytes.to_string())
        .timeout(long)
        .body(generated(att_bytes, false))
        .send()
        .await
        .map_err(|e| format!("PUT the attachment: {e}"))?;
    check(r, "PUT the attachment").await?;
    let att_put = t0.elapsed();
    for i in 0..docs {
        let doc = json!({"kind": "big", "n": i, "text": text(i, doc_bytes)});
        let r = http
            .put(couch.url(&format!("{db}/doc{i:04}")))
            .timeout(long)
            .json(&doc)
            .send()
            .await
            .map_err(|e| format!("PUT doc{i:04}: {e}"))?;
        check(r, &format!("PUT doc{i:04}")).await?;
    }
    Ok(att_put)
}

/// What must be equal between the source and a copy: every document's id and revision and
/// the big attachment's stub (digest, length, type).
pub async fn summary(http: &reqwest::Client, couch: &Couch, db: &str) -> Result<Value, String> {
    let all: Value = http
        .get(couch.url(&format!("{db}/_all_docs")))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let revs: Vec<Value> = all["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| json!([r["id"], r["value"]["rev"]]))
        .collect();
    let big: Value = http
        .get(couch.url(&format!("{db}/big")))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    Ok(json!({"revs": revs, "att": big["_attachments"]["blob.bin"]}))
}
