//! The benchmark's deterministic data set: `n` documents of about 1 KB; every 10th has several
//! revisions in its history (2 to 5), every 30th of those also a conflicting second leaf, and
//! every 100th a 20 KB attachment. Bodies are `_bulk_docs` `new_edits=false` entries with full
//! `_revisions`, so the same batches fill the source and measure the target's write ceiling,
//! and the generator also answers what the target must hold (leaf revisions, rev history,
//! bodies, attachment digests) for verification.

use base64::Engine as _;
use md5::{Digest, Md5};
use serde_json::{Map, Value, json};

const WORDS: &[&str] = &[
    "replica",
    "sequence",
    "checkpoint",
    "revision",
    "leaf",
    "conflict",
    "attachment",
    "batch",
    "worker",
    "source",
    "target",
    "feed",
    "history",
    "digest",
    "stub",
    "pipeline",
    "server",
    "shard",
    "node",
    "cluster",
    "session",
    "filter",
    "selector",
    "document",
];
/// Attachment size.
pub const ATT_BYTES: usize = 20 * 1024;
/// Attachment name.
pub const ATT_NAME: &str = "blob.bin";

fn mix(mut x: u64) -> u64 {
    // splitmix64: a fixed, seedable stream without a dependency.
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The shape of document `i`.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Revision depth of the (first) leaf.
    pub depth: u64,
    /// Has a second, conflicting leaf.
    pub conflict: bool,
    /// Carries the 20 KB attachment.
    pub attachment: bool,
}

/// Shape of document `i`.
pub fn shape(i: u64) -> Shape {
    let multi = i % 10 == 3;
    Shape {
        depth: if multi { 2 + (i / 10) % 4 } else { 1 },
        conflict: multi && i % 30 == 3,
        attachment: i % 100 == 7,
    }
}

/// Document id of `i`.
pub fn doc_id(i: u64) -> String {
    format!("doc-{i:07}")
}

fn rev_hash(i: u64, pos: u64, branch: u64) -> String {
    let a = mix(i.wrapping_mul(1_000_003) ^ (pos << 40) ^ (branch << 56));
    let b = mix(a ^ 0x5555);
    format!("{a:016x}{b:016x}")
}

/// Revision ids (newest first) of leaf `branch` (0 or 1) of document `i`.
fn rev_ids(i: u64, branch: u64) -> Vec<String> {
    let s = shape(i);
    (1..=s.depth)
        .rev()
        .map(|pos| {
            // Branch 1 shares all ancestors and differs only in the leaf.
            let b = if pos == s.depth { branch } else { 0 };
            rev_hash(i, pos, b)
        })
        .collect()
}

/// Leaf revisions (`N-hash`) of document `i`, sorted.
pub fn leaf_revs(i: u64) -> Vec<String> {
    let s = shape(i);
    let mut v: Vec<String> = (0..if s.conflict { 2 } else { 1 })
        .map(|b| format!("{}-{}", s.depth, rev_ids(i, b)[0]))
        .collect();
    v.sort();
    v
}

/// The branch and `_revisions` of leaf `rev` of document `i`, or None if it is not a leaf.
pub fn revisions_of(i: u64, rev: &str) -> Option<(u64, Value)> {
    let s = shape(i);
    (0..if s.conflict { 2 } else { 1 })
        .map(|b| (b, rev_ids(i, b)))
        .find(|(_, ids)| format!("{}-{}", s.depth, ids[0]) == rev)
        .map(|(b, ids)| (b, json!({"start": s.depth, "ids": ids})))
}

/// The user fields of leaf `branch` of document `i` (no `_` fields).
pub fn body(i: u64, branch: u64) -> Map<String, Value> {
    let mut r = mix(i ^ 0xD0C0_FFEE ^ (branch << 48));
    let mut text = String::with_capacity(900);
    while text.len() < 820 {
        r = mix(r);
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS[(r % WORDS.len() as u64) as usize]);
    }
    let mut m = Map::new();
    m.insert("type".into(), json!("bench"));
    m.insert("n".into(), json!(i));
    m.insert("branch".into(), json!(branch));
    m.insert("name".into(), json!(format!("document number {i}")));
    m.insert("score".into(), json!(r % 10_000));
    m.insert(
        "tags".into(),
        json!([WORDS[(r % 7) as usize], WORDS[(r % 11) as usize]]),
    );
    m.insert(
        "owner".into(),
        json!({"name": format!("user{}", r % 977), "since": 1_700_000_000 + r % 10_000_000}),
    );
    m.insert("text".into(), json!(text));
    m
}

/// The attachment bytes of document `i`.
pub fn attachment(i: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(ATT_BYTES);
    let mut r = i ^ 0xA77A_C4ED;
    while out.len() < ATT_BYTES {
        r = mix(r);
        out.extend_from_slice(&r.to_le_bytes());
    }
    out.truncate(ATT_BYTES);
    out
}

/// CouchDB's digest of an attachment: `md5-<base64 of md5>`.
pub fn digest(data: &[u8]) -> String {
    let sum = Md5::digest(data);
    format!(
        "md5-{}",
        base64::engine::general_purpose::STANDARD.encode(sum)
    )
}

/// The `_bulk_docs` entries (one per leaf) of document `i`.
pub fn entries(i: u64) -> Vec<Value> {
    let s = shape(i);
    (0..if s.conflict { 2 } else { 1 })
        .map(|b| {
            let ids = rev_ids(i, b);
            let mut m = body(i, b);
            m.insert("_id".into(), json!(doc_id(i)));
            m.insert("_rev".into(), json!(format!("{}-{}", s.depth, ids[0])));
            m.insert("_revisions".into(), json!({"start": s.depth, "ids": ids}));
            if s.attachment {
                let data = base64::engine::general_purpose::STANDARD.encode(attachment(i));
                m.insert(
                    "_attachments".into(),
                    json!({ATT_NAME: {"content_type": "application/octet-stream", "data": data}}),
                );
            }
            Value::Object(m)
        })
        .collect()
}

/// A `_bulk_docs` `new_edits=false` body for documents `from..to`.
pub fn bulk_body(from: u64, to: u64) -> Vec<u8> {
    let docs: Vec<Value> = (from..to).flat_map(entries).collect();
    json!({"new_edits": false, "docs": docs})
        .to_string()
        .into_bytes()
}
