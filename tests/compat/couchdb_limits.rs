//! CouchDB's limits replicate exactly under our caps (`docs/operations.md`, "Caps on what
//! endpoints send"): a document near `max_document_size` (8 MB), a document with 1,000
//! conflicting leaves, a revision history 10,000 deep (`_revs_limit` raised), ids of 1 KB of
//! non-ASCII text. The same source is copied by CouchDB 3.4.3's own replicator and by ours;
//! both copies must equal the source leaf by leaf (bodies, `_revisions`).

use serde_json::{Value, json};

use crate::support::couch::Couch;
use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use couch_replicator::replication::{Context, ReplicationSpec, replicate};

/// Below CouchDB's default `max_document_size` (8,000,000 bytes of JSON).
const BIG_DOC_BYTES: usize = 7_900_000;
const LEAVES: usize = 1_000;
const DEPTH: usize = 10_000;

fn rev_hash(i: usize) -> String {
    format!("{:032x}", (i as u128 + 1) * 0x9e37_79b9_7f4a_7c15)
}

/// The documents at CouchDB's limits, as `new_edits=false` revisions.
fn limit_docs() -> Vec<Value> {
    let mut docs = vec![json!({
        "_id": "big", "_rev": format!("1-{}", rev_hash(0)),
        "text": "x".repeat(BIG_DOC_BYTES),
    })];
    docs.extend(
        (0..LEAVES)
            .map(|i| json!({"_id": "conflicted", "_rev": format!("1-{}", rev_hash(i)), "leaf": i})),
    );
    let ids: Vec<String> = (0..DEPTH).rev().map(rev_hash).collect();
    docs.push(json!({
        "_id": "deep", "_rev": format!("{DEPTH}-{}", ids[0]),
        "_revisions": {"start": DEPTH, "ids": ids},
    }));
    for (n, ch) in ["é", "漢", "🦀"].into_iter().enumerate() {
        let id: String = std::iter::repeat_n(ch, 1024 / ch.len()).collect();
        docs.push(json!({"_id": id, "_rev": format!("1-{}", rev_hash(n)), "n": n}));
    }
    docs
}

async fn create_with_deep_revs(c: &Couch, http: &reqwest::Client, url: &str, db: &str) {
    c.create_db(db).await;
    let r = http
        .put(format!("{url}/{db}/_revs_limit"))
        .basic_auth("admin", Some("admin"))
        .body((DEPTH * 2).to_string())
        .send()
        .await
        .expect("PUT _revs_limit");
    assert_eq!(r.status().as_u16(), 200, "_revs_limit of {db}");
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_at_couchdbs_limits_replicate_exactly_like_couchdb() {
    let test = "documents_at_couchdbs_limits_replicate_exactly_like_couchdb";
    let Some(peer) = CouchPeer::start(test, None) else {
        return;
    };
    peer.warm_up_sessions().await;
    let c = Couch::new(&peer.admin_url());
    let http = reqwest::Client::new();
    for db in ["src", "theirs", "mine"] {
        create_with_deep_revs(&c, &http, &peer.url(), db).await;
    }
    c.bulk_no_edits("src", &limit_docs()).await;
    let (_, conflicted) = c.get_doc("src", "conflicted?conflicts=true").await;
    assert_eq!(
        conflicted["_conflicts"].as_array().map(Vec::len),
        Some(LEAVES - 1),
        "the source holds every conflicting leaf"
    );

    deadline(300, "both replications", async {
        let body = json!({
            "source": format!("{}/src", peer.admin_url()),
            "target": format!("{}/theirs", peer.admin_url()),
        });
        let r = http
            .post(format!("{}/_replicate", peer.url()))
            .basic_auth("admin", Some("admin"))
            .json(&body)
            .send()
            .await
            .expect("CouchDB's _replicate");
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "CouchDB's _replicate: {status} {v}");

        let spec = ReplicationSpec::from_json(&json!({
            "source": format!("{}/src", peer.admin_url()),
            "target": format!("{}/mine", peer.admin_url()),
        }))
        .expect("spec");
        let stats = replicate(spec, Context::default())
            .await
            .expect("our replication");
        assert_eq!(stats.doc_write_failures, 0, "{stats:?}");
    })
    .await;

    let n = c.assert_same("src", &c, "theirs").await;
    assert_eq!(n, 1 + LEAVES + 1 + 3, "leaves in the source");
    c.assert_same("src", &c, "mine").await;
    let (_, deep) = c.get_doc("mine", "deep?revs=true").await;
    assert_eq!(
        deep["_revisions"]["ids"].as_array().map(Vec::len),
        Some(DEPTH),
        "the whole history arrived"
    );
}
