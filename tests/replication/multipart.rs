//! The multipart paths. pouchdb-server never answers `multipart/mixed`, so the source side of
//! this test is a recorded CouchDB-style body served by the test proxy for the document's
//! `open_revs` GET (built from the real revision on the source); the target side is real:
//! the replicator writes the document with `PUT ?new_edits=false` as `multipart/related`
//! (checked on the wire) and pouchdb-server stores it.

use crate::support::couch::Couch;
use crate::support::deadline;
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::server::PouchServer;
use axum::http::Method;
use base64::Engine as _;
use bytes::Bytes;
use couch_replicator::replication::{Context, Endpoint, ReplicationSpec, replicate};
use serde_json::{Value, json};

/// A `multipart/mixed` `open_revs` answer: one `multipart/related` part holding `doc` (whose
/// stubs become `follows`) and the attachment bodies, plus a `missing` JSON part.
fn recorded_mixed(doc: &Value, atts: &[(&str, &[u8])]) -> (String, Bytes, Vec<u8>) {
    let mut doc = doc.clone();
    for a in doc["_attachments"].as_object_mut().unwrap().values_mut() {
        let o = a.as_object_mut().unwrap();
        o.remove("stub");
        o.insert("follows".into(), json!(true));
    }
    let mut related = Vec::new();
    related.extend_from_slice(b"--inner\r\nContent-Type: application/json\r\n\r\n");
    related.extend_from_slice(doc.to_string().as_bytes());
    for (name, data) in atts {
        related.extend_from_slice(
            format!(
                "\r\n--inner\r\nContent-Disposition: attachment; filename=\"{name}\"\r\n\
                 Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
                data.len()
            )
            .as_bytes(),
        );
        related.extend_from_slice(data);
    }
    related.extend_from_slice(b"\r\n--inner--");
    let mut body = Vec::new();
    body.extend_from_slice(
        b"--outer\r\nContent-Type: multipart/related; boundary=\"inner\"\r\n\r\n",
    );
    body.extend_from_slice(&related);
    let related_part = related.clone();
    body.extend_from_slice(
        b"\r\n--outer\r\nContent-Type: application/json; error=\"true\"\r\n\r\n{\"missing\":\"9-zzz\"}",
    );
    body.extend_from_slice(b"\r\n--outer--");
    (
        "multipart/mixed; boundary=\"outer\"".to_owned(),
        Bytes::from(body),
        related_part,
    )
}

struct Setup {
    _server: PouchServer,
    c: Couch,
    p: FaultProxy,
    data: Vec<u8>,
    small: Vec<u8>,
    ctype: String,
    body: Bytes,
    related: Vec<u8>,
}

async fn setup() -> Setup {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let small = b"tiny text attachment".to_vec();
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    c.bulk_insert(
        "src",
        &[json!({"_id": "m1", "v": 1, "_attachments": {
            "a.bin": {"content_type": "application/octet-stream", "data": b64(&data)},
            "b.txt": {"content_type": "application/octet-stream", "data": b64(&small)}}})],
    )
    .await;
    let (st, doc) = c.get_doc("src", "m1?revs=true").await;
    assert_eq!(st, 200, "{doc}");
    let (ctype, body, related) = recorded_mixed(&doc, &[("a.bin", &data), ("b.txt", &small)]);
    let p = FaultProxy::start(&a.root()).await;
    Setup {
        _server: a,
        c,
        p,
        data,
        small,
        ctype,
        body,
        related,
    }
}

fn spec(p: &FaultProxy) -> ReplicationSpec {
    ReplicationSpec::new(
        Endpoint::parse(&p.db_url("src")).unwrap(),
        Endpoint::parse(&p.db_url("tgt")).unwrap(),
    )
}

fn multipart_puts(p: &FaultProxy) -> Vec<crate::support::proxy::Seen> {
    p.log()
        .into_iter()
        .filter(|r| r.method == Method::PUT && r.path.starts_with("/tgt/m1"))
        .collect()
}

