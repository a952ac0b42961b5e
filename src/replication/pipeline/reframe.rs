//! A source's `multipart/related` document re-framed into a target `PUT` body of known length.
//!
//! CouchDB reads a *chunked* request body whole into its process mailbox before it parses it
//! (`chttpd_db:receive_request_data`), so passing a 1 GiB attachment through as chunks cost the
//! target 1 GiB of memory and slowed to a crawl as the mailbox grew. With a `Content-Length` it
//! reads as it parses. The source's part does not say its length, but its JSON part does: every
//! `follows` stub carries the length of the bytes that follow (`encoded_length` when the stub
//! has an `encoding`). So the JSON part is read (bounded by `max_response_bytes`), the body is
//! framed with our own boundary and part headers whose sizes are known up front, and each
//! attachment's bytes pass through as they arrive, counted against what the JSON declared: a
//! source that sends more or less fails the write instead of corrupting it.
//!
//! A target that is not CouchDB (pouchdb-server) knows no attachment encodings: with
//! [`Encodings::Decode`], gzip-encoded attachments are inflated as they pass (their stubs lose
//! `encoding` and `encoded_length`; `length` is the inflated size), so a large attachment
//! reaches such a target streamed too instead of as base64 inside a JSON answer.

use async_compression::tokio::bufread::GzipDecoder;
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio_util::io::{ReaderStream, StreamReader};

use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{Hold, HttpClient};

use super::multipart::{Watch, boundary_of};

/// A `PUT` body ready to send.
pub(crate) struct Reframed {
    /// `multipart/related; boundary="..."` of the new framing.
    pub content_type: String,
    /// The body's exact length, when every attachment's JSON stub said its own.
    pub length: Option<u64>,
    /// The body, produced as the source's parts arrive.
    pub body: BoxStream<'static, std::result::Result<Bytes, ReplicationError>>,
}

/// What becomes of encoded (gzip) attachments on the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encodings {
    /// Passed as stored, with their encoding (a CouchDB target).
    Keep,
    /// Inflated as they pass (any other target).
    Decode,
}

/// A part's bytes as they pass to the target.
type PartStream = BoxStream<'static, std::io::Result<Bytes>>;

/// One attachment part still to come, in the JSON's order.
struct Planned {
    name: String,
    /// `\r\n--boundary\r\n` and the part's headers, ready to send before its bytes.
    head: Bytes,
    /// The bytes the part brings to the target (inflated when `gunzip`).
    len: Option<u64>,
    gunzip: bool,
}

/// Where the body stream is.
struct State {
    mp: multer::Multipart<'static>,
    plan: Vec<Planned>,
    current: Option<(PartStream, Option<u64>)>,
    closing: Option<Bytes>,
    what: String,
    watch: Watch,
}

/// Reads the JSON part of `field` (a `multipart/related` document, `ctype` naming its
/// boundary) and returns the body that re-frames it; what its parts hand on counts in
/// `watch`. `what` names the source request in errors.
pub(crate) async fn reframe(
    source: &HttpClient,
    field: multer::Field<'static>,
    ctype: &str,
    what: &str,
    watch: &Watch,
    encodings: Encodings,
) -> Result<Reframed> {
    let err = |e: multer::Error| ReplicationError::BadResponse(format!("{what}: {e}"));
    let mut mp = multer::Multipart::new(field, boundary_of(ctype)?);
    let first = mp
        .next_field()
        .await
        .map_err(err)?
        .ok_or_else(|| ReplicationError::BadResponse(format!("{what}: an empty document")))?;
    let counted = watch.clone();
    let part = first.map(move |r| {
        r.inspect(|b| counted.handed(b.len()))
            .map_err(|e| e.to_string())
    });
    let cap = source.limits().max_response_bytes;
    let json = source
        .collect_within_limits(part, None, (cap, Hold::WhileReading), what)
        .await?;
    let bad = |e: serde_json::Error| {
        ReplicationError::BadResponse(format!("{what}: the JSON part: invalid ({e})"))
    };
    // Checked whole (UTF-8, syntax) without building it: only `_attachments` is read, so a
    // deeply nested document passes as it would through `_bulk_docs`.
    serde_json::from_slice::<&RawValue>(&json).map_err(bad)?;
    let doc: Stubs = serde_json::from_slice(&json).map_err(bad)?;
    let decode = encodings == Encodings::Decode && doc.attachments.values().any(is_encoded);
    let json = if decode {
        without_encodings(&json).map_err(bad)?
    } else {
        json
    };

    let boundary = uuid::Uuid::new_v4().simple().to_string();
    let plan = plan_parts(&doc.attachments, &boundary, encodings);
    let opening = format!("--{boundary}\r\nContent-Type: application/json\r\n\r\n");
    let closing = Bytes::from(format!("\r\n--{boundary}--"));
    let length = plan.iter().try_fold(
        (opening.len() + json.len() + closing.len()) as u64,
        |sum, p| p.len.map(|n| sum + p.head.len() as u64 + n),
    );
    let mut head = BytesMut::with_capacity(opening.len() + json.len());
    head.put_slice(opening.as_bytes());
    head.put_slice(&json);
    let state = State {
        mp,
        plan,
        current: None,
        closing: Some(closing),
        what: what.to_owned(),
        watch: watch.clone(),
    };
    let rest = futures::stream::try_unfold(state, next_chunk);
    Ok(Reframed {
        content_type: format!("multipart/related; boundary=\"{boundary}\""),
        length,
        body: futures::stream::once(async move { Ok(head.freeze()) })
            .chain(rest)
            .boxed(),
    })
}

