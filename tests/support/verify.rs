//! A source and an incomplete target for `verify` tests, built with `new_edits=false` writes
//! so both sides hold exactly the revisions a case needs, on any server (pouchdb-server or
//! CouchDB): a document whose newest leaf the target lacks, one whose conflict it lacks, one
//! whose deleted leaf it lacks, one whose attachment differs under the same revision, one
//! the filter leaves out (missing on the target too), and one that is the same on both.

use base64::Engine as _;
use serde_json::{Value, json};

use couch_replicator::replication::verify::{VerifyOptions, verify};
use couch_replicator::replication::{Context, ReplicationSpec};

use super::couch::Couch;
use super::deadline;

/// A revision id `N-<32 hex>` from a short tag (CouchDB keeps 32-hex ids as binary).
pub fn rev(n: u32, tag: &str) -> String {
    format!("{n}-{}", hash(tag))
}

fn hash(tag: &str) -> String {
    format!(
        "{:0>32}",
        tag.bytes().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// A revision with its history (`tags` newest first) and a body.
pub fn revision(id: &str, tags: &[&str], body: Value) -> Value {
    let n = u32::try_from(tags.len()).expect("short history");
    let mut doc = body;
    doc["_id"] = json!(id);
    doc["_rev"] = json!(rev(n, tags[0]));
    doc["_revisions"] =
        json!({"start": n, "ids": tags.iter().map(|t| hash(t)).collect::<Vec<_>>()});
    doc
}

fn with_attachment(mut doc: Value, data: &[u8]) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD.encode(data);
    doc["_attachments"] = json!({"f.txt": {"content_type": "text/plain", "data": b64}});
    doc
}

/// The selector that selects every fixture document except `zz-outside` (CouchDB only:
/// pouchdb-server cannot serve `filter=_selector`).
pub fn selector() -> Value {
    json!({"kind": "in"})
}

/// The `doc_ids` that select every fixture document except `zz-outside`.
pub fn doc_ids() -> Vec<String> {
    ["att", "conflict", "deleted", "leaf", "same"]
        .map(String::from)
        .to_vec()
}

/// What the fixture expects `verify` to find.
pub struct Expected {
    /// `(id, rev)` leaves the target lacks, sorted by id.
    pub missing: Vec<(String, String)>,
    /// The `(id, rev)` whose attachment differs.
    pub different: (String, String),
    /// Selected documents / leaves on the source.
    pub docs: u64,
    /// Leaves of the selected documents.
    pub leaves: u64,
}

/// Fills `src` and `tgt` (both created here) on the servers of `s` and `t`.
pub async fn incomplete(s: &Couch, src: &str, t: &Couch, tgt: &str) -> Expected {
    s.create_db(src).await;
    t.create_db(tgt).await;
    let k = json!({"kind": "in"});
    let common = vec![
        revision("same", &["s1"], json!({"kind": "in", "v": 1})),
        revision("leaf", &["l1"], k.clone()),
        revision(
            "conflict",
            &["c2a", "c1"],
            json!({"kind": "in", "side": "a"}),
        ),
        revision("deleted", &["d1"], k.clone()),
    ];
    s.bulk_no_edits(src, &common).await;
    t.bulk_no_edits(tgt, &common).await;
    s.bulk_no_edits(
        src,
        &[
            revision("leaf", &["l2", "l1"], json!({"kind": "in", "v": 2})),
            revision(
                "conflict",
                &["c2b", "c1"],
                json!({"kind": "in", "side": "b"}),
            ),
            revision(
                "deleted",
                &["d2", "d1"],
                json!({"kind": "in", "_deleted": true}),
            ),
            revision("zz-outside", &["o1"], json!({"kind": "out"})),
            with_attachment(revision("att", &["a1"], k.clone()), b"hello"),
        ],
    )
    .await;
    t.bulk_no_edits(
        tgt,
        &[with_attachment(revision("att", &["a1"], k), b"HELLO")],
    )
    .await;
    Expected {
        missing: vec![
            ("conflict".into(), rev(2, "c2b")),
            ("deleted".into(), rev(2, "d2")),
            ("leaf".into(), rev(2, "l2")),
        ],
        different: ("att".into(), rev(1, "a1")),
        docs: 5,
        leaves: 6,
    }
}

/// The report's `(id, rev)` missing leaves, sorted.
pub fn missing_of(report: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = report["first_missing"]
        .as_array()
        .expect("first_missing")
        .iter()
        .flat_map(|m| {
            let id = m["id"].as_str().expect("id").to_owned();
            m["revs"]
                .as_array()
                .expect("revs")
                .iter()
                .map(move |r| (id.clone(), r.as_str().expect("rev").to_owned()))
        })
        .collect();
    out.sort();
    out
}

/// The report's `(id, rev)` differing leaves.
pub fn different_of(report: &Value) -> Vec<(String, String)> {
    report["first_different"]
        .as_array()
        .expect("first_different")
        .iter()
        .map(|d| {
            (
                d["id"].as_str().expect("id").to_owned(),
                d["rev"].as_str().expect("rev").to_owned(),
            )
        })
        .collect()
}

/// Verifies `s` (deeply when asked) and gives the report as JSON.
pub async fn run(s: &ReplicationSpec, deep: bool) -> Value {
    let opts = VerifyOptions {
        deep,
        progress: None,
    };
    let r = deadline(60, "verify", verify(s, &Context::default(), &opts))
        .await
        .unwrap();
    serde_json::to_value(r).unwrap()
}