async fn check_target(t: &Setup) {
    t.c.assert_same("src", &t.c, "tgt").await;
    assert_eq!(t.c.attachment("tgt", "m1", "a.bin").await, t.data);
    assert_eq!(t.c.attachment("tgt", "m1", "b.txt").await, t.small);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_fetch_streams_into_the_write() {
    let t = setup().await;
    let p = &t.p;
    p.add(Rule::new(
        Some(Method::GET),
        "/src/m1?",
        1,
        Fault::Respond(200, t.ctype.clone(), t.body.clone()),
    ));
    let stats = deadline(
        30,
        "multipart replication",
        replicate(spec(p), Context::default()),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        p.fired(),
        vec![1],
        "the open_revs GET was served the recorded body"
    );
    let get = &p.requests_to("/src/m1?")[0];
    assert!(get.path.contains("open_revs="), "{}", get.path);
    assert_eq!(
        get.headers.get("accept").unwrap().to_str().unwrap(),
        "multipart/mixed"
    );
    assert_eq!(
        (stats.docs_written, stats.doc_write_failures),
        (1, 0),
        "{stats:?}"
    );
    let puts = multipart_puts(p);
    assert_eq!(puts.len(), 1, "one multipart PUT");
    assert!(puts[0].path.contains("new_edits=false"), "{}", puts[0].path);
    let ct = puts[0]
        .headers
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(ct.starts_with("multipart/related"), "{ct}");
    // Streamed, framed anew with a length (CouchDB reads chunked bodies whole): the declared
    // length is the body's, and the attachment bytes are there as they were.
    let declared = puts[0]
        .headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(declared, Some(puts[0].body.len().to_string()));
    let body = puts[0].body.as_ref();
    assert!(body.windows(t.data.len()).any(|w| w == t.data.as_slice()));
    assert!(
        t.related.len() > t.data.len(),
        "the recorded part holds the attachment"
    );
    check_target(&t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_streamed_write_falls_back_to_a_buffered_one() {
    let t = setup().await;
    let p = &t.p;
    p.add(Rule::new(
        Some(Method::GET),
        "/src/m1?",
        2,
        Fault::Respond(200, t.ctype.clone(), t.body.clone()),
    ));
    p.add(Rule::new(
        Some(Method::PUT),
        "/tgt/m1",
        1,
        Fault::Status(500),
    ));
    let stats = deadline(
        30,
        "multipart replication",
        replicate(spec(p), Context::default()),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.fired(), vec![2, 1]);
    assert_eq!(
        (stats.docs_written, stats.doc_write_failures),
        (1, 0),
        "{stats:?}"
    );
    let puts = multipart_puts(p);
    assert_eq!(puts.len(), 2, "the streamed PUT, then the buffered one");
    let ct = puts[1]
        .headers
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(ct.starts_with("multipart/related"), "{ct}");
    check_target(&t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_stub_refetches_the_revision_in_full() {
    let t = setup().await;
    let p = &t.p;
    p.add(Rule::new(
        Some(Method::GET),
        "/src/m1?",
        2,
        Fault::Respond(200, t.ctype.clone(), t.body.clone()),
    ));
    let stub = Bytes::from(r#"{"error":"missing_stub","reason":"no attachment a.bin"}"#);
    p.add(Rule::new(
        Some(Method::PUT),
        "/tgt/m1",
        1,
        Fault::Respond(412, "application/json".into(), stub),
    ));
    let mut s = spec(p);
    s.options.missing_doc_retry = std::time::Duration::from_millis(200);
    let stats = deadline(
        30,
        "multipart replication",
        replicate(s, Context::default()),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.fired(), vec![2, 1]);
    let gets = p.requests_to("/src/m1?");
    assert!(!gets[1].path.contains("atts_since"), "{}", gets[1].path);
    assert_eq!(
        (stats.docs_written, stats.doc_write_failures),
        (1, 0),
        "{stats:?}"
    );
    assert_eq!(multipart_puts(p).len(), 2);
    check_target(&t).await;
}
