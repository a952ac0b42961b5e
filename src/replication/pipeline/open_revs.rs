//! Fetching one revision by itself, for what `_bulk_get` could not bring (`fetch.rs`):
//! `GET doc?open_revs=[rev]&revs=true&latest=true&attachments=true`, answered as JSON or as
//! `multipart/mixed` (with `att_encoding_info=true`, attachments as stored). A
//! `multipart/related` revision (one with attachment bodies) is streamed straight into the
//! target's `PUT ?new_edits=false` when a target is given, else held within the endpoint's
//! `max_response_bytes`; also the parser of one `multipart/related` document, shared with the
//! multipart `_bulk_get` (`bulk_related.rs`).

use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::fetch::{Fetched, Wanted};
use super::multipart::{Watch, boundary_of, part_type};
use super::reframe::{Encodings, reframe};
use super::write::put_reframed;
use crate::replication::endpoint::database::{encode_doc_id, encode_query};
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{Hold, HttpClient, Req};
use crate::replication::http::upload::{PaceError, paced};

/// `GET doc?open_revs=[rev]&revs=true&latest=true&attachments=true`: with `keep_encoding`
/// (a CouchDB target), `att_encoding_info=true` asking for `multipart/mixed`, so gzip-encoded
/// attachments travel and are written as stored, with their encoding, digest and lengths;
/// without, asking for JSON (decoded attachments). Either answer is read. Missing revisions
/// yield nothing.
/// With `sink`, multipart is asked for whatever the target, and documents that come with
/// attachment bodies are streamed straight into a `PUT ?new_edits=false` on that target (never
/// held whole in memory; inflated on the way for a target that is not CouchDB); if that
/// fails, the caller fetches again without a sink (buffered, with retries).
pub async fn open_revs(
    source: &HttpClient,
    w: &Wanted,
    sink: Option<&HttpClient>,
    keep_encoding: bool,
) -> Result<Vec<Fetched>> {
    // Streamed to a target, attachments come as stored in multipart; one that is not
    // CouchDB gets them inflated on the way (`reframe`).
    let multipart = keep_encoding || sink.is_some();
    let mut req = Req::get(open_revs_path(w, multipart));
    // CouchDB's multipart answer carries gzip-encoded attachments as stored, whatever the
    // query says; only a CouchDB target keeps them so, any other gets the JSON answer
    // (attachments decoded, base64).
    req.accept = if multipart {
        "multipart/mixed"
    } else {
        "application/json"
    };
    // Passed on to a target, the answer waits whenever the target is slow to take it.
    req.paced_by_reader = sink.is_some();
    let resp = source.send_streaming(&req).await?;
    if !resp.status().is_success() {
        return Err(ReplicationError::OpenDocRevsFailed(format!(
            "{}: GET of a document answered {}",
            source.endpoint(),
            resp.status()
        )));
    }
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let what = format!("GET {}/{}", source.endpoint(), encode_doc_id(&w.id));
    if ctype.starts_with("multipart/") {
        let boundary = boundary_of(&ctype)?;
        let cap = source.limits().max_response_bytes;
        // Held whole without a target to pass it to: a declared length past the cap is
        // refused before reading, as any other body.
        if sink.is_none()
            && let Some(n) = resp.content_length().filter(|&n| n > cap)
        {
            return Err(ReplicationError::EndpointResponseTooLarge(format!(
                "{what} declared {n} bytes; the cap is [replicator] max_response_bytes ({cap})"
            )));
        }
        let idle = source.connection_timeout();
        let watch = Watch::default();
        let rate = source.limits().min_bytes_per_sec;
        let slow = watch.clone();
        let stream = paced(resp.bytes_stream(), idle, rate).map(move |r| {
            r.map_err(|e| {
                if matches!(e, PaceError::TooSlow(_)) {
                    slow.too_slow();
                }
                std::io::Error::other(e.to_string())
            })
        });
        let mp = multer::Multipart::new(watch.guard(stream, cap), boundary);
        let what = format!("GET {}/{}", source.endpoint(), encode_doc_id(&w.id));
        let encodings = if keep_encoding {
            Encodings::Keep
        } else {
            Encodings::Decode
        };
        return parse_mixed(source, mp, &w.id, sink.map(|t| (t, encodings)), &watch)
            .await
            .map_err(|e| watch.explain(e, &what));
    }
    let body = source.read_body_as(resp, &what, Hold::UntilDropped).await?;
    parse_json_revs(&body).map_err(|e| e.at(&what))
}

/// The path of `w`'s `open_revs` request, with `att_encoding_info` for a `multipart` answer.
fn open_revs_path(w: &Wanted, multipart: bool) -> String {
    let mut path = format!(
        "{}?revs=true&latest=true&attachments=true&open_revs={}",
        encode_doc_id(&w.id),
        encode_query(&json!([w.rev]).to_string())
    );
    if multipart {
        path.push_str("&att_encoding_info=true");
    }
    if !w.atts_since.is_empty() {
        let mut since = w.atts_since.clone();
        // Keep the URL short (CouchDB trims atts_since below 7000 chars).
        while since.len() > 1 && json!(since).to_string().len() > 6000 {
            since.truncate(since.len() / 2);
        }
        path.push_str(&format!(
            "&atts_since={}",
            encode_query(&json!(since).to_string())
        ));
    }
    path
}

