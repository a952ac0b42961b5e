//! Attachments keep their encoding: the same source replicated by CouchDB 3.4.3's own
//! replicator (`POST /_replicate`) and by ours (through the recording proxy) gives targets whose
//! attachment stubs (`encoding`, `digest`, `length`, `encoded_length`, `revpos`,
//! `content_type`) match each other and the source, and whose bytes read back the same — also
//! after the server's attachment compression is switched off (`compression_level = 0`), when a
//! copy re-encoded on the way would be stored plain. On the wire, gzip-encoded attachments go
//! to the target gzip-encoded in `multipart/related` PUTs, never base64 inline.

use std::collections::BTreeMap;

use crate::support::couch::Couch;
use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::proxy::FaultProxy;
use crate::support::server::PouchServer;
use couch_replicator::replication::{Context, ReplicationSpec, replicate};
use serde_json::{Value, json};

/// Stub fields that must survive replication unchanged.
const STUB_FIELDS: [&str; 6] = [
    "encoding",
    "digest",
    "length",
    "encoded_length",
    "revpos",
    "content_type",
];

/// Compressible text of about `len` bytes, different for each `seed`.
fn text(seed: usize, len: usize) -> Vec<u8> {
    let mut s = String::with_capacity(len + 64);
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!(
            "line {i} of document {seed}: the quick brown fox\n"
        ));
        i += 1;
    }
    s.into_bytes()
}

struct Db<'a> {
    peer: &'a CouchPeer,
    http: reqwest::Client,
}

impl Db<'_> {
    /// `PUT db/id/name?rev=` with `data`: the new revision.
    async fn put_att(
        &self,
        db: &str,
        id: &str,
        rev: &str,
        name: &str,
        ctype: &str,
        data: Vec<u8>,
    ) -> String {
        let r = self
            .http
            .put(format!("{}/{db}/{id}/{name}?rev={rev}", self.peer.url()))
            .basic_auth("admin", Some("admin"))
            .header("content-type", ctype)
            .body(data)
            .send()
            .await
            .expect("PUT attachment");
        assert_eq!(r.status().as_u16(), 201, "PUT {id}/{name}");
        let v: Value = r.json().await.expect("JSON");
        v["rev"].as_str().expect("rev").to_owned()
    }

    async fn put_doc(&self, c: &Couch, db: &str, id: &str, body: Value) -> String {
        let (s, v) = c.put_doc(db, id, &body).await;
        assert_eq!(s, 201, "PUT {id}: {v}");
        v["rev"].as_str().expect("rev").to_owned()
    }

    /// `POST /_replicate` on CouchDB (its own replicator), one-shot.
    async fn couch_replicate(&self, src: &str, tgt: &str) {
        let body = json!({
            "source": format!("{}/{src}", self.peer.admin_url()),
            "target": format!("{}/{tgt}", self.peer.admin_url()),
            "create_target": true,
        });
        let r = deadline(180, "CouchDB's _replicate", async {
            self.http
                .post(format!("{}/_replicate", self.peer.url()))
                .basic_auth("admin", Some("admin"))
                .json(&body)
                .send()
                .await
                .expect("_replicate")
        })
        .await;
        let status = r.status();
        let v: Value = r.json().await.expect("JSON reply");
        assert!(status.is_success(), "CouchDB _replicate: {status} {v}");
    }

    async fn set_compression(&self, level: &str) {
        let r = self
            .http
            .put(format!(
                "{}/_node/_local/_config/attachments/compression_level",
                self.peer.url()
            ))
            .basic_auth("admin", Some("admin"))
            .json(&json!(level))
            .send()
            .await
            .expect("PUT config");
        assert!(r.status().is_success(), "config: {}", r.status());
    }
}

/// Fills `src`: several documents with a compressible text attachment, one with JSON and
/// text, one with a binary (not compressed) attachment, one without attachments, one whose
/// attachments came in two revisions (different `revpos`), and one with a text attachment
/// too large for the bulk path (fetched alone).
async fn fill(db: &Db<'_>, c: &Couch, src: &str) {
    c.create_db(src).await;
    for i in 0..6 {
        let rev = db.put_doc(c, src, &format!("t{i}"), json!({"i": i})).await;
        db.put_att(
            src,
            &format!("t{i}"),
            &rev,
            "notes.txt",
            "text/plain",
            text(i, 6000),
        )
        .await;
    }
    let rev = db.put_doc(c, src, "j", json!({"kind": "json"})).await;
    let body = serde_json::to_vec(&json!({"rows": (0..200).collect::<Vec<_>>()})).expect("json");
    let rev = db
        .put_att(src, "j", &rev, "data.json", "application/json", body)
        .await;
    db.put_att(src, "j", &rev, "readme.txt", "text/plain", text(99, 3000))
        .await;
    let rev = db.put_doc(c, src, "bin", json!({"kind": "binary"})).await;
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    db.put_att(src, "bin", &rev, "pic.png", "image/png", noise)
        .await;
    db.put_doc(c, src, "plain", json!({"no": "attachments"}))
        .await;
    let rev = db.put_doc(c, src, "two-revs", json!({"k": 1})).await;
    let rev = db
        .put_att(src, "two-revs", &rev, "a.txt", "text/plain", text(7, 2000))
        .await;
    db.put_att(src, "two-revs", &rev, "b.txt", "text/plain", text(8, 2000))
        .await;
    let rev = db.put_doc(c, src, "big", json!({"k": "big"})).await;
    db.put_att(
        src,
        "big",
        &rev,
        "big.txt",
        "text/plain",
        text(42, 300 * 1024),
    )
    .await;
}