/// What the JSON part says of its attachments (in its order: `preserve_order`).
#[derive(Deserialize)]
struct Stubs {
    #[serde(rename = "_attachments", default)]
    attachments: Map<String, Value>,
}

fn is_encoded(att: &Value) -> bool {
    att.get("encoding").is_some()
}

/// The JSON part with `encoding` and `encoded_length` taken out of every attachment stub:
/// what a target that inflated them must be told.
fn without_encodings(json: &[u8]) -> serde_json::Result<Bytes> {
    let mut doc: Map<String, Value> = serde_json::from_slice(json)?;
    if let Some(Value::Object(atts)) = doc.get_mut("_attachments") {
        for att in atts.values_mut().filter_map(Value::as_object_mut) {
            att.remove("encoding");
            att.remove("encoded_length");
        }
    }
    serde_json::to_vec(&doc).map(Bytes::from)
}

/// The attachment parts the JSON says follow, in its order, with their framing.
fn plan_parts(atts: &Map<String, Value>, boundary: &str, encodings: Encodings) -> Vec<Planned> {
    atts.iter()
        .filter(|(_, a)| a.get("follows").and_then(Value::as_bool) == Some(true))
        .map(|(name, a)| {
            let gunzip = encodings == Encodings::Decode && is_encoded(a);
            let len_field = if is_encoded(a) && !gunzip {
                "encoded_length"
            } else {
                "length"
            };
            let len = a.get(len_field).and_then(Value::as_u64);
            let ctype = a
                .get("content_type")
                .and_then(Value::as_str)
                .unwrap_or("application/octet-stream");
            let mut head = format!(
                "\r\n--{boundary}\r\nContent-Disposition: attachment; filename=\"{}\"\r\n\
                 Content-Type: {}\r\n",
                header_safe(name),
                header_safe(ctype)
            );
            if let Some(n) = len {
                head.push_str(&format!("Content-Length: {n}\r\n"));
            }
            // As CouchDB's replicator sends an attachment kept encoded.
            if let Some(enc) = a
                .get("encoding")
                .and_then(Value::as_str)
                .filter(|_| !gunzip)
            {
                head.push_str(&format!("Content-Encoding: {}\r\n", header_safe(enc)));
            }
            head.push_str("\r\n");
            Planned {
                name: name.clone(),
                head: Bytes::from(head),
                len,
                gunzip,
            }
        })
        .collect()
}

