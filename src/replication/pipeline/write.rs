//! Writing to the target (CouchDB's couch_replicator_worker.erl): `_bulk_docs` with `new_edits=false` for JSON documents
//! (the raw bytes are spliced into the body, never re-encoded), split in halves on 413 down to
//! single documents; per-document errors are counted, not fatal. Documents fetched as
//! `multipart/related` are written one by one with `PUT doc?new_edits=false`.

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use crate::replication::endpoint::database::encode_doc_id;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req};

use super::reframe::Reframed;

/// Flush a `_bulk_docs` request once its body would exceed this (CouchDB main: 4 MiB).
pub const BULK_DOCS_BUFFER: usize = 4 * 1024 * 1024;

/// What a write achieved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteResult {
    /// Documents the target accepted.
    pub written: u64,
    /// Documents it rejected (or that were too large).
    pub failures: u64,
    /// Of the failures, single-document writes answered 412 (`missing_stub`: the source
    /// left out an attachment the target lacks); the caller fetches those again in full.
    pub missing_stub: u64,
}

impl std::ops::AddAssign for WriteResult {
    fn add_assign(&mut self, o: Self) {
        self.written += o.written;
        self.failures += o.failures;
        self.missing_stub += o.missing_stub;
    }
}

#[derive(Deserialize)]
struct DocResult {
    #[serde(default)]
    error: Option<String>,
}

/// Above this, a `_bulk_docs` body is sent from the documents' own buffers.
const COPIED_BODY_MAX: usize = 1 << 20;

/// The `_bulk_docs` request for `docs`: small ones copied into one body, large ones sent
/// from their buffers (an 8 MB document copied was held twice while it was written).
fn bulk_request(docs: &[Bytes]) -> Req {
    let len: usize = docs.iter().map(|d| d.len() + 1).sum();
    if len <= COPIED_BODY_MAX {
        return Req::json(Method::POST, "_bulk_docs", bulk_body(docs));
    }
    let mut parts = Vec::with_capacity(docs.len() * 2 + 1);
    parts.push(Bytes::from_static(b"{\"new_edits\":false,\"docs\":["));
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            parts.push(Bytes::from_static(b","));
        }
        parts.push(d.clone());
    }
    parts.push(Bytes::from_static(b"]}"));
    Req::json_parts(Method::POST, "_bulk_docs", parts)
}

fn bulk_body(docs: &[Bytes]) -> Bytes {
    let len: usize = docs.iter().map(|d| d.len() + 1).sum::<usize>() + 32;
    let mut b = BytesMut::with_capacity(len);
    b.put_slice(b"{\"new_edits\":false,\"docs\":[");
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            b.put_u8(b',');
        }
        b.put_slice(d);
    }
    b.put_slice(b"]}");
    b.freeze()
}

/// Writes JSON documents, chunked by [`BULK_DOCS_BUFFER`].
pub async fn write_docs(target: &HttpClient, docs: &[Bytes]) -> Result<WriteResult> {
    let mut total = WriteResult::default();
    let mut start = 0;
    let mut size = 0;
    for (i, d) in docs.iter().enumerate() {
        if size + d.len() > BULK_DOCS_BUFFER && i > start {
            total += bulk_docs(target, &docs[start..i]).await?;
            start = i;
            size = 0;
        }
        size += d.len() + 1;
    }
    if start < docs.len() {
        total += bulk_docs(target, &docs[start..]).await?;
    }
    Ok(total)
}

