//! Fetching missing revisions from the source: `_bulk_get` (JSON, attachment stubs only)
//! first; revisions whose attachments are small (at most [`INLINE_ATTACHMENTS_MAX`] in all)
//! then come through a multipart `_bulk_get` with their attachments as stored
//! (`bulk_related.rs`), so a batch costs the source two requests instead of one per such
//! document; the rest (large attachments, errors) through individual
//! `GET doc?open_revs=[..]&revs=true&latest=true&att_encoding_info=true` with
//! `Accept: multipart/mixed` (`open_revs.rs`). Document bodies stay raw JSON bytes (slices of
//! the response) so they can be passed to `_bulk_docs` without being rebuilt; a
//! `multipart/related` revision (one with attachment bodies) is streamed straight into the
//! target's `PUT ?new_edits=false`, so attachments are never held whole in memory, and
//! gzip-encoded ones stay gzip-encoded.

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::write::WriteResult;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req};

/// A fetched revision.
#[derive(Debug, Clone)]
pub enum Fetched {
    /// JSON document (with `_revisions`; attachments, if any, inline or as stubs the target
    /// already has).
    Json(Bytes),
    /// A `multipart/related` document: JSON with `follows` attachments and their bodies, in
    /// the order the JSON lists them.
    Multipart {
        /// Document id.
        id: String,
        /// The JSON part.
        json: Bytes,
        /// Attachment parts: (headers to repeat, data).
        parts: Vec<(Vec<(String, String)>, Bytes)>,
    },
    /// A `multipart/related` document already streamed to the target as it arrived.
    Written(WriteResult),
}

/// One revision to fetch.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// Document id.
    pub id: String,
    /// Revision.
    pub rev: String,
    /// Revisions the target has (attachments since them need not be sent).
    pub atts_since: Vec<String>,
}

#[derive(Deserialize)]
struct BulkGetResp<'a> {
    #[serde(borrow)]
    results: Vec<BulkGetResult<'a>>,
}

#[derive(Deserialize)]
struct BulkGetResult<'a> {
    id: String,
    #[serde(borrow)]
    docs: Vec<BulkGetDoc<'a>>,
}

#[derive(Deserialize)]
struct BulkGetDoc<'a> {
    #[serde(borrow, default)]
    ok: Option<&'a RawValue>,
}

/// CouchDB 3.3's adaptive `_bulk_get` use: an exponential moving average (decay 0.25) of the
/// fraction of revisions it failed to deliver (all of them for a non-200 answer); try it while
/// that is at most 0.5, and at least every 37 s, so a source that cannot serve it costs
/// little and a transient failure does not turn it off for good.
#[derive(Debug, Default)]
pub struct BulkGetGate {
    avg: f64,
    last_try: Option<tokio::time::Instant>,
}

impl BulkGetGate {
    const DECAY: f64 = 0.25;
    const THRESHOLD: f64 = 0.5;
    const MAX_GAP: std::time::Duration = std::time::Duration::from_secs(37);

    /// Whether the next batch should try `_bulk_get`.
    pub fn should_try(&self) -> bool {
        self.avg <= Self::THRESHOLD || self.last_try.is_none_or(|t| t.elapsed() >= Self::MAX_GAP)
    }

    /// Records a try: `failed` of `asked` revisions were not delivered.
    pub fn record(&mut self, asked: usize, failed: usize) {
        if asked == 0 {
            return;
        }
        let frac = failed as f64 / asked as f64;
        self.avg = Self::DECAY * frac + (1.0 - Self::DECAY) * self.avg;
        self.last_try = Some(tokio::time::Instant::now());
    }
}

/// Revisions whose attachments add up to at most this many bytes are fetched in bulk with
/// their attachment bodies (one multipart `_bulk_get`); larger ones are streamed one by one.
pub const INLINE_ATTACHMENTS_MAX: u64 = 256 * 1024;

/// What to do with one requested revision after a `_bulk_get`, worst last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Done,
    Inline,
    Refetch,
}

/// Outcome of a `_bulk_get`: documents ready to write, and revisions to fetch again.
#[derive(Debug, Default)]
pub struct BulkGetOutcome {
    /// Ready JSON documents.
    pub docs: Vec<Bytes>,
    /// Revisions with small attachments, to fetch again in bulk with their attachments.
    pub inline: Vec<Wanted>,
    /// To refetch individually (large attachments, errors).
    pub refetch: Vec<Wanted>,
    /// False if `_bulk_get` itself is unusable on this source.
    pub supported: bool,
}

