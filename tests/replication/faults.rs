//! Faults a real server cannot produce on demand, injected by the test proxy between the
//! replicator and a real pouchdb-server: 429 bursts, 413 (the batch is split), 5xx bursts
//! and exhaustion, connections reset mid-body, truncated bodies, stalls; and credentials
//! (URL userinfo, `Authorization` header) never showing in errors.

use std::time::Duration;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::deadline;
use crate::support::proxy::{Fault, FaultProxy, Rule};
use crate::support::server::PouchServer;
use axum::http::Method;
use base64::Engine as _;
use couch_replicator::replication::{
    Context, Endpoint, ErrorClass, ReplicationError, ReplicationSpec, ReplicationStats, replicate,
};
use serde_json::{Value, json};

/// A server with `src` (200 docs) and an empty `tgt`, and a proxy in front of it.
async fn setup() -> (PouchServer, Couch, FaultProxy) {
    let a = PouchServer::start().await;
    let c = Couch::new(&a.root());
    c.create_db("src").await;
    c.create_db("tgt").await;
    c.bulk_insert("src", &numbered_docs("f", 200)).await;
    let p = FaultProxy::start(&a.root()).await;
    (a, c, p)
}

/// Source and target both through the proxy, one worker, one batch of 200.
fn spec(p: &FaultProxy) -> ReplicationSpec {
    let mut s = ReplicationSpec::new(
        Endpoint::parse(&p.db_url("src")).unwrap(),
        Endpoint::parse(&p.db_url("tgt")).unwrap(),
    );
    s.options.worker_processes = 1;
    s.options.worker_batch_size = 200;
    s.options.connection_timeout = Duration::from_secs(2);
    s
}