/// One `_bulk_docs` request, halving on 413.
pub fn bulk_docs<'a>(
    target: &'a HttpClient,
    docs: &'a [Bytes],
) -> BoxFuture<'a, Result<WriteResult>> {
    Box::pin(async move {
        let mut req = bulk_request(docs);
        req.headers
            .push(("x-couch-full-commit", "false".to_owned()));
        let resp = {
            let _turn = target.write_turn(None).await;
            target.send(&req).await?
        };
        match resp.status {
            StatusCode::CREATED | StatusCode::OK | StatusCode::EXPECTATION_FAILED => {
                // CouchDB lists only failures for new_edits=false; PouchDB lists every doc.
                let results: Vec<DocResult> = resp.json("_bulk_docs")?;
                let failures = results.iter().filter(|r| r.error.is_some()).count() as u64;
                for r in results.iter().filter_map(|r| r.error.as_deref()) {
                    tracing::debug!(error = r, "target rejected a document");
                }
                Ok(WriteResult {
                    written: docs.len() as u64 - failures.min(docs.len() as u64),
                    failures,
                    ..Default::default()
                })
            }
            StatusCode::PAYLOAD_TOO_LARGE if docs.len() > 1 => {
                let (a, b) = docs.split_at(docs.len() / 2);
                let mut r = bulk_docs(target, a).await?;
                r += bulk_docs(target, b).await?;
                Ok(r)
            }
            StatusCode::PAYLOAD_TOO_LARGE => {
                tracing::debug!("a single document is too large for the target");
                Ok(WriteResult {
                    failures: 1,
                    ..Default::default()
                })
            }
            s => Err(ReplicationError::BulkDocsFailed(format!(
                "{}: _bulk_docs answered {s}",
                target.endpoint()
            ))),
        }
    })
}