/// `POST _bulk_get?revs=true&latest=true&attachments=false` (JSON, stubs only): revisions
/// with attachments come back in [`BulkGetOutcome::inline`] (small ones, for
/// [`super::bulk_related::bulk_get_related`]) or [`BulkGetOutcome::refetch`].
pub async fn bulk_get(source: &HttpClient, wanted: Vec<Wanted>) -> Result<BulkGetOutcome> {
    match request_bulk_get(source, &wanted, BulkPass::Stubs).await {
        Ok(Some(resp)) => Ok(bulk_get_outcome(&resp.body, wanted, false)),
        Ok(None) => Ok(BulkGetOutcome::unsupported(wanted)),
        Err(e) => Err(e),
    }
}

/// Sorts the documents of a JSON `_bulk_get` answer: without `attachments` as [`bulk_get`]
/// says; with them (a source that answered the multipart request with inline attachments),
/// documents are taken as they come (stubs only where `atts_since` allows them).
pub(crate) fn bulk_get_outcome(
    body: &Bytes,
    wanted: Vec<Wanted>,
    attachments: bool,
) -> BulkGetOutcome {
    let Ok(parsed) = serde_json::from_slice::<BulkGetResp<'_>>(body) else {
        return BulkGetOutcome::unsupported(wanted);
    };
    let mut out = BulkGetOutcome {
        supported: true,
        ..Default::default()
    };
    // Results come one per requested revision, in order; match by position when they line up
    // so no document has to be parsed again.
    let positional = parsed.results.len() == wanted.len()
        && parsed
            .results
            .iter()
            .zip(&wanted)
            .all(|(r, w)| r.id == w.id);
    let mut seen = Unordered::default();
    let mut verdicts = vec![Verdict::Refetch; wanted.len()];
    for (i, r) in parsed.results.into_iter().enumerate() {
        // Stubs are acceptable in the attachments=true pass only where atts_since asked.
        let stubs_ok = positional && wanted.get(i).is_some_and(|w| !w.atts_since.is_empty());
        let track = (!positional).then_some(&mut seen);
        let verdict = take_result(r, body, attachments, stubs_ok, &mut out.docs, track);
        if positional {
            verdicts[i] = verdict;
        }
    }
    if !positional {
        for (w, v) in wanted.iter().zip(verdicts.iter_mut()) {
            *v = seen.verdict(w);
        }
    }
    for (w, v) in wanted.into_iter().zip(verdicts) {
        match v {
            Verdict::Done => {}
            Verdict::Inline => out.inline.push(w),
            Verdict::Refetch => out.refetch.push(w),
        }
    }
    out
}

impl BulkGetOutcome {
    /// `_bulk_get` is not usable here: every revision is fetched one by one.
    pub(crate) fn unsupported(wanted: Vec<Wanted>) -> Self {
        Self {
            refetch: wanted,
            supported: false,
            ..Default::default()
        }
    }
}

/// Which `_bulk_get` request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BulkPass {
    /// JSON, attachment stubs only.
    Stubs,
    /// JSON, attachment bodies inline (base64 of the decoded bytes): for a target that is not
    /// CouchDB, which would take gzip bytes for the content.
    Inline,
    /// `multipart/mixed` asked for, attachment bodies as they are stored (gzip-encoded ones
    /// stay gzip-encoded; `att_encoding_info` for the JSON parts); a source that cannot
    /// answer so (pouchdb-server) answers JSON with inline attachments.
    Related,
}

/// Sends the `_bulk_get` request. `Ok(None)` when the source cannot serve it (any failure
/// but 429 exhaustion, or a status other than 200): the caller falls back to single fetches.
pub(crate) async fn request_bulk_get(
    source: &HttpClient,
    wanted: &[Wanted],
    pass: BulkPass,
) -> Result<Option<crate::replication::http::client::Resp>> {
    // CouchDB answers `attachments=false` with the bodies of attachments newer than
    // `atts_since` inline (base64) all the same: the stubs pass leaves it out, the passes
    // with attachments send it so that only those bodies travel.
    let docs: Vec<Value> = wanted
        .iter()
        .map(|w| {
            if w.atts_since.is_empty() || pass == BulkPass::Stubs {
                json!({"id": w.id, "rev": w.rev})
            } else {
                json!({"id": w.id, "rev": w.rev, "atts_since": w.atts_since})
            }
        })
        .collect();
    let attachments = pass != BulkPass::Stubs;
    let body =
        json!({"docs": docs, "latest": true, "revs": true, "attachments": attachments}).to_string();
    let path = match pass {
        BulkPass::Stubs => "_bulk_get?latest=true&revs=true&attachments=false",
        BulkPass::Inline => "_bulk_get?latest=true&revs=true&attachments=true",
        BulkPass::Related => {
            "_bulk_get?latest=true&revs=true&attachments=true&att_encoding_info=true"
        }
    };
    let mut req = Req::json(Method::POST, path, body);
    if pass == BulkPass::Related {
        req.accept = "multipart/mixed";
    }
    match source.send(&req).await {
        Ok(resp) if resp.status == StatusCode::OK => Ok(Some(resp)),
        Ok(_) => Ok(None),
        // 429 exhaustion ends the replication; any other failure falls back to single fetches.
        Err(e @ ReplicationError::MaxBackoff(_)) => Err(e),
        Err(e) => {
            tracing::debug!(error = %e, "_bulk_get failed, fetching one by one");
            Ok(None)
        }
    }
}

