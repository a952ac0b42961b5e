//! A large attachment replicates CouchDB -> CouchDB through a real `serve` process whose memory
//! stays within 64 MiB of idle: the attachment streams from the source's multipart `open_revs`
//! answer into the target's `PUT` without being held, and arrives with its digest and length.
//! 128 MiB in CI (CouchDB writes about 10 MB/s on the CI machine, so the copy takes far longer
//! than the node's `connection_timeout` of 5 s: the upload must not be cut by an idle read
//! side). For CouchDB's `max_attachment_size`, `BIG_ATTACHMENT_MIB=1024` with plain
//! `cargo test --test compat big_attachment` (nextest stops it after 8 minutes).

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::serve::spawn_serve;

/// The attachment's size: `BIG_ATTACHMENT_MIB`, 128 MiB by default.
fn size() -> u64 {
    let mib = std::env::var("BIG_ATTACHMENT_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(128);
    mib << 20
}
const CHUNK: usize = 1 << 20;

/// The most the node's RSS may grow over idle while it copies the attachment.
const RSS_BUDGET_KIB: u64 = 64 << 10;

/// `len` bytes that do not compress, generated as they are sent.
fn noise(len: u64) -> reqwest::Body {
    let chunks = len.div_ceil(CHUNK as u64);
    let stream = futures::stream::unfold(
        (0u64, 0x2545_f491_4f6c_dd1du64),
        move |(i, mut x)| async move {
            if i == chunks {
                return None;
            }
            let n = CHUNK.min((len - i * CHUNK as u64) as usize);
            let mut buf = Vec::with_capacity(n);
            while buf.len() < n {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.extend_from_slice(&x.to_le_bytes());
            }
            buf.truncate(n);
            Some((Ok::<Bytes, std::io::Error>(Bytes::from(buf)), (i + 1, x)))
        },
    );
    reqwest::Body::wrap_stream(stream)
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_attachment_streams_through_the_node_in_bounded_memory() {
    let test = "a_large_attachment_streams_through_the_node_in_bounded_memory";
    let len = size();
    let Some(peer) = CouchPeer::start(test, None) else {
        return;
    };
    peer.warm_up_sessions().await;
    let http = reqwest::Client::new();
    let admin = |path: &str| format!("{}/{path}", peer.url());
    let call = |m: reqwest::Method, path: &str| {
        http.request(m, admin(path))
            .basic_auth("admin", Some("admin"))
            .timeout(Duration::from_secs(600))
    };
    for db in ["src", "small"] {
        let r = call(reqwest::Method::PUT, db).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 201, "PUT /{db}");
    }
    call(reqwest::Method::PUT, "small/a")
        .json(&json!({"v": 1}))
        .send()
        .await
        .unwrap();
    let r = deadline(600, "uploading the attachment to CouchDB", async {
        call(reqwest::Method::PUT, "src/big/blob.bin")
            .header("content-type", "application/octet-stream")
            .header("content-length", len.to_string())
            .body(noise(len))
            .send()
            .await
            .expect("PUT attachment")
    })
    .await;
    assert_eq!(r.status().as_u16(), 201, "PUT attachment");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.ini");
    // A copy far longer than `connection_timeout`: the upload must not be cut by the idle
    // read side of its connection.
    std::fs::write(
        &cfg,
        "[admins]\nadmin = node-secret\n[replicator]\nconnection_timeout = 5000\n",
    )
    .unwrap();
    let node = spawn_serve(
        &dir.path().join("data"),
        &cfg,
        &[],
        "warn",
        Stdio::inherit(),
    )
    .await;
    let pid = node.child.id().unwrap_or(0);
    let replicate = |src: &str, tgt: &str| {
        let body = json!({
            "source": format!("{}/{src}", peer.admin_url()),
            "target": format!("{}/{tgt}", peer.admin_url()),
            "create_target": true,
        });
        http.post(format!("{}/_replicate", node.base))
            .basic_auth("admin", Some("node-secret"))
            .timeout(Duration::from_secs(900))
            .json(&body)
            .send()
    };
    // Warm: connections, sessions and the job's machinery exist before idle is measured.
    let r = replicate("small", "small-copy").await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = crate::support::proc_status_kib(pid, "VmRSS:");
    assert!(idle > 0, "cannot read the node's RSS");

    let started = std::time::Instant::now();
    let r = deadline(900, "replicating the attachment", replicate("src", "tgt"))
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "{v}");
    let took = started.elapsed();
    let peak = crate::support::proc_status_kib(pid, "VmHWM:");

    let stub = |db: &'static str| {
        let req = call(reqwest::Method::GET, &format!("{db}/big"));
        async move {
            let v: Value = req.send().await.unwrap().json().await.unwrap();
            v["_attachments"]["blob.bin"].clone()
        }
    };
    let (a, b) = tokio::join!(stub("src"), stub("tgt"));
    assert_eq!(a["length"], json!(len), "{a}");
    for field in ["digest", "length", "content_type"] {
        assert_eq!(a[field], b[field], "{field}: source {a}, target {b}");
    }
    eprintln!(
        "{} MiB copied in {:.1} s; node idle {idle} KiB, peak {peak} KiB",
        len >> 20,
        took.as_secs_f64()
    );
    assert!(
        peak.saturating_sub(idle) <= RSS_BUDGET_KIB,
        "the node grew from {idle} KiB idle to a peak of {peak} KiB"
    );
}
