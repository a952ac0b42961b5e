//! An operator's CouchDB configuration runs `serve` unchanged: CouchDB 3.4.3's own
//! `default.ini` plus a `local.ini` whose `[admins]` entry CouchDB hashed (`-pbkdf2:sha256-`),
//! first from committed fixtures, then (with `COUCHDB_PEER_SCRIPT`) from a CouchDB started for
//! the test, whose session cookie our node must accept. The admin logs in with Basic and
//! through `/_session` (CouchDB's reply shapes), and out-of-range options are 400 naming the
//! option. `[replicator]` per-job defaults reach running jobs, and request bodies override them.

use std::path::{Path, PathBuf};

use crate::support::couchdb::CouchPeer;
use crate::support::serve::{ServeProcess, spawn_serve};
use base64::Engine as _;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// `serve` with CouchDB's default.ini then `local_ini`; its log goes to `data/serve.log`.
async fn serve_with(local_ini: &Path) -> (tempfile::TempDir, ServeProcess) {
    let data = tempfile::tempdir().unwrap();
    let default_ini = fixture("couchdb-3.4.3-default.ini");
    let files = format!("{},{}", default_ini.display(), local_ini.display());
    let log = std::fs::File::create(data.path().join("serve.log")).unwrap();
    // `--config a,b` (comma-separated, as the environment variable takes it).
    let node = spawn_serve(data.path(), Path::new(&files), &[], "info", log.into()).await;
    (data, node)
}

fn basic(user: &str, pw: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
    )
}

async fn call(
    base: &str,
    m: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut rb = reqwest::Client::new().request(m, format!("{base}{path}"));
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.expect("request");
    let (status, headers) = (r.status(), r.headers().clone());
    let v = r.json().await.unwrap_or(Value::Null);
    (status, headers, v)
}

fn session_cookie(h: &reqwest::header::HeaderMap) -> String {
    let set = h
        .get("set-cookie")
        .expect("a Set-Cookie header")
        .to_str()
        .unwrap();
    // CouchDB's form; ours adds its default `SameSite=Lax` (docs/couchdb-differences.md).
    let tail = set.strip_suffix("; SameSite=Lax").unwrap_or(set);
    assert!(
        set.contains("; Version=1; Expires=") && tail.ends_with("; Max-Age=600; Path=/; HttpOnly"),
        "{set}"
    );
    let v = set.split(';').next().unwrap();
    v.strip_prefix("AuthSession=").unwrap().to_owned()
}

