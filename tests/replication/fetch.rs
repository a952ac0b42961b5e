//! How revisions are fetched and written: design documents one by one (a rejection counted
//! for that document alone), the adaptive `_bulk_get` (one failure does not turn it off),
//! and the retry of a revision the source first reports missing.

use std::time::Duration;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::deadline;
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::server::PouchServer;
use axum::http::Method;
use bytes::Bytes;
use couch_replicator::replication::{Context, Endpoint, ReplicationSpec, replicate};
use serde_json::json;

fn spec(p: &FaultProxy) -> ReplicationSpec {
    ReplicationSpec::new(
        Endpoint::parse(&p.db_url("src")).unwrap(),
        Endpoint::parse(&p.db_url("tgt")).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn design_docs_go_one_by_one() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("n", 20)).await;
    for name in ["one", "two"] {
        let (st, v) = c
            .put_doc(
                "src",
                &format!("_design/{name}"),
                &json!({"views": {}, "name": name}),
            )
            .await;
        assert_eq!(st, 201, "{v}");
    }
    let p = FaultProxy::start(&a.root()).await;
    // The target refuses the second design doc (as a validation function would).
    p.add(Rule::new(
        Some(Method::PUT),
        "/tgt/_design/two",
        1,
        Fault::Status(403),
    ));
    let stats = deadline(
        30,
        "replication with design docs",
        replicate(spec(&p), Context::default()),
    )
    .await
    .unwrap();
    assert_eq!(
        (stats.docs_written, stats.doc_write_failures),
        (21, 1),
        "{stats:?}"
    );
    for r in p
        .requests_to("/_bulk_get")
        .iter()
        .chain(&p.requests_to("/tgt/_bulk_docs"))
    {
        let body = String::from_utf8_lossy(&r.body);
        assert!(
            !body.contains("_design/"),
            "design doc in a bulk request: {}",
            r.path
        );
    }
    let puts: Vec<String> = p
        .log()
        .into_iter()
        .filter(|r| r.method == Method::PUT && r.path.starts_with("/tgt/_design/"))
        .map(|r| r.path)
        .collect();
    assert_eq!(puts.len(), 2, "{puts:?}");
    assert!(
        puts.iter().all(|p| p.contains("new_edits=false")),
        "{puts:?}"
    );
    let (st, _) = c.get_doc("tgt", "_design/one").await;
    assert_eq!(st, 200);
    let (st, _) = c.get_doc("tgt", "_design/two").await;
    assert_eq!(st, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bulk_get_failure_does_not_disable_it() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("b", 400)).await;
    let p = FaultProxy::start(&a.root()).await;
    p.add(Rule::new(
        Some(Method::POST),
        "/src/_bulk_get",
        1,
        Fault::Status(400),
    ));
    let mut s = spec(&p);
    s.options.worker_processes = 1;
    s.options.worker_batch_size = 50;
    let stats = deadline(45, "replication", replicate(s, Context::default()))
        .await
        .unwrap();
    assert_eq!(stats.docs_written, 400, "{stats:?}");
    // The first batch of 50 came one by one; the gate's average (0.25) stays under 0.5.
    assert_eq!(stats.bulk_get_docs, 350, "{stats:?}");
    assert_eq!(p.requests_to("open_revs=").len(), 50);
    c.assert_same("src", &c, "tgt").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_reported_missing_is_fetched_again() {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("m", 3)).await;
    let p = FaultProxy::start(&a.root()).await;
    let missing = Bytes::from(r#"[{"missing":"1-0"}]"#);
    p.add(Rule::new(
        Some(Method::GET),
        "/src/m00001?",
        1,
        Fault::Respond(200, "application/json".into(), missing),
    ));
    let mut s = spec(&p);
    s.options.use_bulk_get = false;
    s.options.missing_doc_retry = Duration::from_millis(300);
    let stats = deadline(30, "replication", replicate(s, Context::default()))
        .await
        .unwrap();
    assert_eq!(p.fired(), vec![1]);
    assert_eq!(p.requests_to("/src/m00001?").len(), 2, "fetched again");
    assert_eq!(
        (stats.docs_written, stats.doc_write_failures),
        (3, 0),
        "{stats:?}"
    );
    c.assert_same("src", &c, "tgt").await;
}