/// `s` with what cannot stand in a quoted header value (controls, quotes, backslashes,
/// non-ASCII) percent-encoded. CouchDB matches attachment parts by their order, not by
/// these headers, so they only need to be well-formed.
fn header_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'%')) || b == b' ' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The next piece of the body: the current part's next bytes, the next part's headers, or
/// the closing boundary.
async fn next_chunk(mut st: State) -> Result<Option<(Bytes, State)>> {
    let what = st.what.clone();
    let bad = |m: String| ReplicationError::BadResponse(format!("{what}: {m}"));
    if let Some((field, left)) = st.current.as_mut() {
        match field
            .next()
            .await
            .transpose()
            .map_err(|e| bad(e.to_string()))?
        {
            Some(b) => {
                if let Some(left) = left {
                    *left = left.checked_sub(b.len() as u64).ok_or_else(|| {
                        bad("an attachment longer than its JSON stub says".into())
                    })?;
                }
                return Ok(Some((b, st)));
            }
            None if left.is_some_and(|n| n > 0) => {
                return Err(bad("an attachment shorter than its JSON stub says".into()));
            }
            None => st.current = None,
        }
    }
    let Some(closing) = st.closing.take() else {
        return Ok(None);
    };
    match st.mp.next_field().await.map_err(|e| bad(e.to_string()))? {
        Some(field) => {
            st.closing = Some(closing);
            // CouchDB names each part; a part without a (known) name takes the next in order.
            let at = field
                .file_name()
                .and_then(|n| st.plan.iter().position(|p| p.name == n))
                .unwrap_or(0);
            if st.plan.is_empty() {
                return Err(bad("more attachment parts than `follows` stubs".into()));
            }
            let p = st.plan.remove(at);
            st.current = Some((part_stream(field, &st.watch, p.gunzip), p.len));
            Ok(Some((p.head, st)))
        }
        None if !st.plan.is_empty() => {
            Err(bad(format!("no part for attachment `{}`", st.plan[0].name)))
        }
        None => Ok(Some((closing, st))),
    }
}

/// A part's bytes, counted as handed on as they leave the parser, inflated when `gunzip`.
fn part_stream(field: multer::Field<'static>, watch: &Watch, gunzip: bool) -> PartStream {
    let watch = watch.clone();
    let raw = field.map(move |r| {
        r.inspect(|b| watch.handed(b.len()))
            .map_err(std::io::Error::other)
    });
    if !gunzip {
        return raw.boxed();
    }
    let inflated = GzipDecoder::new(StreamReader::new(raw));
    ReaderStream::with_capacity(inflated, 64 << 10).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parts_are_planned_in_the_json_order_with_their_sent_lengths() {
        let doc: Stubs = serde_json::from_value(json!({"_id": "d", "_attachments": {
            "b.bin": {"follows": true, "length": 10, "content_type": "application/x\r\nX: y"},
            "stub": {"stub": true, "length": 5},
            "a \"q\".txt": {"follows": true, "length": 47, "encoding": "gzip", "encoded_length": 29},
        }}))
        .unwrap();
        let plan = plan_parts(&doc.attachments, "B", Encodings::Keep);
        let names: Vec<_> = plan.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["b.bin", "a \"q\".txt"]);
        assert_eq!(plan[0].len, Some(10));
        assert_eq!(plan[1].len, Some(29), "gzip-encoded bytes travel as stored");
        let head = std::str::from_utf8(&plan[1].head).unwrap();
        assert!(head.contains("Content-Encoding: gzip\r\n"), "{head}");
        let head = std::str::from_utf8(&plan[1].head).unwrap();
        assert!(head.contains("filename=\"a %22q%22.txt\""), "{head}");
        let head = std::str::from_utf8(&plan[0].head).unwrap();
        assert!(
            head.contains("Content-Type: application/x%0D%0AX: y\r\n"),
            "{head}"
        );
        assert!(head.ends_with("Content-Length: 10\r\n\r\n"), "{head}");
    }

    #[test]
    fn a_target_without_encodings_gets_inflated_lengths_and_plain_stubs() {
        let json = br#"{"_id":"d","deep":[[1]],"_attachments":{"a":{"follows":true,"length":47,"encoding":"gzip","encoded_length":29,"digest":"md5-x"}}}"#;
        let doc: Stubs = serde_json::from_slice(json).unwrap();
        let plan = plan_parts(&doc.attachments, "B", Encodings::Decode);
        assert_eq!((plan[0].len, plan[0].gunzip), (Some(47), true));
        let plain: Value = serde_json::from_slice(&without_encodings(json).unwrap()).unwrap();
        assert_eq!(
            plain,
            json!({"_id":"d","deep":[[1]],"_attachments":{"a":{"follows":true,"length":47,"digest":"md5-x"}}})
        );
    }

    #[test]
    fn a_stub_without_its_length_leaves_the_length_unknown() {
        let doc: Stubs =
            serde_json::from_value(json!({"_attachments": {"a": {"follows": true}}})).unwrap();
        let plan = plan_parts(&doc.attachments, "B", Encodings::Keep);
        assert_eq!(plan[0].len, None);
        assert!(
            !std::str::from_utf8(&plan[0].head)
                .unwrap()
                .contains("Length")
        );
    }
}