/// What the results said when they do not line up with the request one to one: the
/// revisions received and the ids whose attachments are small enough to inline.
#[derive(Default)]
struct Unordered {
    got: std::collections::HashSet<(String, String)>,
    inline_ids: std::collections::HashSet<String>,
}

impl Unordered {
    fn verdict(&self, w: &Wanted) -> Verdict {
        if self.got.contains(&(w.id.clone(), w.rev.clone())) {
            Verdict::Done
        } else if self.inline_ids.contains(&w.id) {
            Verdict::Inline
        } else {
            Verdict::Refetch
        }
    }
}

/// Takes the usable documents of one `_bulk_get` result into `docs` (slices of `body`, no
/// copy) and returns what to do with the requested revision. With `track`, received
/// revisions and inline candidates are recorded there instead (results out of order).
fn take_result(
    r: BulkGetResult<'_>,
    body: &Bytes,
    attachments: bool,
    stubs_ok: bool,
    docs: &mut Vec<Bytes>,
    mut track: Option<&mut Unordered>,
) -> Verdict {
    let mut verdict = if r.docs.is_empty() {
        Verdict::Refetch
    } else {
        Verdict::Done
    };
    for d in r.docs {
        let Some(raw) = d.ok else {
            verdict = verdict.max(Verdict::Refetch);
            continue;
        };
        let text = raw.get();
        if text.contains("\"_attachments\"") {
            let v = if attachments {
                if stubs_ok || !text.contains("\"stub\":true") {
                    Verdict::Done
                } else {
                    Verdict::Refetch
                }
            } else if attachments_fit_inline(text) {
                Verdict::Inline
            } else {
                Verdict::Refetch
            };
            if v != Verdict::Done {
                verdict = verdict.max(v);
                continue;
            }
        }
        if let Some(seen) = track.as_deref_mut()
            && let Some(rev) = rev_of(text)
        {
            seen.got.insert((r.id.clone(), rev));
        }
        docs.push(body.slice_ref(text.as_bytes()));
    }
    if let Some(seen) = track
        && verdict == Verdict::Inline
    {
        seen.inline_ids.insert(r.id.clone());
    }
    verdict
}

/// Whether a document's attachment stubs add up to at most [`INLINE_ATTACHMENTS_MAX`] bytes
/// (a stub without a length counts as too large).
fn attachments_fit_inline(doc: &str) -> bool {
    #[derive(Deserialize)]
    struct Stub {
        #[serde(default)]
        length: Option<u64>,
    }
    #[derive(Deserialize)]
    struct Doc {
        #[serde(rename = "_attachments", default)]
        atts: std::collections::HashMap<String, Stub>,
    }
    serde_json::from_str::<Doc>(doc).is_ok_and(|d| {
        d.atts
            .values()
            .try_fold(0u64, |sum, a| sum.checked_add(a.length?))
            .is_some_and(|total| total <= INLINE_ATTACHMENTS_MAX)
    })
}

fn rev_of(doc: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct R {
        #[serde(rename = "_rev")]
        rev: String,
    }
    serde_json::from_str::<R>(doc).ok().map(|r| r.rev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_known_attachments_are_fetched_inline() {
        let doc = |atts: &str| format!(r#"{{"_id":"a","_rev":"1-x","_attachments":{{{atts}}}}}"#);
        let stub = |name: &str, len: u64| {
            format!(r#""{name}":{{"stub":true,"digest":"md5-x","length":{len},"revpos":1}}"#)
        };
        assert!(attachments_fit_inline(&doc(&stub("a", 20_000))));
        let two = format!("{},{}", stub("a", 200_000), stub("b", 62_144));
        assert!(attachments_fit_inline(&doc(&two)));
        let over = format!("{},{}", stub("a", 200_000), stub("b", 62_145));
        assert!(!attachments_fit_inline(&doc(&over)));
        assert!(!attachments_fit_inline(&doc(r#""a":{"stub":true}"#)));
        assert!(!attachments_fit_inline(&doc(&stub("a", u64::MAX))));
        assert!(!attachments_fit_inline("not json"));
    }
}