/// Every document's `_rev` and attachment stub fields (with `att_encoding_info`).
async fn stubs(c: &Couch, db: &str) -> BTreeMap<String, Value> {
    let (s, all) = c.get_doc(db, "_all_docs").await;
    assert_eq!(s, 200, "{db}/_all_docs: {all}");
    let mut out = BTreeMap::new();
    for row in all["rows"].as_array().expect("rows") {
        let id = row["id"].as_str().expect("id");
        let (s, doc) = c.get_doc(db, &format!("{id}?att_encoding_info=true")).await;
        assert_eq!(s, 200, "{db}/{id}");
        let mut atts = serde_json::Map::new();
        for (name, stub) in doc["_attachments"].as_object().into_iter().flatten() {
            let kept: serde_json::Map<String, Value> = STUB_FIELDS
                .iter()
                .filter_map(|f| stub.get(*f).map(|v| ((*f).to_owned(), v.clone())))
                .collect();
            atts.insert(name.clone(), Value::Object(kept));
        }
        out.insert(id.to_owned(), json!({"rev": doc["_rev"], "atts": atts}));
    }
    out
}

/// Every attachment's bytes, read back.
async fn bodies(c: &Couch, db: &str, stubs: &BTreeMap<String, Value>) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for (id, v) in stubs {
        for name in v["atts"].as_object().expect("atts").keys() {
            out.insert(format!("{id}/{name}"), c.attachment(db, id, name).await);
        }
    }
    out
}

/// Ours, one-shot, from `src` to `tgt`, both through `proxy`.
async fn ours(proxy: &FaultProxy, src: &str, tgt: &str) {
    let with_admin = |u: String| u.replacen("http://", "http://admin:admin@", 1);
    let spec = ReplicationSpec::from_json(&json!({
        "source": with_admin(proxy.db_url(src)),
        "target": with_admin(proxy.db_url(tgt)),
        "create_target": true,
    }))
    .expect("spec");
    let stats = deadline(180, "our replication", replicate(spec, Context::default()))
        .await
        .expect("our replication");
    assert_eq!(stats.doc_write_failures, 0, "{stats:?}");
}

/// Compares CouchDB's copy and ours with the source: stubs and bytes.
async fn compare(c: &Couch, src: &str, theirs: &str, mine: &str) {
    let s = stubs(c, src).await;
    let t = stubs(c, theirs).await;
    let m = stubs(c, mine).await;
    assert_eq!(s.len(), 11, "source docs: {s:?}");
    assert_eq!(
        t, s,
        "CouchDB's replicator's target differs from the source"
    );
    assert_eq!(m, t, "our target differs from CouchDB's replicator's");
    let gz = s
        .values()
        .flat_map(|d| d["atts"].as_object().into_iter().flatten())
        .filter(|(_, a)| a["encoding"] == "gzip")
        .count();
    assert!(
        gz >= 10,
        "the source should hold gzip-encoded attachments: {s:?}"
    );
    let sb = bodies(c, src, &s).await;
    assert_eq!(bodies(c, theirs, &s).await, sb, "CouchDB's copy's bytes");
    assert_eq!(bodies(c, mine, &s).await, sb, "our copy's bytes");
}

