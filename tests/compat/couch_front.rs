//! In front of a real CouchDB 3.4.3, the same requests to CouchDB and to our node answer alike
//! (`COUCHDB_PEER_SCRIPT`; skipped with a message when unset):
//! - CouchDB's response headers on every reply (request id, body time, cache control,
//!   server), and a caller's request id echoed back;
//! - a first one-shot replication with nothing to copy (empty source, `doc_ids: []`, ids that
//!   do not exist, a selector matching nothing) answers `{"ok": true, "no_changes": true}`
//!   and writes no checkpoint;
//! - an endpoint that answers 401 or 403 to the replicator's user gives the same class in the
//!   `_replicate` reply;
//! - a new continuous job is in `_active_tasks` within a few seconds, and its counters follow
//!   progress, with CouchDB's default intervals on our side (`stats_update_interval` 10 s).

use std::time::Duration;

use super::replicate_api::{Both, shape};
use crate::support::couch::numbered_docs;
use crate::support::http::ADMIN;
use couch_replicator::replicator::ReplicatorSettings;
use serde_json::{Value, json};

/// The headers CouchDB sends with every reply, as one side answered them.
fn couch_headers(r: &reqwest::Response) -> [Option<String>; 4] {
    [
        "x-couch-request-id",
        "x-couchdb-body-time",
        "cache-control",
        "server",
    ]
    .map(|h| {
        r.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    })
}

