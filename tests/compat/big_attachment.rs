//! Large attachments replicate from CouchDB through a real `serve` process whose memory stays
//! within 64 MiB of idle:
//! - CouchDB -> CouchDB: the attachment streams from the source's multipart `open_revs`
//!   answer into the target's `PUT` (re-framed with a `Content-Length`) without being held,
//!   and arrives with its digest and length. 128 MiB in CI (`BIG_ATTACHMENT_MIB`; 1024 for
//!   CouchDB's `max_attachment_size`, with plain `cargo test --test compat big_attachment`).
//! - CouchDB -> pouchdb-server: a 100 MiB text attachment, which CouchDB stores gzip-encoded,
//!   is inflated on the way (pouchdb-server knows no encodings) and arrives byte for byte.
//!
//! The node's `connection_timeout` is 5 s, far shorter than either copy: an upload must not be
//! cut by the idle read side of its connection.

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use md5::{Digest, Md5};
use serde_json::{Value, json};

use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::generated::generated;
use crate::support::serve::{ServeProcess, spawn_serve};
use crate::support::server::PouchServer;

/// The attachment's size: `BIG_ATTACHMENT_MIB`, 128 MiB by default.
fn size() -> u64 {
    let mib = std::env::var("BIG_ATTACHMENT_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(128);
    mib << 20
}

/// The most the node's RSS may grow over idle while it copies the attachment.
const RSS_BUDGET_KIB: u64 = 64 << 10;

/// A CouchDB holding `src/big` (one attachment) and `small/a`, and a `serve` node, warmed up,
/// with its idle RSS.
struct Rig {
    peer: CouchPeer,
    node: ServeProcess,
    http: reqwest::Client,
    idle_kib: u64,
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn start(test: &str, len: u64, ctype: &str, hex: bool) -> Option<Rig> {
        let peer = CouchPeer::start(test, None)?;
        peer.warm_up_sessions().await;
        let http = reqwest::Client::new();
        for db in ["src", "small"] {
            let r = admin(&http, &peer, reqwest::Method::PUT, db)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 201, "PUT /{db}");
        }
        admin(&http, &peer, reqwest::Method::PUT, "small/a")
            .json(&json!({"v": 1}))
            .send()
            .await
            .unwrap();
        let r = deadline(600, "uploading the attachment to CouchDB", async {
            admin(&http, &peer, reqwest::Method::PUT, "src/big/blob")
                .header("content-type", ctype)
                .header("content-length", len.to_string())
                .body(generated(len, hex))
                .send()
                .await
                .expect("PUT attachment")
        })
        .await;
        assert_eq!(r.status().as_u16(), 201, "PUT attachment");
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("node.ini");
        std::fs::write(
            &cfg,
            "[admins]\nadmin = node-secret\n[replicator]\nconnection_timeout = 5000\n",
        )
        .unwrap();
        let data = dir.path().join("data");
        let node = spawn_serve(&data, &cfg, &[], "warn", Stdio::inherit()).await;
        let mut rig = Rig {
            peer,
            node,
            http,
            idle_kib: 0,
            _dir: dir,
        };
        // Warm: connections, sessions and the job's machinery exist before idle is measured.
        let copy = rig.peer_db("small-copy");
        rig.replicate(&rig.peer_db("small"), &copy).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        rig.idle_kib = crate::support::proc_status_kib(rig.pid(), "VmRSS:");
        assert!(rig.idle_kib > 0, "cannot read the node's RSS");
        Some(rig)
    }

    fn pid(&self) -> u32 {
        self.node.child.id().unwrap_or(0)
    }

    fn peer_db(&self, db: &str) -> String {
        format!("{}/{db}", self.peer.admin_url())
    }

    /// A one-shot `_replicate` through the node; asserts it completed.
    async fn replicate(&self, source: &str, target: &str) {
        let body = json!({"source": source, "target": target, "create_target": true});
        let r = deadline(
            900,
            "replicating",
            self.http
                .post(format!("{}/_replicate", self.node.base))
                .basic_auth("admin", Some("node-secret"))
                .timeout(Duration::from_secs(900))
                .json(&body)
                .send(),
        )
        .await
        .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 200, "{v}");
    }

    /// Asserts the node's peak RSS stayed within the budget over idle.
    fn assert_bounded(&self, what: &str) {
        let peak = crate::support::proc_status_kib(self.pid(), "VmHWM:");
        eprintln!("{what}: node idle {} KiB, peak {peak} KiB", self.idle_kib);
        assert!(
            peak.saturating_sub(self.idle_kib) <= RSS_BUDGET_KIB,
            "the node grew from {} KiB idle to a peak of {peak} KiB",
            self.idle_kib
        );
    }
}