/// What crossed the wire for our replication: attachments of the bulk path asked for as
/// stored, written gzip-encoded with `multipart/related` PUTs, none inline in `_bulk_docs`.
fn assert_wire(proxy: &FaultProxy, tgt: &str) {
    let log = proxy.log();
    assert!(
        log.iter()
            .any(|r| r.path.contains("_bulk_get") && r.path.contains("att_encoding_info=true")),
        "no multipart _bulk_get with att_encoding_info"
    );
    assert!(
        log.iter()
            .any(|r| r.path.contains("open_revs") && r.path.contains("att_encoding_info=true")),
        "the large attachment was not fetched with att_encoding_info"
    );
    let puts: Vec<_> = log
        .iter()
        .filter(|r| r.method == "PUT" && r.path.starts_with(&format!("/{tgt}/")))
        .filter(|r| r.path.contains("new_edits=false"))
        .collect();
    let gzip_puts = puts
        .iter()
        .filter(|r| {
            let b = String::from_utf8_lossy(&r.body).to_ascii_lowercase();
            b.contains("\"encoding\":\"gzip\"") && b.contains("content-encoding: gzip")
        })
        .count();
    assert!(
        gzip_puts >= 9,
        "{gzip_puts} of {} PUTs carried gzip parts",
        puts.len()
    );
    for r in log.iter().filter(|r| r.path.contains("_bulk_docs")) {
        let b = String::from_utf8_lossy(&r.body);
        assert!(
            !b.contains("\"data\""),
            "inline attachment in _bulk_docs: {b:.300}"
        );
    }
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_keep_encoding_digest_and_lengths_like_couchdb() {
    let test = "attachments_keep_encoding_digest_and_lengths_like_couchdb";
    let Some(peer) = CouchPeer::start(test, None) else {
        return;
    };
    peer.warm_up_sessions().await;
    let c = Couch::new(&peer.admin_url());
    let db = Db {
        peer: &peer,
        http: reqwest::Client::new(),
    };
    fill(&db, &c, "src").await;
    let proxy = FaultProxy::start(&format!("{}/", peer.url())).await;

    db.couch_replicate("src", "theirs").await;
    ours(&proxy, "src", "mine").await;
    compare(&c, "src", "theirs", "mine").await;
    assert_wire(&proxy, "mine");

    // Later revisions adding an attachment: the targets have the earlier ones, so only the
    // new attachment needs to travel (`atts_since`); the result must still match.
    for id in ["t0", "t1"] {
        let (_, doc) = c.get_doc("src", id).await;
        let rev = doc["_rev"].as_str().expect("rev");
        db.put_att("src", id, rev, "more.txt", "text/plain", text(500, 5000))
            .await;
    }
    db.couch_replicate("src", "theirs").await;
    ours(&proxy, "src", "mine").await;
    compare(&c, "src", "theirs", "mine").await;
    let since = proxy
        .log()
        .into_iter()
        .filter(|r| r.path.contains("att_encoding_info=true") && r.path.contains("_bulk_get"))
        .any(|r| String::from_utf8_lossy(&r.body).contains("atts_since"));
    let trail: Vec<String> = proxy
        .log()
        .iter()
        .filter(|r| r.path.contains("_bulk_get") || r.path.contains("_revs_diff"))
        .map(|r| format!("{} {}", r.path, String::from_utf8_lossy(&r.body)))
        .collect();
    assert!(
        since,
        "the bulk fetch of updated documents did not send atts_since: {trail:#?}"
    );

    // The source stays as written (compressed); new copies must not be re-encoded.
    db.set_compression("0").await;
    db.couch_replicate("src", "theirs0").await;
    ours(&proxy, "src", "mine0").await;
    compare(&c, "src", "theirs0", "mine0").await;
    assert_wire(&proxy, "mine0");
}

/// A CouchDB source into a pouchdb-server target: pouchdb-server would keep gzip bytes sent
/// as an encoded attachment as the attachment's content, so for it attachments travel decoded
/// and read back the same as from the source.
#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pouchdb_target_gets_attachments_decoded() {
    let test = "a_pouchdb_target_gets_attachments_decoded";
    let Some(peer) = CouchPeer::start(test, None) else {
        return;
    };
    peer.warm_up_sessions().await;
    let c = Couch::new(&peer.admin_url());
    let db = Db {
        peer: &peer,
        http: reqwest::Client::new(),
    };
    fill(&db, &c, "src").await;
    let pouch = PouchServer::start().await;
    let spec = ReplicationSpec::from_json(&json!({
        "source": format!("{}/src", peer.admin_url()),
        "target": pouch.db_url("tgt"),
        "create_target": true,
    }))
    .expect("spec");
    let stats = deadline(180, "our replication", replicate(spec, Context::default()))
        .await
        .expect("our replication");
    assert_eq!(stats.doc_write_failures, 0, "{stats:?}");
    let s = stubs(&c, "src").await;
    let p = Couch::new(&pouch.root());
    assert_eq!(bodies(&p, "tgt", &s).await, bodies(&c, "src", &s).await);
    for (id, doc) in &s {
        let (_, got) = p.get_doc("tgt", id).await;
        for (name, stub) in doc["atts"].as_object().expect("atts") {
            assert_eq!(
                got["_attachments"][name]["length"], stub["length"],
                "{id}/{name}"
            );
        }
    }
}