/// Parses the JSON form: `[{"ok": doc} | {"missing": rev}]`.
pub fn parse_json_revs(body: &Bytes) -> Result<Vec<Fetched>> {
    #[derive(Deserialize)]
    struct Item<'a> {
        #[serde(borrow, default)]
        ok: Option<&'a RawValue>,
    }
    let items: Vec<Item<'_>> = serde_json::from_slice(body)
        .map_err(|e| ReplicationError::BadResponse(format!("open_revs: invalid JSON ({e})")))?;
    Ok(items
        .into_iter()
        .filter_map(|i| i.ok)
        .map(|raw| Fetched::Json(body.slice_ref(raw.get().as_bytes())))
        .collect())
}

/// Reads an `open_revs` `multipart/mixed` answer. Parts kept in memory count against the
/// endpoint's `max_response_bytes` together; parts passed through to `sink` are not held.
async fn parse_mixed(
    source: &HttpClient,
    mut mp: multer::Multipart<'static>,
    id: &str,
    sink: Option<(&HttpClient, Encodings)>,
    watch: &Watch,
) -> Result<Vec<Fetched>> {
    let err =
        |e: multer::Error| ReplicationError::OpenDocRevsFailed(format!("multipart body: {e}"));
    let what = format!(
        "GET {}/{} (multipart)",
        source.endpoint(),
        encode_doc_id(id)
    );
    let mut room = source.limits().max_response_bytes;
    let mut out = Vec::new();
    while let Some(field) = mp.next_field().await.map_err(err)? {
        let ctype = part_type(&field);
        if let Some((target, encodings)) = sink
            && ctype.starts_with("multipart/related")
        {
            // Passed through as it arrives, framed anew with a known length.
            let body = reframe(source, field, &ctype, &what, watch, encodings).await?;
            out.push(Fetched::Written(put_reframed(target, id, body).await?));
            continue;
        }
        let part = field.map(|r| {
            r.inspect(|b| watch.handed(b.len()))
                .map_err(|e| e.to_string())
        });
        let data = source
            .collect_within_limits(part, None, (room, Hold::UntilDropped), &what)
            .await?;
        room -= data.len() as u64;
        if ctype.starts_with("multipart/related") {
            let boundary = boundary_of(&ctype)?;
            let inner = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(data) });
            let doc = parse_related(multer::Multipart::new(inner, boundary), id).await;
            out.push(doc.map_err(|e| e.at(&what))?);
        } else {
            // A JSON part: a document without attachment bodies, or {"missing": rev}.
            // Only checked (parsed into a `Value`, an 8 MB document took 8 MB more).
            let v: JsonPart = serde_json::from_slice(&data)
                .map_err(|e| ReplicationError::BadResponse(format!("multipart JSON part: {e}")))?;
            if v.missing.is_none() && v.id.is_some() {
                out.push(Fetched::Json(data));
            }
        }
    }
    Ok(out)
}

/// What a JSON part of `open_revs` is: a document (`_id`) or `{"missing": rev}`; the rest
/// is skipped, not kept.
#[derive(Deserialize)]
struct JsonPart {
    #[serde(rename = "_id")]
    id: Option<serde::de::IgnoredAny>,
    missing: Option<serde::de::IgnoredAny>,
}

/// Parses one `multipart/related` document (JSON part first, then attachments).
pub async fn parse_related<'r>(mut mp: multer::Multipart<'r>, id: &str) -> Result<Fetched> {
    let err = |e: multer::Error| {
        ReplicationError::OpenDocRevsFailed(format!("multipart/related body: {e}"))
    };
    let mut json: Option<Bytes> = None;
    let mut parts = Vec::new();
    while let Some(field) = mp.next_field().await.map_err(err)? {
        let headers: Vec<(String, String)> = field
            .headers()
            .iter()
            .filter(|(k, _)| *k != "content-length")
            .filter_map(|(k, v)| {
                v.to_str()
                    .ok()
                    .map(|v| (k.as_str().to_owned(), v.to_owned()))
            })
            .collect();
        let data = field.bytes().await.map_err(err)?;
        if json.is_none() {
            json = Some(data);
        } else {
            parts.push((headers, data));
        }
    }
    let json = json
        .ok_or_else(|| ReplicationError::BadResponse("empty multipart/related document".into()))?;
    // Checked here, not by the target: a document the source sent broken is the source's
    // fault (the job's reason), not a write failure of the target's.
    // (`RawValue` checks UTF-8 and depth; `IgnoredAny` would skip strings unchecked.)
    serde_json::from_slice::<&RawValue>(&json).map_err(|e| {
        ReplicationError::BadResponse(format!("multipart/related JSON part: invalid ({e})"))
    })?;
    Ok(Fetched::Multipart {
        id: id.to_owned(),
        json,
        parts,
    })
}
