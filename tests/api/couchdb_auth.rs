//! A node whose authentication CouchDB cannot be reached: its own `[admins]`/`[users]` still
//! work (they are checked first), anonymous callers are still 401, and anyone else gets 503
//! (on the API and on `/_steps`) naming the CouchDB, not 401 (their credentials may be fine)
//! and not 500, with no credential in the reply.

use std::sync::Arc;

use serde_json::Value;

use crate::support::http::{ADMIN, BOB, Node};
use crate::support::server::free_port;
use couch_replicator::http::HttpConfig;
use couch_replicator::http::auth::Users;
use couch_replicator::http::couchdb_auth::{CouchDbAuth, CouchDbAuthSettings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_couchdb_is_503_and_local_users_still_work() {
    // A port nothing listens on.
    let url = format!("http://127.0.0.1:{}", free_port());
    let auth = CouchDbAuth::new(CouchDbAuthSettings::new(&url).unwrap()).unwrap();
    let cfg = HttpConfig {
        users: Users::default().with_couchdb(Arc::new(auth)),
        ..HttpConfig::default()
    };
    let node = Node::with_steps(cfg).await;
    let (s, _) = node.get("/_scheduler/jobs", Some(ADMIN)).await;
    assert_eq!(s, 200, "a configured admin");
    let (s, _) = node.get("/_active_tasks", Some(BOB)).await;
    assert_eq!(s, 200, "a configured user");
    let (s, _) = node.get("/_scheduler/jobs", None).await;
    assert_eq!(s, 401, "anonymous");
    let (s, e) = node
        .get("/_scheduler/jobs", Some(("alice", "alice-s3cret")))
        .await;
    assert_eq!(s, 503, "{e}");
    assert_eq!(e["error"], "service_unavailable");
    let reason = e["reason"].as_str().unwrap();
    assert!(
        reason.contains(&url) && !reason.contains("s3cret"),
        "{reason}"
    );
    // The steps routes' admin check asks too.
    let (s, e) = node.get("/_steps", Some(("alice", "alice-s3cret"))).await;
    assert_eq!(s, 503, "{e}");
    let (s, e) = node.get("/_steps", Some(ADMIN)).await;
    assert_eq!(s, 200, "{e}");
    // A cookie this node did not issue is asked about too.
    let r = node
        .client
        .get(format!("{}/_session", node.base))
        .header("cookie", "AuthSession=YWxpY2U6NkIwODNCNzk6eHh4eA")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    // So is a login of a name this node does not know.
    let (s, e): (u16, Value) = node
        .post(
            "/_session",
            None,
            r#"{"name": "alice", "password": "alice-s3cret"}"#,
        )
        .await;
    assert_eq!(s, 503, "{e}");
    assert!(!e.to_string().contains("s3cret"));
}