/// Builds a `multipart/related` body: the JSON part then each attachment part.
pub(crate) fn related_body(
    json: &Bytes,
    parts: &[(Vec<(String, String)>, Bytes)],
    boundary: &str,
) -> Bytes {
    let mut b = BytesMut::with_capacity(
        json.len() + parts.iter().map(|p| p.1.len() + 200).sum::<usize>() + 200,
    );
    b.put_slice(format!("--{boundary}\r\nContent-Type: application/json\r\n\r\n").as_bytes());
    b.put_slice(json);
    for (headers, data) in parts {
        b.put_slice(format!("\r\n--{boundary}\r\n").as_bytes());
        for (k, v) in headers {
            b.put_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        b.put_slice(format!("Content-Length: {}\r\n\r\n", data.len()).as_bytes());
        b.put_slice(data);
    }
    b.put_slice(format!("\r\n--{boundary}--").as_bytes());
    b.freeze()
}

/// Streams one re-framed `multipart/related` document into `PUT {id}?new_edits=false`, with
/// its `Content-Length` when known, once: a transport failure is an error for the caller to
/// retry on its buffered path.
pub(crate) async fn put_reframed(
    target: &HttpClient,
    id: &str,
    body: Reframed,
) -> Result<WriteResult> {
    let mut req = Req::json(
        Method::PUT,
        format!("{}?new_edits=false", encode_doc_id(id)),
        Bytes::new(),
    );
    req.body = None;
    req.content_type = body.content_type.into();
    req.headers
        .push(("x-couch-full-commit", "false".to_owned()));
    if let Some(n) = body.length {
        req.headers.push(("content-length", n.to_string()));
    }
    let _turn = target.write_turn(body.length).await;
    let resp = target.send_once(&req, body.body).await?;
    single_result(target, resp.status)
}

/// Writes one JSON document with `PUT {id}?new_edits=false` (design documents go one by one,
/// so a validation rejection is reported for that document alone).
pub async fn put_json(target: &HttpClient, id: &str, doc: &Bytes) -> Result<WriteResult> {
    let mut req = Req::json(
        Method::PUT,
        format!("{}?new_edits=false", encode_doc_id(id)),
        doc.clone(),
    );
    req.headers
        .push(("x-couch-full-commit", "false".to_owned()));
    let _turn = target.write_turn(None).await;
    let resp = target.send(&req).await?;
    single_result(target, resp.status)
}

/// The outcome of a single-document write: rejections are counted, not fatal.
fn single_result(target: &HttpClient, status: StatusCode) -> Result<WriteResult> {
    match status.as_u16() {
        200..=202 => Ok(WriteResult {
            written: 1,
            ..Default::default()
        }),
        412 => Ok(WriteResult {
            failures: 1,
            missing_stub: 1,
            ..Default::default()
        }),
        400 | 401 | 403 | 409 | 413 | 415 => {
            tracing::debug!(status = status.as_u16(), "target rejected a document");
            Ok(WriteResult {
                failures: 1,
                ..Default::default()
            })
        }
        s => Err(ReplicationError::DocWriteFailed(format!(
            "{}: PUT of a document answered {s}",
            target.endpoint()
        ))),
    }
}

/// `PUT doc?new_edits=false` as `multipart/related`.
pub async fn put_multipart(
    target: &HttpClient,
    id: &str,
    json: &Bytes,
    parts: &[(Vec<(String, String)>, Bytes)],
) -> Result<WriteResult> {
    let boundary = uuid::Uuid::new_v4().simple().to_string();
    let mut req = Req::json(
        Method::PUT,
        format!("{}?new_edits=false", encode_doc_id(id)),
        related_body(json, parts, &boundary),
    );
    req.content_type = format!("multipart/related; boundary=\"{boundary}\"").into();
    req.headers
        .push(("x-couch-full-commit", "false".to_owned()));
    let bytes = parts.iter().map(|p| p.1.len() as u64).sum::<u64>() + json.len() as u64;
    let _turn = target.write_turn(Some(bytes)).await;
    let resp = target.send(&req).await?;
    single_result(target, resp.status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::http::client::ReqBody;

    fn sent(req: &Req) -> Vec<u8> {
        match &req.body {
            Some(ReqBody::Whole(b)) => b.to_vec(),
            Some(ReqBody::Parts(p)) => p.iter().flat_map(|b| b.to_vec()).collect(),
            None => Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_large_write_goes_alone() {
        use crate::replication::http::client::{ClientConfig, LARGE_WRITE_BYTES};
        use std::sync::Arc;
        use std::time::Duration;
        let cfg = ClientConfig::for_tests(Duration::from_secs(10));
        let ep = crate::replication::Endpoint::parse("http://127.0.0.1:9/t").unwrap();
        let c = HttpClient::new(ep, cfg, Arc::new(crate::replication::Aimd::new())).unwrap();
        let soon = Duration::from_millis(50);
        let large = Some(LARGE_WRITE_BYTES);
        // Ordinary writes run together.
        let (a, b) = (c.write_turn(None).await, c.write_turn(Some(1 << 20)).await);
        // A large one waits for the writes in flight...
        assert!(
            tokio::time::timeout(soon, c.write_turn(large))
                .await
                .is_err()
        );
        drop((a, b));
        let alone = c.write_turn(large).await;
        // ...and no other write runs beside it.
        assert!(
            tokio::time::timeout(soon, c.write_turn(None))
                .await
                .is_err()
        );
        drop(alone);
        let _after = c.write_turn(None).await;
    }

    #[test]
    fn large_bodies_go_from_the_documents_buffers_and_say_the_same() {
        let small = vec![Bytes::from_static(b"{\"_id\":\"a\"}"); 3];
        let req = bulk_request(&small);
        assert!(matches!(req.body, Some(ReqBody::Whole(_))));
        assert_eq!(sent(&req), bulk_body(&small).to_vec());
        let big = Bytes::from(format!(
            "{{\"_id\":\"b\",\"x\":\"{}\"}}",
            "y".repeat(2 << 20)
        ));
        let docs = vec![small[0].clone(), big.clone()];
        let req = bulk_request(&docs);
        let Some(ReqBody::Parts(parts)) = &req.body else {
            panic!("a large body is sent in parts");
        };
        assert!(
            parts.iter().any(|p| p.as_ptr() == big.as_ptr()),
            "not copied"
        );
        assert_eq!(sent(&req), bulk_body(&docs).to_vec());
        let v: serde_json::Value = serde_json::from_slice(&sent(&req)).unwrap();
        assert_eq!(v["docs"].as_array().map(Vec::len), Some(2));
    }
}
