//! Revisions with (small) attachments fetched in bulk with their attachments as stored:
//! `POST _bulk_get?attachments=true&att_encoding_info=true` asking for `multipart/mixed`, so a
//! gzip-encoded attachment crosses the wire gzip-encoded, as one `multipart/related` part per
//! revision, ready to be written with `PUT ?new_edits=false` keeping its `encoding`, `digest`,
//! `length` and `encoded_length`. For a target that is not CouchDB (pouchdb-server would store
//! gzip bytes as the content), the JSON pass with inline, decoded attachments is used instead. One request serves a whole chunk of revisions instead of one
//! `GET ?open_revs` each (CouchDB's replicator). A source that answers JSON instead
//! (pouchdb-server never answers multipart) is read as the inline JSON pass was.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use serde::Deserialize;

use super::fetch::{BulkGetOutcome, BulkPass, Fetched, Wanted, bulk_get_outcome, request_bulk_get};
use super::multipart::{boundary_of, part_type};
use super::open_revs::parse_related;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::HttpClient;

/// Revisions asked for in one multipart `_bulk_get`: each has at most
/// [`super::fetch::INLINE_ATTACHMENTS_MAX`] of attachments, so an answer stays bounded.
pub const RELATED_CHUNK: usize = 64;

/// What a multipart `_bulk_get` brought.
#[derive(Debug, Default)]
pub struct RelatedOutcome {
    /// JSON documents (no attachment body needed, or a source that answered JSON).
    pub docs: Vec<Bytes>,
    /// Documents with attachment bodies, each with the revision asked for (to fetch it again
    /// in full if the target lacks an attachment left out as a stub).
    pub related: Vec<(Wanted, Fetched)>,
    /// Revisions not delivered: to fetch one by one.
    pub refetch: Vec<Wanted>,
    /// Whether the source served the request at all.
    pub supported: bool,
}

impl From<BulkGetOutcome> for RelatedOutcome {
    fn from(o: BulkGetOutcome) -> Self {
        let mut refetch = o.refetch;
        refetch.extend(o.inline);
        Self {
            docs: o.docs,
            related: Vec::new(),
            refetch,
            supported: o.supported,
        }
    }
}

#[derive(Deserialize)]
struct IdRev {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "_rev")]
    rev: String,
}

/// Fetches `wanted` (revisions known to have attachments) in chunks of [`RELATED_CHUNK`];
/// with `keep_encoding` (see `Shared::keep_encoding`), attachments come
/// as stored in multipart, else decoded inline in JSON.
pub async fn bulk_get_related(
    source: &HttpClient,
    wanted: Vec<Wanted>,
    keep_encoding: bool,
) -> Result<RelatedOutcome> {
    let pass = if keep_encoding {
        BulkPass::Related
    } else {
        BulkPass::Inline
    };
    let mut out = RelatedOutcome {
        supported: true,
        ..Default::default()
    };
    let mut rest = wanted;
    while !rest.is_empty() {
        let tail = rest.split_off(rest.len().min(RELATED_CHUNK));
        let chunk = std::mem::replace(&mut rest, tail);
        let got = fetch_chunk(source, chunk, pass).await?;
        out.supported &= got.supported;
        out.docs.extend(got.docs);
        out.related.extend(got.related);
        out.refetch.extend(got.refetch);
    }
    Ok(out)
}

async fn fetch_chunk(
    source: &HttpClient,
    wanted: Vec<Wanted>,
    pass: BulkPass,
) -> Result<RelatedOutcome> {
    let Some(resp) = request_bulk_get(source, &wanted, pass).await? else {
        return Ok(BulkGetOutcome::unsupported(wanted).into());
    };
    let ctype = resp
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if !ctype.to_ascii_lowercase().starts_with("multipart/") {
        return Ok(bulk_get_outcome(&resp.body, wanted, true).into());
    }
    let body = resp.body;
    let parsed = match boundary_of(&ctype) {
        Ok(boundary) => {
            let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
            parse_mixed_bulk(multer::Multipart::new(stream, boundary), wanted.clone()).await
        }
        Err(e) => Err(e),
    };
    // An answer that cannot be read costs this chunk its bulk fetch, not the replication.
    Ok(parsed.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "multipart _bulk_get unreadable, fetching one by one");
        BulkGetOutcome::unsupported(wanted).into()
    }))
}

/// Reads a `multipart/mixed` `_bulk_get` answer: `application/json` parts (a document without
/// attachment bodies, or an error) and `multipart/related` parts (a document with them).
/// Revisions asked for that did not come back usable are left to fetch one by one.
async fn parse_mixed_bulk(
    mut mp: multer::Multipart<'static>,
    wanted: Vec<Wanted>,
) -> Result<RelatedOutcome> {
    let err = |e: multer::Error| ReplicationError::BadResponse(format!("_bulk_get multipart: {e}"));
    let mut asked: HashMap<(String, String), Wanted> = wanted
        .into_iter()
        .map(|w| ((w.id.clone(), w.rev.clone()), w))
        .collect();
    let mut out = RelatedOutcome {
        supported: true,
        ..Default::default()
    };
    let mut got: HashSet<(String, String)> = HashSet::new();
    while let Some(field) = mp.next_field().await.map_err(err)? {
        let ctype = part_type(&field);
        let data = field.bytes().await.map_err(err)?;
        if ctype.to_ascii_lowercase().starts_with("multipart/related") {
            let inner_boundary = boundary_of(&ctype)?;
            let inner = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(data) });
            let doc = parse_related(multer::Multipart::new(inner, inner_boundary), "").await?;
            let Fetched::Multipart { json, parts, .. } = doc else {
                continue;
            };
            let Ok(idrev) = serde_json::from_slice::<IdRev>(&json) else {
                continue;
            };
            let key = (idrev.id.clone(), idrev.rev.clone());
            let w = asked.get(&key).cloned().unwrap_or_else(|| Wanted {
                id: idrev.id.clone(),
                rev: idrev.rev.clone(),
                atts_since: Vec::new(),
            });
            got.insert(key);
            let fetched = Fetched::Multipart {
                id: idrev.id,
                json,
                parts,
            };
            out.related.push((w, fetched));
        } else if let Some(key) = usable_json(&ctype, &data, &asked) {
            got.insert(key);
            out.docs.push(data);
        }
    }
    asked.retain(|k, _| !got.contains(k));
    out.refetch = asked.into_values().collect();
    Ok(out)
}

/// The (id, rev) of a JSON part that can be written as it is: a document (not an error) whose
/// attachment stubs, if any, the target was said to have (`atts_since`).
fn usable_json(
    ctype: &str,
    data: &Bytes,
    asked: &HashMap<(String, String), Wanted>,
) -> Option<(String, String)> {
    if ctype.contains("error") {
        return None;
    }
    let idrev = serde_json::from_slice::<IdRev>(data).ok()?;
    let key = (idrev.id, idrev.rev);
    let text = std::str::from_utf8(data).ok()?;
    let stubs_ok = asked.get(&key).is_some_and(|w| !w.atts_since.is_empty());
    (stubs_ok || !text.contains("\"stub\":true")).then_some(key)
}