/// Basic, `_session` login, cookie use (including a state change), logout, wrong passwords.
async fn admin_logs_in(base: &str, password: &str) {
    let auth = basic("admin", password);
    let (s, _, v) = call(
        base,
        Method::GET,
        "/_session",
        &[("authorization", &auth)],
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v,
        json!({"ok": true, "userCtx": {"name": "admin", "roles": ["_admin"]},
            "info": {"authentication_handlers": ["cookie", "default"], "authenticated": "default"}})
    );
    let login = json!({"name": "admin", "password": password});
    let (s, h, v) = call(base, Method::POST, "/_session", &[], Some(login)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!({"ok": true, "name": "admin", "roles": ["_admin"]}));
    let cookie = format!("AuthSession={}", session_cookie(&h));
    let with_cookie = [("cookie", cookie.as_str())];
    let (_, _, v) = call(base, Method::GET, "/_session", &with_cookie, None).await;
    assert_eq!(v["info"]["authenticated"], "cookie", "{v}");
    assert_eq!(v["userCtx"]["roles"], json!(["_admin"]));
    // The cookie authorises a state change: the body is judged (400), not the caller (401).
    let bad = json!({"source": "http://127.0.0.1:1/a", "target": "http://127.0.0.1:1/b",
        "worker_processes": 10_000_000});
    let (s, _, v) = call(
        base,
        Method::POST,
        "/_replicate",
        &with_cookie,
        Some(bad.clone()),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"], "bad_request");
    assert!(
        v["reason"].as_str().unwrap().contains("worker_processes"),
        "{v}"
    );
    let (s, _, _) = call(base, Method::POST, "/_replicate", &[], Some(bad)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Form login, wrong password: 401 with CouchDB's reason and a clearing cookie.
    let r = reqwest::Client::new()
        .post(format!("{base}/_session"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("name=admin&password=wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(session_cookie(r.headers()), "");
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        json!({"error": "unauthorized", "reason": "Name or password is incorrect."})
    );
    let (s, h, v) = call(base, Method::DELETE, "/_session", &with_cookie, None).await;
    assert_eq!((s, v), (StatusCode::OK, json!({"ok": true})));
    assert_eq!(session_cookie(&h), "");
    let (s, _, v) = call(
        base,
        Method::GET,
        "/_session",
        &[("cookie", "AuthSession=!!")],
        None,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let wrong = basic("admin", "wrong");
    let (s, _, _) = call(
        base,
        Method::GET,
        "/_session",
        &[("authorization", &wrong)],
        None,
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn couchdb_default_and_local_ini_from_fixtures() {
    let (data, node) = serve_with(&fixture("couchdb-3.4.3-local.ini")).await;
    admin_logs_in(&node.base, "admin").await;
    // What was not applied is logged once, one line per section; no secret is.
    let log = std::fs::read_to_string(data.path().join("serve.log")).unwrap();
    assert_eq!(log.matches("[log] is not used").count(), 1, "{log}");
    assert!(
        log.contains("[couchdb] keys not used by this node: "),
        "{log}"
    );
    assert!(
        log.contains("[chttpd_auth] keys not used by this node: hash_algorithms"),
        "{log}"
    );
    for secret in ["760669adacd5", "a2e53dd4aef6", "wrong"] {
        assert!(!log.contains(secret), "{secret} logged: {log}");
    }
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_couchdb_local_ini_and_its_session_cookie() {
    let Some(peer) = CouchPeer::start("a_live_couchdb_local_ini_and_its_session_cookie", None)
    else {
        return;
    };
    // A login makes CouchDB write its cookie secret into local.ini next to the admin hash.
    let login = json!({"name": "admin", "password": "admin"});
    let (s, h, _) = call(&peer.url(), Method::POST, "/_session", &[], Some(login)).await;
    assert_eq!(s, StatusCode::OK);
    let couch_cookie = session_cookie(&h);
    let local = peer.dir().join("local.ini");
    let text = std::fs::read_to_string(&local).unwrap();
    assert!(text.contains("admin = -pbkdf2:sha256-"), "{text}");
    assert!(
        text.contains("[chttpd_auth]") && text.contains("secret = "),
        "{text}"
    );
    let (_data, node) = serve_with(&local).await;
    admin_logs_in(&node.base, "admin").await;
    let cookie = format!("AuthSession={couch_cookie}");
    let (_, _, v) = call(
        &node.base,
        Method::GET,
        "/_session",
        &[("cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(v["userCtx"]["name"], "admin", "{v}");
    assert_eq!(v["info"]["authenticated"], "cookie", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicator_defaults_apply_and_request_bodies_override_them() {
    let pouch = crate::support::server::PouchServer::start().await;
    crate::support::couch::Couch::new(&pouch.root())
        .create_db("src")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let ini = dir.path().join("local.ini");
    std::fs::write(
        &ini,
        "[admins]\nadmin = pw\n[replicator]\ncheckpoint_interval = 7000\n\
         stats_update_interval_sec = 1\nusage_coeff = 0.5\n",
    )
    .unwrap();
    let node = spawn_serve(dir.path(), &ini, &[], "warn", std::process::Stdio::null()).await;
    let auth = basic("admin", "pw");
    for (tgt, extra) in [
        ("by_default", json!({})),
        ("by_body", json!({"checkpoint_interval": 5000})),
    ] {
        let mut body = json!({"source": pouch.db_url("src"), "target": pouch.db_url(tgt),
            "create_target": true, "continuous": true});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (s, _, v) = call(
            &node.base,
            Method::POST,
            "/_replicate",
            &[("authorization", &auth)],
            Some(body),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    }
    let tasks = crate::support::wait_for(60, "two active tasks", || async {
        let (_, _, v) = call(
            &node.base,
            Method::GET,
            "/_active_tasks",
            &[("authorization", &auth)],
            None,
        )
        .await;
        let tasks = v.as_array().cloned().unwrap_or_default();
        (tasks.len() == 2).then_some(tasks)
    })
    .await;
    for t in &tasks {
        let target = t["target"].as_str().unwrap();
        let want = if target.ends_with("/by_body/") {
            5000
        } else {
            7000
        };
        assert_eq!(t["checkpoint_interval"], want, "{t}");
    }
}