fn admin(
    http: &reqwest::Client,
    peer: &CouchPeer,
    m: reqwest::Method,
    path: &str,
) -> reqwest::RequestBuilder {
    http.request(m, format!("{}/{path}", peer.url()))
        .basic_auth("admin", Some("admin"))
        .timeout(Duration::from_secs(600))
}

/// The md5 and length of the bytes `GET url` answers, read as they arrive.
async fn content_md5(req: reqwest::RequestBuilder) -> (String, u64) {
    let r = req.send().await.expect("GET attachment");
    assert_eq!(r.status().as_u16(), 200);
    let mut body = r.bytes_stream();
    let (mut md5, mut len) = (Md5::new(), 0u64);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.expect("attachment body");
        len += chunk.len() as u64;
        md5.update(&chunk);
    }
    (hex::encode(md5.finalize()), len)
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_attachment_streams_through_the_node_in_bounded_memory() {
    let test = "a_large_attachment_streams_through_the_node_in_bounded_memory";
    let len = size();
    let Some(rig) = Rig::start(test, len, "application/octet-stream", false).await else {
        return;
    };
    let started = std::time::Instant::now();
    rig.replicate(&rig.peer_db("src"), &rig.peer_db("tgt"))
        .await;
    let took = started.elapsed();
    let stub = |db: &'static str| {
        let req = admin(
            &rig.http,
            &rig.peer,
            reqwest::Method::GET,
            &format!("{db}/big"),
        );
        async move {
            let v: Value = req.send().await.unwrap().json().await.unwrap();
            v["_attachments"]["blob"].clone()
        }
    };
    let (a, b) = tokio::join!(stub("src"), stub("tgt"));
    assert_eq!(a["length"], json!(len), "{a}");
    for field in ["digest", "length", "content_type"] {
        assert_eq!(a[field], b[field], "{field}: source {a}, target {b}");
    }
    let what = format!("{} MiB copied in {:.1} s", len >> 20, took.as_secs_f64());
    rig.assert_bounded(&what);
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_stored_attachment_reaches_pouchdb_inflated_in_bounded_memory() {
    let test = "a_gzip_stored_attachment_reaches_pouchdb_inflated_in_bounded_memory";
    let len = 100 << 20;
    let Some(rig) = Rig::start(test, len, "text/plain", true).await else {
        return;
    };
    let stub: Value = admin(
        &rig.http,
        &rig.peer,
        reqwest::Method::GET,
        "src/big?att_encoding_info=true",
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let stub = &stub["_attachments"]["blob"];
    assert_eq!(
        stub["encoding"], "gzip",
        "CouchDB stores text gzip-encoded: {stub}"
    );
    let pouch = PouchServer::start().await;
    let started = std::time::Instant::now();
    rig.replicate(&rig.peer_db("src"), &pouch.db_url("tgt"))
        .await;
    let took = started.elapsed();
    let src = admin(&rig.http, &rig.peer, reqwest::Method::GET, "src/big/blob");
    let tgt = rig
        .http
        .get(format!("{}/big/blob", pouch.db_url("tgt")))
        .timeout(Duration::from_secs(600));
    let (a, b) = tokio::join!(content_md5(src), content_md5(tgt));
    assert_eq!(a.1, len, "the source's attachment");
    assert_eq!(a, b, "the target's attachment differs (md5, length)");
    let what = format!(
        "100 MiB (gzip {} B) to pouchdb in {:.1} s",
        stub["encoded_length"],
        took.as_secs_f64()
    );
    rig.assert_bounded(&what);
}