async fn run_ok(s: ReplicationSpec, c: &Couch, what: &str) -> ReplicationStats {
    let stats = deadline(45, what, replicate(s, Context::default()))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(stats.docs_written, 200, "{what}: {stats:?}");
    assert_eq!(stats.doc_write_failures, 0, "{what}: {stats:?}");
    c.assert_same("src", c, "tgt").await;
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_requests_is_waited_out() {
    let (_a, c, p) = setup().await;
    p.add(Rule::new(
        Some(Method::POST),
        "/src/_bulk_get",
        4,
        Fault::Status(429),
    ));
    p.add(Rule::new(
        Some(Method::POST),
        "/tgt/_bulk_docs",
        3,
        Fault::Status(429),
    ));
    run_ok(spec(&p), &c, "replication through 429s").await;
    assert_eq!(p.fired(), vec![4, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_too_large_splits_the_batch() {
    let (_a, c, p) = setup().await;
    p.add(Rule::new(
        Some(Method::POST),
        "/tgt/_bulk_docs",
        1,
        Fault::Status(413),
    ));
    run_ok(spec(&p), &c, "replication through a 413").await;
    let sizes: Vec<usize> = p
        .requests_to("/tgt/_bulk_docs")
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(v["new_edits"], json!(false));
            v["docs"].as_array().unwrap().len()
        })
        .collect();
    assert_eq!(
        sizes,
        vec![200, 100, 100],
        "the rejected batch is split in halves"
    );
    // The one-shot feed is read in one request, without paging.
    let changes = p.requests_to("/src/_changes");
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(!changes[0].path.contains("limit="), "{}", changes[0].path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_error_bursts_are_retried() {
    let (_a, c, p) = setup().await;
    p.add(Rule::new(
        Some(Method::GET),
        "/src/_changes",
        2,
        Fault::Status(500),
    ));
    p.add(Rule::new(
        Some(Method::POST),
        "/tgt/_revs_diff",
        2,
        Fault::Status(503),
    ));
    p.add(Rule::new(
        Some(Method::POST),
        "/src/_bulk_get",
        1,
        Fault::Status(502),
    ));
    p.add(Rule::new(
        Some(Method::POST),
        "/tgt/_bulk_docs",
        2,
        Fault::Status(500),
    ));
    let stats = run_ok(spec(&p), &c, "replication through 5xx bursts").await;
    assert_eq!(p.fired(), vec![2, 2, 1, 2]);
    // A 502 from _bulk_get is a transient failure, not a reason to stop using it.
    assert_eq!(stats.bulk_get_docs, 200, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_that_do_not_stop_fail_transiently() {
    let (_a, _c, p) = setup().await;
    p.add(Rule::new(
        Some(Method::POST),
        "/tgt/_bulk_docs",
        1000,
        Fault::Status(500),
    ));
    let mut s = spec(&p);
    s.options.retries_per_request = 2;
    let err = deadline(30, "failing replication", replicate(s, Context::default()))
        .await
        .expect_err("500 forever must fail");
    assert!(
        matches!(err, ReplicationError::HttpRequestFailed(_)),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Transient);
    assert!(err.to_string().contains("_bulk_docs"), "{err}");
    assert_eq!(p.fired(), vec![3], "one try and two retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_truncated_responses_are_retried() {
    let (_a, c, p) = setup().await;
    p.add(Rule::new(
        Some(Method::GET),
        "/src/_changes",
        1,
        Fault::ResetMidBody,
    ));
    p.add(Rule::new(
        Some(Method::POST),
        "/src/_bulk_get",
        1,
        Fault::Truncate,
    ));
    p.add(Rule::new(
        Some(Method::POST),
        "/tgt/_bulk_docs",
        1,
        Fault::ResetMidBody,
    ));
    p.add(Rule::new(
        Some(Method::POST),
        "/tgt/_revs_diff",
        1,
        Fault::Truncate,
    ));
    run_ok(spec(&p), &c, "replication through dropped connections").await;
    assert_eq!(p.fired(), vec![1, 1, 1, 1]);
    // The broken feed was read again from where it stood (nothing emitted yet: since=0).
    let changes = p.requests_to("/src/_changes");
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(changes[1].path.contains("since=0"), "{}", changes[1].path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_time_out_and_are_retried() {
    let (_a, c, p) = setup().await;
    p.add(Rule::new(
        Some(Method::POST),
        "/src/_bulk_get",
        1,
        Fault::Stall(Duration::from_secs(5)),
    ));
    p.add(Rule::new(
        Some(Method::GET),
        "/src/_changes",
        1,
        Fault::StallMidBody(Duration::from_secs(5)),
    ));
    let started = std::time::Instant::now();
    run_ok(spec(&p), &c, "replication through stalls").await;
    assert_eq!(p.fired(), vec![1, 1]);
    // At least one 2 s inactivity timeout fired before the retry.
    assert!(started.elapsed() >= Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_show_in_errors() {
    let (_a, c, p) = setup().await;
    let secret = "s3cr3t-pw";
    // A real user, so the server accepts the credentials where no fault is injected.
    let (st, v) = c
        .put_doc(
            "_users",
            "org.couchdb.user:bob",
            &json!({"name": "bob", "password": secret, "roles": [], "type": "user"}),
        )
        .await;
    assert_eq!(st, 201, "creating user bob: {v}");
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("bob:{secret}"));
    let check = |err: &ReplicationError| {
        let shown = format!("{err} | {err:?}");
        assert!(!shown.contains(secret), "password leaked: {shown}");
        assert!(!shown.contains(&b64), "basic header leaked: {shown}");
    };
    let with_url = |db: &str| {
        p.db_url(db)
            .replace("http://", &format!("http://bob:{secret}@"))
    };

    // 401 from the source (credentials in the URL).
    p.add(Rule::new(None, "/src", 1000, Fault::Status(401)));
    let s = ReplicationSpec::new(
        Endpoint::parse(&with_url("src")).unwrap(),
        Endpoint::parse(&p.db_url("tgt")).unwrap(),
    );
    let err = deadline(30, "401 source", replicate(s, Context::default()))
        .await
        .unwrap_err();
    assert!(matches!(err, ReplicationError::Unauthorized(_)), "{err:?}");
    check(&err);
    let sent = p.requests_to("/src");
    assert!(
        sent.iter()
            .any(|r| r.headers.get("authorization").is_some() || r.headers.get("cookie").is_some()),
        "the credentials were used (basic or _session cookie): {:?}",
        p.log()
    );
    p.clear();

    // Missing database, credentials in an Authorization header.
    let src = Endpoint::from_json(&json!({"url": p.db_url("missing"),
        "headers": {"Authorization": format!("Basic {b64}")}}))
    .unwrap();
    let s = ReplicationSpec::new(src, Endpoint::parse(&with_url("tgt")).unwrap());
    let err = deadline(30, "missing source", replicate(s, Context::default()))
        .await
        .unwrap_err();
    // pouchdb-server rejects basic auth for users it does not know before it looks up the db.
    assert!(
        matches!(
            err,
            ReplicationError::DbNotFound(_) | ReplicationError::Unauthorized(_)
        ),
        "{err:?}"
    );
    check(&err);

    // Retries exhausted on the target.
    p.add(Rule::new(
        Some(Method::POST),
        "/tgt/_bulk_docs",
        1000,
        Fault::Status(503),
    ));
    let mut s = ReplicationSpec::new(
        Endpoint::parse(&with_url("src")).unwrap(),
        Endpoint::parse(&with_url("tgt")).unwrap(),
    );
    s.options.retries_per_request = 1;
    let err = deadline(30, "503 target", replicate(s, Context::default()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ReplicationError::HttpRequestFailed(_)),
        "{err:?}"
    );
    check(&err);

    // Nothing listening.
    let closed = crate::support::server::free_port();
    let s = ReplicationSpec::new(
        Endpoint::parse(&format!("http://bob:{secret}@127.0.0.1:{closed}/db")).unwrap(),
        Endpoint::parse(&with_url("tgt")).unwrap(),
    );
    let mut s = s;
    s.options.retries_per_request = 1;
    let err = deadline(30, "closed port", replicate(s, Context::default()))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    check(&err);
}

/// A `_session` cookie the server refuses as soon as it was obtained (as a fresh CouchDB
/// without a `[chttpd_auth] secret` does to one of two logins made at the same moment) is
/// replaced by a new login once, and the replication goes on; a second refusal of a fresh
/// cookie is final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_cookie_refused_once_is_replaced_by_a_new_login() {
    let (_a, c, p) = setup().await;
    create_ann(&c).await;
    let with_user = |db: &str| p.db_url(db).replace("http://", "http://ann:pw@");
    let spec_for_ann = || {
        let mut s = spec(&p);
        s.source = Endpoint::parse(&with_user("src")).unwrap();
        s
    };
    // The first two requests to the source after its login (the database and its
    // checkpoint, read at once while the target is created) are refused with that cookie.
    p.add(Rule::new(Some(Method::GET), "/src", 2, Fault::Status(401)));
    let mut s = spec_for_ann();
    s.options.create_target = true;
    run_ok(s, &c, "a fresh cookie refused once").await;
    assert_eq!(p.fired(), vec![2]);
    let logins = p.requests_to("/_session").len();
    // One login for the source, one more after the refusals (the second request retries
    // with the new cookie; the target has no credentials).
    assert_eq!(logins, 2, "{:?}", p.log());
    p.clear();

    // Refused twice in a row: no login loop, the job fails as unauthorized.
    p.add(Rule::new(Some(Method::GET), "/src", 2, Fault::Status(401)));
    let before = p.requests_to("/_session").len();
    let err = deadline(
        30,
        "twice refused",
        replicate(spec_for_ann(), Context::default()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ReplicationError::Unauthorized(_)), "{err:?}");
    assert_eq!(
        p.requests_to("/_session").len() - before,
        2,
        "{:?}",
        p.log()
    );
}

/// A replication's source and target on one server as one user log in once (CouchDB's
/// replicator logs in per endpoint; two first logins at once on a CouchDB without a cookie
/// secret yet cost one of them a refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_and_target_on_one_server_share_one_login() {
    let (_a, c, p) = setup().await;
    create_ann(&c).await;
    let with_user = |db: &str| p.db_url(db).replace("http://", "http://ann:pw@");
    let mut s = spec(&p);
    s.source = Endpoint::parse(&with_user("src")).unwrap();
    s.target = Endpoint::parse(&with_user("tgt")).unwrap();
    s.options.create_target = true;
    let warm = s.options.http_connections.div_ceil(2);
    run_ok(s, &c, "one login for both").await;
    let logins = p.requests_to("/_session");
    assert_eq!(logins.len(), 1, "{:?}", p.log());
    // Connections were opened while the login ran, with `GET /` and no credentials: by the
    // client that logged in, and by the other one if it came while the login was under way.
    let opened: Vec<_> = p.log().into_iter().filter(|r| r.path == "/").collect();
    assert!(
        (warm..=2 * warm).contains(&opened.len()),
        "{} connections opened ahead, expected {warm}..={}",
        opened.len(),
        2 * warm
    );
    assert!(
        opened
            .iter()
            .all(|r| r.method == Method::GET && r.headers.get("authorization").is_none()),
        "{opened:?}"
    );
    // Both sides used that session.
    for side in ["/src", "/tgt"] {
        assert!(
            p.requests_to(side)
                .iter()
                .all(|r| r.headers.get("cookie").is_some()),
            "{side} without the session cookie"
        );
    }
}

/// User `ann` (password `pw`) on the server.
async fn create_ann(c: &Couch) {
    let (st, v) = c
        .put_doc(
            "_users",
            "org.couchdb.user:ann",
            &json!({"name": "ann", "password": "pw", "roles": [], "type": "user"}),
        )
        .await;
    assert_eq!(st, 201, "creating user ann: {v}");
}
