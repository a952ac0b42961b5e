//! `--deep`: the leaves both sides hold are read with one `_bulk_get` on each side (attachment
//! stubs only, exactly the revision asked for: no `latest`) and compared: the body without
//! `_rev`/`_revisions`/`_attachments`, then each attachment's name, digest and encoding
//! (a missing `encoding` is `identity`). Attachment bodies are never downloaded: the
//! digests say whether they are the same.

use std::collections::HashMap;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::report::DifferentLeaf;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req};

/// What a `_bulk_get` answered for one revision: its body, or the error it gave.
type Leaf = std::result::Result<Map<String, Value>, String>;

#[derive(Deserialize)]
struct BulkGetResp {
    results: Vec<BulkGetResult>,
}

#[derive(Deserialize)]
struct BulkGetResult {
    id: String,
    docs: Vec<BulkGetDoc>,
}

#[derive(Deserialize)]
struct BulkGetDoc {
    #[serde(default)]
    ok: Option<Map<String, Value>>,
    #[serde(default)]
    error: Option<Value>,
}

/// Compares `leaves` (`(id, rev)`, present on both sides) and returns those that differ.
pub(crate) async fn compare(
    source: &HttpClient,
    target: &HttpClient,
    leaves: &[(String, String)],
) -> Result<Vec<DifferentLeaf>> {
    if leaves.is_empty() {
        return Ok(Vec::new());
    }
    let (src, tgt) = tokio::try_join!(bulk_get(source, leaves), bulk_get(target, leaves))?;
    let mut out = Vec::new();
    for (id, rev) in leaves {
        let key = (id.clone(), rev.clone());
        // The source changed under us (compacted away a leaf it listed): nothing to compare.
        let Some(Ok(s)) = src.get(&key) else {
            continue;
        };
        let reason = match tgt.get(&key) {
            Some(Ok(t)) => difference(s, t),
            Some(Err(e)) => Some(format!("the target cannot read it: {e}")),
            None => Some("the target did not answer for it".to_owned()),
        };
        if let Some(reason) = reason {
            out.push(DifferentLeaf {
                id: id.clone(),
                rev: rev.clone(),
                reason,
            });
        }
    }
    Ok(out)
}

/// `POST _bulk_get` for exact revisions; answers keyed by `(id, rev)`.
async fn bulk_get(
    c: &HttpClient,
    leaves: &[(String, String)],
) -> Result<HashMap<(String, String), Leaf>> {
    let docs: Vec<Value> = leaves
        .iter()
        .map(|(id, rev)| json!({"id": id, "rev": rev}))
        .collect();
    let body = json!({ "docs": docs }).to_string();
    let resp = c
        .send(&Req::json(Method::POST, "_bulk_get?revs=false", body))
        .await?;
    if resp.status != StatusCode::OK {
        return Err(ReplicationError::HttpRequestFailed(format!(
            "{}: _bulk_get answered {}",
            c.endpoint(),
            resp.status
        )));
    }
    let parsed: BulkGetResp = resp.json("_bulk_get")?;
    let mut out = HashMap::with_capacity(leaves.len());
    for (r, asked) in parsed.results.into_iter().zip(leaves) {
        for d in r.docs {
            let leaf = match (d.ok, d.error) {
                (Some(doc), _) => {
                    let rev = doc.get("_rev").and_then(Value::as_str).unwrap_or(&asked.1);
                    ((r.id.clone(), rev.to_owned()), Ok(doc))
                }
                (None, e) => {
                    let e = e.unwrap_or(Value::Null);
                    let rev = e.get("rev").and_then(Value::as_str).unwrap_or(&asked.1);
                    let why = e.get("error").and_then(Value::as_str).unwrap_or("error");
                    ((r.id.clone(), rev.to_owned()), Err(why.to_owned()))
                }
            };
            out.insert(leaf.0, leaf.1);
        }
    }
    Ok(out)
}

/// How two copies of one revision differ, if they do.
fn difference(s: &Map<String, Value>, t: &Map<String, Value>) -> Option<String> {
    if body(s) != body(t) {
        return Some("body differs".to_owned());
    }
    let (sa, ta) = (attachments(s), attachments(t));
    for (name, (digest, encoding)) in &sa {
        match ta.get(name) {
            None => return Some(format!("attachment {name} is missing")),
            Some((d, _)) if d != digest => {
                return Some(format!("attachment {name}: digest {d} instead of {digest}"));
            }
            Some((_, e)) if e != encoding => {
                return Some(format!(
                    "attachment {name}: encoding {e} instead of {encoding}"
                ));
            }
            Some(_) => {}
        }
    }
    ta.keys()
        .find(|n| !sa.contains_key(*n))
        .map(|n| format!("attachment {n} is not on the source"))
}

/// The body without the fields that describe the revision rather than the content.
fn body(doc: &Map<String, Value>) -> Map<String, Value> {
    doc.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "_rev" | "_revisions" | "_attachments"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Each attachment's `(digest, encoding)`.
fn attachments(doc: &Map<String, Value>) -> HashMap<String, (String, String)> {
    let Some(Value::Object(atts)) = doc.get("_attachments") else {
        return HashMap::new();
    };
    let field = |a: &Value, k: &str, default: &str| {
        a.get(k)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_owned()
    };
    atts.iter()
        .map(|(name, a)| {
            let pair = (field(a, "digest", "none"), field(a, "encoding", "identity"));
            (name.clone(), pair)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn revision_fields_are_not_content_but_digests_and_encodings_are() {
        let a = doc(json!({"_id": "d", "_rev": "1-a", "x": 1,
            "_attachments": {"f": {"digest": "md5-A", "stub": true, "revpos": 1}}}));
        let same = doc(json!({"_id": "d", "_rev": "1-a", "x": 1,
            "_attachments": {"f": {"digest": "md5-A", "stub": true, "revpos": 2}}}));
        assert_eq!(difference(&a, &same), None);
        let other = doc(json!({"_id": "d", "_rev": "1-a", "x": 1,
            "_attachments": {"f": {"digest": "md5-B", "stub": true}}}));
        assert!(difference(&a, &other).is_some_and(|r| r.contains("digest")));
        let gz = doc(json!({"_id": "d", "_rev": "1-a", "x": 1,
            "_attachments": {"f": {"digest": "md5-A", "encoding": "gzip"}}}));
        assert!(difference(&a, &gz).is_some_and(|r| r.contains("encoding")));
        let body = doc(json!({"_id": "d", "_rev": "1-a", "x": 2}));
        assert_eq!(difference(&a, &body).as_deref(), Some("body differs"));
    }
}
