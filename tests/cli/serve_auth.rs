//! `serve --auth-couchdb URL` end to end, with a real CouchDB 3.4.3 (`COUCHDB_PEER_SCRIPT`;
//! skipped with a message when unset): the built binary lets that CouchDB's `_users` user in
//! with Basic credentials and with the cookie of a login made through our node's own
//! `POST /_session`, refuses a wrong password, makes CouchDB's admin admin, and, logging at
//! `debug`, writes none of the passwords or cookies it handled.

use std::process::Stdio;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::support::couch::Couch;
use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::serve::spawn_serve;

async fn get(
    base: &str,
    path: &str,
    who: Option<(&str, &str)>,
    cookie: Option<&str>,
) -> (u16, Value) {
    let mut r = reqwest::Client::new().get(format!("{base}{path}"));
    if let Some((n, p)) = who {
        r = r.basic_auth(n, Some(p));
    }
    if let Some(c) = cookie {
        r = r.header("cookie", format!("AuthSession={c}"));
    }
    let resp = r.send().await.unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_lets_couchdb_users_in_and_logs_no_credentials() {
    let Some(peer) = CouchPeer::start("serve --auth-couchdb", None) else {
        return;
    };
    deadline(120, "serve with an authentication CouchDB", async {
        peer.warm_up_sessions().await;
        let couch = Couch::new(&peer.admin_url());
        let user = json!({"name": "alice", "type": "user", "roles": ["ops"],
            "password": "alice-Pa55"});
        let (s, v) = couch
            .put_doc("_users", "org.couchdb.user:alice", &user)
            .await;
        assert!(s == 201 || s == 202, "{v}");
        // A CouchDB user who signed up under the name of one of the node's own users.
        let carol =
            json!({"name": "carol", "type": "user", "roles": [], "password": "carol-Couch"});
        let (s, v) = couch
            .put_doc("_users", "org.couchdb.user:carol", &carol)
            .await;
        assert!(s == 201 || s == 202, "{v}");
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("node.ini");
        std::fs::write(
            &cfg,
            "[auth_couchdb]\ncache_ttl = 5\n[users]\ncarol = carol-Local\n\
             [chttpd_auth]\niterations = 10\n",
        )
        .unwrap();
        let log_path = dir.path().join("serve.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let node = spawn_serve(
            &dir.path().join("data"),
            &cfg,
            &["--auth-couchdb", &peer.url()],
            "debug",
            Stdio::from(log),
        )
        .await;
        let base = node.base.clone();

        let (s, me) = get(&base, "/_session", Some(("alice", "alice-Pa55")), None).await;
        assert_eq!(
            (s, &me["userCtx"]),
            (200, &json!({"name": "alice", "roles": ["ops"]}))
        );
        let (s, _) = get(
            &base,
            "/_scheduler/jobs",
            Some(("alice", "wrong-Pa55")),
            None,
        )
        .await;
        assert_eq!(s, 401);
        // The local carol is carol; CouchDB's carol is nobody here.
        let (s, me) = get(&base, "/_session", Some(("carol", "carol-Local")), None).await;
        assert_eq!((s, &me["userCtx"]["name"]), (200, &json!("carol")), "{me}");
        let (s, e) = get(
            &base,
            "/_scheduler/jobs",
            Some(("carol", "carol-Couch")),
            None,
        )
        .await;
        assert_eq!(s, 401, "{e}");
        assert!(
            e["reason"]
                .as_str()
                .unwrap()
                .contains("account of this node"),
            "{e}"
        );
        let r = reqwest::Client::new()
            .post(format!("{base}/_session"))
            .json(&json!({"name": "carol", "password": "carol-Couch"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
        let (s, me) = get(&base, "/_session", Some(("admin", "admin")), None).await;
        assert_eq!((s, &me["userCtx"]["roles"]), (200, &json!(["_admin"])));
        // A login through our node is CouchDB's: its cookie works here.
        let r = reqwest::Client::new()
            .post(format!("{base}/_session"))
            .json(&json!({"name": "alice", "password": "alice-Pa55"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
        let cookie = set
            .split(';')
            .next()
            .unwrap()
            .strip_prefix("AuthSession=")
            .unwrap();
        let (s, me) = get(&base, "/_session", None, Some(cookie)).await;
        assert_eq!(
            (s, &me["info"]["authenticated"]),
            (200, &json!("cookie")),
            "{me}"
        );
        let (s, _) = get(&base, "/_scheduler/jobs", None, Some(cookie)).await;
        assert_eq!(s, 200);
        drop(node);

        assert_no_credentials(
            &log_path,
            &[
                "alice-Pa55",
                "wrong-Pa55",
                cookie,
                "carol-Couch",
                "carol-Local",
            ],
        );
    })
    .await;
}

/// The log was written and holds none of `secrets`, nor alice's Basic header value.
fn assert_no_credentials(log_path: &std::path::Path, secrets: &[&str]) {
    let text = std::fs::read_to_string(log_path).unwrap();
    assert!(
        text.contains("checked by this CouchDB"),
        "the log was captured:\n{text}"
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode("alice:alice-Pa55");
    for secret in secrets.iter().copied().chain([b64.as_str()]) {
        assert!(
            !text.contains(secret),
            "the log holds a credential:\n{text}"
        );
    }
}
