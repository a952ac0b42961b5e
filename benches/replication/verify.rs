//! Verifies a replicated database against the data set: the document count, every document's
//! leaf revisions (all of them, from `_changes?style=all_docs`), the revision history and body
//! of every 50th document and of every conflicted one among the first 10%, and the digest and
//! length of every attachment (the bytes of every 10th compared in full).

use futures::StreamExt;
use serde_json::{Value, json};

use super::data;
use super::load::get_json;

/// What a verification checked.
#[derive(Debug, Default)]
pub struct Checked {
    /// Documents whose leaf revisions matched.
    pub docs: u64,
    /// Documents whose bodies and histories were compared.
    pub bodies: u64,
    /// Attachments whose digests were compared.
    pub attachments: u64,
}

/// Checks database `db` holds documents `0..n` exactly.
pub async fn verify(http: &reqwest::Client, db: &str, n: u64) -> Result<Checked, String> {
    let info = get_json(http.get(db)).await?;
    if info["doc_count"] != json!(n) {
        return Err(format!("{db}: doc_count {} != {n}", info["doc_count"]));
    }
    let mut checked = Checked::default();
    let mut seen = vec![false; n as usize];
    let mut since = json!(0);
    loop {
        let page = get_json(http.get(format!(
            "{db}/_changes?style=all_docs&limit=10000&since={since}"
        )))
        .await?;
        let rows = page["results"].as_array().cloned().unwrap_or_default();
        for r in &rows {
            let id = r["id"].as_str().unwrap_or_default();
            let i = id
                .strip_prefix("doc-")
                .and_then(|x| x.parse::<u64>().ok())
                .filter(|i| *i < n)
                .ok_or_else(|| format!("{db}: unexpected document {id}"))?;
            let mut revs: Vec<String> = r["changes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["rev"].as_str().map(str::to_owned))
                .collect();
            revs.sort();
            if revs != data::leaf_revs(i) {
                return Err(format!("{db}: {id} has leaves {revs:?}"));
            }
            seen[i as usize] = true;
            checked.docs += 1;
        }
        since = page["last_seq"].clone();
        if rows.len() < 10_000 {
            break;
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(format!("{db}: {} missing", data::doc_id(i as u64)));
    }
    let sample: Vec<u64> = (0..n)
        .filter(|i| i % 50 == 0 || (data::shape(*i).conflict && *i < n / 10))
        .collect();
    let mut bodies = futures::stream::iter(sample)
        .map(|i| check_body(http, db, i))
        .buffer_unordered(8);
    while let Some(r) = bodies.next().await {
        r?;
        checked.bodies += 1;
    }
    let atts: Vec<u64> = (0..n).filter(|i| data::shape(*i).attachment).collect();
    let mut atts = futures::stream::iter(atts)
        .map(|i| check_attachment(http, db, i))
        .buffer_unordered(8);
    while let Some(r) = atts.next().await {
        r?;
        checked.attachments += 1;
    }
    Ok(checked)
}

async fn check_body(http: &reqwest::Client, db: &str, i: u64) -> Result<(), String> {
    let id = data::doc_id(i);
    let got = get_json(
        http.get(format!("{db}/{id}?open_revs=all&revs=true"))
            .header("accept", "application/json"),
    )
    .await?;
    let docs = got.as_array().cloned().unwrap_or_default();
    if docs.len() != data::leaf_revs(i).len() {
        return Err(format!("{db}: {id} open_revs gave {} docs", docs.len()));
    }
    for d in docs {
        let doc = d
            .get("ok")
            .and_then(Value::as_object)
            .ok_or_else(|| format!("{db}: {id} leaf missing"))?;
        let rev = doc.get("_rev").and_then(Value::as_str).unwrap_or_default();
        let (branch, revisions) =
            data::revisions_of(i, rev).ok_or_else(|| format!("{db}: {id} unknown rev {rev}"))?;
        if doc.get("_revisions") != Some(&revisions) {
            return Err(format!("{db}: {id} {rev} wrong history"));
        }
        let user: serde_json::Map<String, Value> = doc
            .iter()
            .filter(|(k, _)| !k.starts_with('_'))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if user != data::body(i, branch) {
            return Err(format!("{db}: {id} {rev} body differs"));
        }
    }
    Ok(())
}

async fn check_attachment(http: &reqwest::Client, db: &str, i: u64) -> Result<(), String> {
    let id = data::doc_id(i);
    let doc = get_json(http.get(format!("{db}/{id}"))).await?;
    let stub = &doc["_attachments"][data::ATT_NAME];
    let want = data::attachment(i);
    if stub["digest"] != json!(data::digest(&want)) || stub["length"] != json!(want.len()) {
        return Err(format!("{db}: {id} attachment stub {stub}"));
    }
    if i % 1000 == 7 {
        let bytes = http
            .get(format!("{db}/{id}/{}", data::ATT_NAME))
            .send()
            .await
            .map_err(|e| format!("attachment GET: {e}"))?
            .bytes()
            .await
            .map_err(|e| format!("attachment body: {e}"))?;
        if bytes.as_ref() != want.as_slice() {
            return Err(format!("{db}: {id} attachment bytes differ"));
        }
    }
    Ok(())
}