fn assert_couch_headers(side: &str, what: &str, h: &[Option<String>; 4]) {
    let [id, body_time, cache, server] = h;
    let id = id
        .as_deref()
        .unwrap_or_else(|| panic!("{side} {what}: no request id"));
    assert!(
        id.len() == 10 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{side} {what}: request id {id:?}"
    );
    assert!(
        body_time
            .as_deref()
            .is_some_and(|t| t.parse::<u64>().is_ok()),
        "{side} {what}: body time {body_time:?}"
    );
    assert_eq!(cache.as_deref(), Some("must-revalidate"), "{side} {what}");
    assert!(
        server
            .as_deref()
            .is_some_and(|s| s.starts_with("CouchDB/3.4.3 (")),
        "{side} {what}: server {server:?}"
    );
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reply_carries_couchdbs_headers() {
    let Some(b) = Both::start("couch_front_headers").await else {
        return;
    };
    let theirs = b.peer.url();
    let ours = b.node.base.clone();
    // (method, path, body, as admin): a welcome, a listing, a refused caller, a bad body, a
    // missing route.
    let requests: [(&str, &str, Option<&str>, bool); 5] = [
        ("GET", "/", None, false),
        ("GET", "/_scheduler/jobs", None, true),
        ("GET", "/_active_tasks", None, false),
        ("POST", "/_replicate", Some("{not json"), true),
        ("GET", "/_scheduler/jobs/nope", None, true),
    ];
    for (method, path, body, admin) in requests {
        let what = format!("{method} {path}");
        let mut statuses = Vec::new();
        for (side, base, who) in [
            ("CouchDB", theirs.as_str(), ("admin", "admin")),
            ("ours", ours.as_str(), ADMIN),
        ] {
            let mut r = b
                .http
                .request(method.parse().unwrap(), format!("{base}{path}"));
            if admin {
                r = r.basic_auth(who.0, Some(who.1));
            }
            if let Some(body) = body {
                r = r.header("content-type", "application/json").body(body);
            }
            let resp = r.send().await.unwrap();
            assert_couch_headers(side, &what, &couch_headers(&resp));
            statuses.push(resp.status().as_u16());
        }
        assert_eq!(statuses[0], statuses[1], "{what}: CouchDB / ours");
    }
    // A caller's own request id comes back unchanged from both.
    for base in [&theirs, &ours] {
        let r = b
            .http
            .get(format!("{base}/_up"))
            .header("X-Couch-Request-ID", "c0ffee0123")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["x-couch-request-id"], "c0ffee0123", "{base}");
    }
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_replications_with_nothing_to_copy_answer_no_changes() {
    let Some(b) = Both::start("couch_front_no_changes").await else {
        return;
    };
    for db in ["empty", "src"] {
        b.c.create_db(db).await;
    }
    b.c.bulk_insert("src", &numbered_docs("a", 3)).await;
    // Each case on fresh targets: (name, source, extra options).
    let cases: [(&str, &str, Value); 4] = [
        ("empty_source", "empty", json!({})),
        ("no_ids", "src", json!({"doc_ids": []})),
        (
            "missing_ids",
            "src",
            json!({"doc_ids": ["nope", "nothing"]}),
        ),
        ("selector", "src", json!({"selector": {"no_such_field": 1}})),
    ];
    for (name, source, extra) in cases {
        let mut replies = Vec::new();
        for side in ["c", "o"] {
            let target = format!("t_{name}_{side}");
            let mut body = json!({"source": b.db(source), "target": b.db(&target),
                "create_target": true});
            if let (Some(m), Some(x)) = (body.as_object_mut(), extra.as_object()) {
                m.extend(x.clone());
            }
            let (status, reply) = if side == "c" {
                b.couch(&body).await
            } else {
                b.ours(&body).await
            };
            assert_eq!(status, 200, "{name} {side}: {reply}");
            let (_, locals) = b.c.get_doc(&target, "_local_docs").await;
            assert_eq!(
                locals["rows"].as_array().map(Vec::len),
                Some(0),
                "{name} {side}: a checkpoint on the target: {locals}"
            );
            replies.push(reply);
        }
        assert_eq!(
            replies[0],
            json!({"ok": true, "no_changes": true}),
            "{name}"
        );
        assert_eq!(replies[1], replies[0], "{name}: ours / CouchDB");
    }
    for source in ["empty", "src"] {
        let (_, locals) = b.c.get_doc(source, "_local_docs").await;
        assert_eq!(
            locals["rows"].as_array().map(Vec::len),
            Some(0),
            "a checkpoint on {source}: {locals}"
        );
    }
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_refusing_the_replicators_user_keep_their_status() {
    let Some(b) = Both::start("couch_front_permissions").await else {
        return;
    };
    let user = json!({"name": "bob", "password": "bob-pw", "roles": [], "type": "user"});
    let (s, r) = b.c.put_doc("_users", "org.couchdb.user:bob", &user).await;
    assert!(s == 201 || s == 202, "{r}");
    for db in ["secret", "open"] {
        b.c.create_db(db).await;
    }
    b.c.bulk_insert("open", &numbered_docs("a", 2)).await;
    let sec = json!({"members": {"names": ["alice"]}, "admins": {}});
    let (s, r) = b.c.put_doc("secret", "_security", &sec).await;
    assert_eq!(s, 200, "{r}");
    let port = b.peer.port();
    let bob = format!("http://bob:bob-pw@127.0.0.1:{port}/secret");
    let anonymous = format!("http://127.0.0.1:{port}/secret");
    let wrong = format!("http://bob:not-bobs@127.0.0.1:{port}/secret");
    // (what, body, expected status and error)
    let cases = [
        (
            "source forbidden",
            json!({"source": bob, "target": b.db("t1"), "create_target": true}),
            (403, "forbidden"),
        ),
        (
            "source unauthorized",
            json!({"source": anonymous, "target": b.db("t2"), "create_target": true}),
            (401, "unauthorized"),
        ),
        (
            "wrong password",
            json!({"source": wrong, "target": b.db("t3"), "create_target": true}),
            (500, "replication_auth_error"),
        ),
        (
            "target forbidden",
            json!({"source": b.db("open"), "target": bob}),
            (403, "forbidden"),
        ),
    ];
    for (what, body, (status, error)) in cases {
        let (sc, rc) = b.couch(&body).await;
        let (so, ro) = b.ours(&body).await;
        assert_eq!(
            (sc, rc["error"].as_str()),
            (status, Some(error)),
            "CouchDB {what}: {rc}"
        );
        assert_eq!((so, &ro["error"]), (sc, &rc["error"]), "ours {what}: {ro}");
        assert_eq!(shape(&ro), shape(&rc), "{what}");
        if error != "replication_auth_error" {
            // The same text: CouchDB's, with the URL as CouchDB shows it (CouchDB's
            // `replication_auth_error` reason is an Erlang term; ours says it in words).
            assert_eq!(ro["reason"], rc["reason"], "{what}");
        }
        assert!(!ro.to_string().contains("bob-pw"), "{what}: {ro}");
        assert!(!ro.to_string().contains("not-bobs"), "{what}: {ro}");
    }
}

/// Polls `_active_tasks` of one side until a task for `target` satisfies `ok`, for at most
/// `secs`; the task, or `None`.
async fn task_when(
    b: &Both,
    ours: bool,
    target: &str,
    secs: u64,
    ok: impl Fn(&Value) -> bool,
) -> Option<Value> {
    let until = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let tasks = if ours {
            b.node.get("/_active_tasks", Some(ADMIN)).await.1
        } else {
            let r = b.http.get(format!("{}/_active_tasks", b.peer.url()));
            let r = r.basic_auth("admin", Some("admin")).send().await.unwrap();
            r.json::<Value>().await.unwrap()
        };
        let found = tasks.as_array().into_iter().flatten().find(|t| {
            t["target"]
                .as_str()
                .is_some_and(|t| t.trim_end_matches('/').ends_with(target))
        });
        if let Some(t) = found.filter(|t| ok(t)) {
            return Some(t.clone());
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_job_is_an_active_task_at_once_and_its_counters_follow_progress() {
    // CouchDB's default intervals on our side: nothing here may wait for a 10 s stats timer.
    let settings = ReplicatorSettings {
        startup_jitter: Duration::from_millis(100),
        ..ReplicatorSettings::default()
    };
    let Some(b) = Both::start_with("couch_front_active_tasks", settings).await else {
        return;
    };
    b.c.create_db("src").await;
    for (side, target) in [("c", "tgt_c"), ("o", "tgt_o")] {
        let body = json!({"source": b.db("src"), "target": b.db(target),
            "continuous": true, "create_target": true});
        let (status, r) = if side == "c" {
            b.couch(&body).await
        } else {
            b.ours(&body).await
        };
        assert_eq!(status, 202, "{side}: {r}");
    }
    // Listed within seconds on both (CouchDB: about a second once warm, a few on a fresh
    // node; ours must not wait for its 10 s stats timer).
    for (ours, target, secs) in [(false, "tgt_c", 10), (true, "tgt_o", 5)] {
        let t = task_when(&b, ours, target, secs, |_| true).await;
        let t = t.unwrap_or_else(|| panic!("{target}: not in _active_tasks within {secs} s"));
        assert_eq!(t["docs_written"], 0, "{t}");
    }
    // Progress shows within 6 s (under the 10 s stats timer, with room for a loaded machine).
    b.c.bulk_insert("src", &numbered_docs("d", 20)).await;
    for (ours, target) in [(false, "tgt_c"), (true, "tgt_o")] {
        let t = task_when(&b, ours, target, 6, |t| t["docs_written"] == 20).await;
        assert!(t.is_some(), "{target}: docs_written not 20 within 6 s");
    }
}
