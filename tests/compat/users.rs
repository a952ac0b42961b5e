//! CouchDB's `_users` on our node, against a real CouchDB 3.4.3 (`COUCHDB_PEER_SCRIPT`; skipped
//! with a message when unset): a node configured to authenticate callers against that CouchDB
//! lets a `_users` user start, see and cancel their own replication with Basic credentials or
//! an `AuthSession` cookie CouchDB issued; another user can neither see nor cancel it; CouchDB's
//! admin is admin here. Checks go through a counting proxy, so the cache's behaviour is
//! observed, not assumed: a success is asked once, a refusal every time. The last test puts
//! the same requests to CouchDB itself and compares the status codes.

use std::sync::Arc;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::couch::Couch;
use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::http::Node;
use crate::support::proxy::FaultProxy;
use couch_replicator::http::HttpConfig;
use couch_replicator::http::auth::Users;
use couch_replicator::http::couchdb_auth::{CouchDbAuth, CouchDbAuthSettings};

/// How a request authenticates.
#[derive(Clone)]
enum Who {
    Nobody,
    Basic(&'static str, String),
    Cookie(String),
}

fn basic(name: &'static str, pw: &str) -> Who {
    Who::Basic(name, pw.to_owned())
}

/// `METHOD root+path` as `who`; `(status, JSON body)`.
async fn call(root: &str, m: Method, path: &str, who: &Who, body: Option<&Value>) -> (u16, Value) {
    let mut r = reqwest::Client::new().request(m, format!("{root}{path}"));
    r = match who {
        Who::Nobody => r,
        Who::Basic(n, p) => r.basic_auth(n, Some(p)),
        Who::Cookie(c) => r.header("cookie", format!("AuthSession={c}")),
    };
    if let Some(b) = body {
        r = r.json(b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Creates (or updates, at `rev`) a `_users` user; returns the new rev.
async fn put_user(
    couch: &Couch,
    name: &str,
    pw: &str,
    roles: &[&str],
    rev: Option<&str>,
) -> String {
    let mut doc = json!({"name": name, "type": "user", "roles": roles, "password": pw});
    if let Some(r) = rev {
        doc["_rev"] = json!(r);
    }
    let (s, v) = couch
        .put_doc("_users", &format!("org.couchdb.user:{name}"), &doc)
        .await;
    assert!(s == 201 || s == 202, "PUT _users/{name}: {s} {v}");
    v["rev"].as_str().unwrap().to_owned()
}

/// An `AuthSession` cookie from CouchDB's own `POST /_session`.
async fn couchdb_cookie(peer: &CouchPeer, name: &str, pw: &str) -> String {
    let r = reqwest::Client::new()
        .post(format!("{}/_session", peer.url()))
        .json(&json!({"name": name, "password": pw}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    let v = set.split(';').next().unwrap();
    v.strip_prefix("AuthSession=").unwrap().to_owned()
}

/// A node whose callers are checked by the CouchDB behind `proxy`, successes cached 60 s.
async fn node_checked_by(proxy: &FaultProxy) -> Node {
    let mut s = CouchDbAuthSettings::new(&proxy.db_url("")).unwrap();
    s.cache_ttl = std::time::Duration::from_secs(60);
    let auth = Arc::new(CouchDbAuth::new(s).unwrap());
    let cfg = HttpConfig {
        users: Users::default().with_couchdb(auth),
        ..HttpConfig::default()
    };
    Node::start(cfg).await
}

/// Session checks the node sent to the CouchDB so far.
fn checks(proxy: &FaultProxy) -> usize {
    proxy
        .log()
        .iter()
        .filter(|r| r.path.starts_with("/_session"))
        .count()
}

/// The ids of the jobs `who` sees in `_scheduler/jobs`, and of the tasks in `_active_tasks`.
async fn visible(node: &Node, who: &Who) -> (Vec<String>, Vec<String>) {
    let (s, jobs) = call(&node.base, Method::GET, "/_scheduler/jobs", who, None).await;
    assert_eq!(s, 200, "{jobs}");
    let (s, tasks) = call(&node.base, Method::GET, "/_active_tasks", who, None).await;
    assert_eq!(s, 200, "{tasks}");
    let ids = |v: &Value, k: &str| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|j| j[k].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    (ids(&jobs["jobs"], "id"), ids(&tasks, "replication_id"))
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn couchdb_users_start_see_and_cancel_their_own_replications() {
    let Some(peer) = CouchPeer::start("couchdb users", None) else {
        return;
    };
    deadline(180, "couchdb users on our node", async {
        peer.warm_up_sessions().await;
        let couch = Couch::new(&peer.admin_url());
        put_user(&couch, "alice", "alice-pw", &["r1"], None).await;
        let mallory_rev = put_user(&couch, "mallory", "mallory-pw", &[], None).await;
        couch.create_db("src").await;
        couch.put_doc("src", "d1", &json!({"x": 1})).await;
        let proxy = FaultProxy::start(&peer.url()).await;
        let node = node_checked_by(&proxy).await;
        let alice = basic("alice", "alice-pw");

        let (rep, rep_id) = alice_starts_and_sees(&peer, &node, &proxy, &alice).await;
        let mallory = basic("mallory", "mallory-pw");
        others_neither_see_nor_cancel(&node, &mallory, &alice, &rep, &rep_id).await;

        // CouchDB's admin is admin here: sees alice's job.
        let admin = basic("admin", "admin");
        let (s, me) = call(&node.base, Method::GET, "/_session", &admin, None).await;
        assert_eq!(
            (s, &me["userCtx"]["roles"]),
            (200, &json!(["_admin"])),
            "{me}"
        );
        let (all, _) = visible(&node, &admin).await;
        assert_eq!(all, [rep_id.as_str()]);

        passwords_are_checked_every_time_they_fail(
            &couch,
            &peer.url(),
            &node,
            &proxy,
            &mallory_rev,
        )
        .await;

        // Alice, with a cookie CouchDB issued, sees and cancels her job.
        let cookie = Who::Cookie(couchdb_cookie(&peer, "alice", "alice-pw").await);
        let (s, me) = call(&node.base, Method::GET, "/_session", &cookie, None).await;
        assert_eq!(
            (s, &me["info"]["authenticated"]),
            (200, &json!("cookie")),
            "{me}"
        );
        assert_eq!(visible(&node, &cookie).await.0, [rep_id.as_str()]);
        let cancel = json!({"replication_id": rep_id, "cancel": true});
        let (s, done) = call(
            &node.base,
            Method::POST,
            "/_replicate",
            &cookie,
            Some(&cancel),
        )
        .await;
        assert_eq!((s, &done["_local_id"]), (200, &json!(rep_id)), "{done}");
        assert_eq!(visible(&node, &admin).await, (vec![], vec![]));
        couchdb_cookies_are_renewed(&peer, &node).await;
    })
    .await;
}

/// Alice, with Basic, is herself on our node (name and roles), starts a continuous
/// replication and sees it in the scheduler and, once it runs, in the active tasks; all of
/// it costs one check at the CouchDB. Returns the request and its replication id.
async fn alice_starts_and_sees(
    peer: &CouchPeer,
    node: &Node,
    proxy: &FaultProxy,
    alice: &Who,
) -> (Value, String) {
    // Alice, with Basic, is herself here: her name and roles.
    let (s, me) = call(&node.base, Method::GET, "/_session", alice, None).await;
    assert_eq!(s, 200, "{me}");
    assert_eq!(me["userCtx"], json!({"name": "alice", "roles": ["r1"]}));
    assert_eq!(me["info"]["authenticated"], "default");
    let rep = json!({"source": format!("{}/src", peer.admin_url()),
        "target": format!("{}/tgt", peer.admin_url()), "create_target": true,
        "continuous": true});
    let (s, started) = call(&node.base, Method::POST, "/_replicate", alice, Some(&rep)).await;
    assert_eq!(s, 202, "{started}");
    let rep_id = started["_local_id"].as_str().unwrap().to_owned();
    // She sees her job in the scheduler and, once it runs, in the active tasks.
    let running = crate::support::wait_for(60, "alice's task", || async {
        let (jobs, tasks) = visible(node, alice).await;
        (jobs == [rep_id.as_str()] && tasks == [rep_id.as_str()]).then_some(())
    });
    running.await;
    let (s, job) = call(
        &node.base,
        Method::GET,
        &format!("/_scheduler/jobs/{rep_id}"),
        alice,
        None,
    )
    .await;
    assert_eq!((s, job["user"].as_str()), (200, Some("alice")), "{job}");
    // Every request so far was checked once: the rest came from the cache.
    assert_eq!(checks(proxy), 1, "one check for alice's Basic credentials");
    (rep, rep_id)
}

/// Mallory does not see alice's job, by listing or by id, and cannot cancel it by id or by
/// its source and target.
async fn others_neither_see_nor_cancel(
    node: &Node,
    mallory: &Who,
    alice: &Who,
    rep: &Value,
    rep_id: &str,
) {
    assert_eq!(visible(node, mallory).await, (vec![], vec![]));
    let (s, _) = call(
        &node.base,
        Method::GET,
        &format!("/_scheduler/jobs/{rep_id}"),
        mallory,
        None,
    )
    .await;
    assert_eq!(s, 404);
    let cancel = json!({"replication_id": rep_id, "cancel": true});
    let (s, e) = call(
        &node.base,
        Method::POST,
        "/_replicate",
        mallory,
        Some(&cancel),
    )
    .await;
    assert_eq!(s, 404, "{e}");
    let mut by_spec = rep.clone();
    by_spec["cancel"] = json!(true);
    let (s, e) = call(
        &node.base,
        Method::POST,
        "/_replicate",
        mallory,
        Some(&by_spec),
    )
    .await;
    assert_eq!(s, 404, "{e}");
    assert_eq!(visible(node, alice).await.0, [rep_id], "still there");
}

/// A CouchDB cookie past a tenth of its lifetime comes back renewed from a request to our
/// node (CouchDB renews it while checking it), and the renewed one works.
async fn couchdb_cookies_are_renewed(peer: &CouchPeer, node: &Node) {
    let r = reqwest::Client::new()
        .put(format!(
            "{}/_node/_local/_config/chttpd_auth/timeout",
            peer.admin_url()
        ))
        .json(&json!("20"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Mallory's: no cookie of hers was checked here yet (one of alice's minted in the same
    // second as the one she used before would be the same bytes, and cached).
    let old = couchdb_cookie(peer, "mallory", "mallory-new").await;
    // A tenth of 20 s is 2 s: wait past it.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let r = reqwest::Client::new()
        .get(format!("{}/_scheduler/jobs", node.base))
        .header("cookie", format!("AuthSession={old}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let set = r.headers()["set-cookie"].to_str().unwrap();
    assert!(set.contains("Max-Age=20"), "CouchDB's renewal: {set}");
    let new = set
        .split(';')
        .next()
        .unwrap()
        .strip_prefix("AuthSession=")
        .unwrap();
    assert_ne!(new, old);
    let (s, me) = call(
        &node.base,
        Method::GET,
        "/_session",
        &Who::Cookie(new.into()),
        None,
    )
    .await;
    assert_eq!(
        (s, &me["userCtx"]["name"]),
        (200, &json!("mallory")),
        "{me}"
    );
}

/// Refusals are never cached, and a changed password works at once; successes are asked once.
async fn passwords_are_checked_every_time_they_fail(
    couch: &Couch,
    direct: &str,
    node: &Node,
    proxy: &FaultProxy,
    mallory_rev: &str,
) {
    let before = checks(proxy);
    let new_pw = basic("mallory", "mallory-new");
    for _ in 0..3 {
        let (s, e) = call(&node.base, Method::GET, "/_scheduler/jobs", &new_pw, None).await;
        assert_eq!((s, e["error"].as_str()), (401, Some("unauthorized")), "{e}");
    }
    assert_eq!(
        checks(proxy),
        before + 3,
        "each refusal was asked, none remembered"
    );
    put_user(couch, "mallory", "mallory-new", &[], Some(mallory_rev)).await;
    // CouchDB's own auth cache learns the change from `_users`' changes feed: wait until
    // CouchDB itself takes the new password (asking it directly, not through our node).
    crate::support::wait_for(30, "CouchDB takes mallory's new password", || async {
        let (s, _) = call(direct, Method::GET, "/_session?basic=true", &new_pw, None).await;
        (s == 200).then_some(())
    })
    .await;
    let (s, e) = call(&node.base, Method::GET, "/_scheduler/jobs", &new_pw, None).await;
    assert_eq!(s, 200, "the new password works at once: {e}");
    let (s, _) = call(&node.base, Method::GET, "/_active_tasks", &new_pw, None).await;
    assert_eq!(s, 200);
    assert_eq!(checks(proxy), before + 4, "then it is remembered");
    // An unknown user, and anonymous callers, are 401 as before.
    let (s, _) = call(
        &node.base,
        Method::GET,
        "/_scheduler/jobs",
        &basic("nobody", "x"),
        None,
    )
    .await;
    assert_eq!(s, 401);
    let (s, _) = call(
        &node.base,
        Method::GET,
        "/_scheduler/jobs",
        &Who::Nobody,
        None,
    )
    .await;
    assert_eq!(s, 401);
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn couchdb_users_get_couchdbs_status_codes() {
    let Some(peer) = CouchPeer::start("couchdb users' status codes", None) else {
        return;
    };
    deadline(180, "status codes compared with CouchDB", async {
        peer.warm_up_sessions().await;
        let couch = Couch::new(&peer.admin_url());
        put_user(&couch, "alice", "alice-pw", &[], None).await;
        put_user(&couch, "mallory", "mallory-pw", &[], None).await;
        couch.create_db("src").await;
        let proxy = FaultProxy::start(&peer.url()).await;
        let node = node_checked_by(&proxy).await;
        compare(&peer, &node).await;
    })
    .await;
}

/// The same requests, in the same order, to CouchDB and to our node (each replicating into
/// its own target): equal status codes, except where our node deliberately differs.
async fn compare(peer: &CouchPeer, node: &Node) {
    let (alice, mallory) = (basic("alice", "alice-pw"), basic("mallory", "mallory-pw"));
    let wrong = basic("alice", "not-her-password");
    let admin = basic("admin", "admin");
    let (mut rep_ids, mut reps) = (Vec::new(), Vec::new());
    for (root, tgt) in [(peer.url(), "tgt_couchdb"), (node.base.clone(), "tgt_ours")] {
        let rep = json!({"source": format!("{}/src", peer.admin_url()),
            "target": format!("{}/{tgt}", peer.admin_url()), "create_target": true,
            "continuous": true});
        let (s, v) = call(&root, Method::POST, "/_replicate", &alice, Some(&rep)).await;
        assert_eq!(s, 202, "a user starts a replication at {root}: {v}");
        rep_ids.push(v["_local_id"].as_str().unwrap_or_default().to_owned());
        reps.push(rep);
        // Running, so that another user's start of the same replication meets it.
        crate::support::wait_for(60, "alice's replication running", || async {
            let (_, tasks) = call(&root, Method::GET, "/_active_tasks", &admin, None).await;
            (tasks.as_array().is_some_and(|t| t.len() == 1)).then_some(())
        })
        .await;
    }
    let get = |what, path, who: &Who, couchdb, ours| Step {
        what,
        path,
        who: who.clone(),
        body: None,
        couchdb,
        ours,
    };
    let anonymous = Step {
        body: Some(json!({"source": "a", "target": "b"})),
        ..get(
            "anonymous _replicate",
            "/_replicate",
            &Who::Nobody,
            401,
            401,
        )
    };
    let steps = [
        anonymous,
        get("wrong password", "/_scheduler/jobs", &wrong, 401, 401),
        get("admin lists jobs", "/_scheduler/jobs", &admin, 200, 200),
        get("admin reads tasks", "/_active_tasks", &admin, 200, 200),
        // CouchDB 3.4.3 shows the scheduler and tasks to server admins only (401 "You are not
        // a server admin."); our node shows a user their own jobs.
        get("user lists jobs", "/_scheduler/jobs", &alice, 401, 200),
        get("user reads tasks", "/_active_tasks", &alice, 401, 200),
        get(
            "other user lists jobs",
            "/_scheduler/jobs",
            &mallory,
            401,
            200,
        ),
    ];
    for (i, root) in [peer.url(), node.base.clone()].into_iter().enumerate() {
        let cancel = json!({"replication_id": rep_ids[i], "cancel": true});
        // CouchDB refuses another user's cancel with 401 "You are not a server admin."; ours
        // answers 404, as for a job that does not exist (nothing about it is revealed).
        let other = Step {
            body: Some(cancel.clone()),
            ..get("other user cancels", "/_replicate", &mallory, 401, 404)
        };
        // The same replication by another user: CouchDB 401 "You are not a server admin.",
        // ours 409 naming the job that runs it (README: duplicates are a conflict).
        let same = Step {
            body: Some(reps[i].clone()),
            ..get(
                "other user starts the same",
                "/_replicate",
                &mallory,
                401,
                409,
            )
        };
        let own = Step {
            body: Some(cancel),
            ..get("user cancels own", "/_replicate", &alice, 200, 200)
        };
        for st in steps.iter().cloned().chain([same, other, own]) {
            let m = if st.body.is_some() {
                Method::POST
            } else {
                Method::GET
            };
            let (s, v) = call(&root, m, st.path, &st.who, st.body.as_ref()).await;
            let expected = if i == 0 { st.couchdb } else { st.ours };
            let server = ["CouchDB", "our node"][i];
            assert_eq!(s, expected, "{} on {server}: {v}", st.what);
        }
    }
}

/// One request of the comparison (a POST when it has a body) and what each server answers.
#[derive(Clone)]
struct Step {
    what: &'static str,
    path: &'static str,
    who: Who,
    body: Option<Value>,
    couchdb: u16,
    ours: u16,
}
