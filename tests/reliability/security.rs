//! Security checks (issue 7, item 5) against a real `couch-replicator serve` process run with
//! `RUST_LOG=debug`: a known password put in source/target URLs and in an `Authorization`
//! header (working replications, a `_replicator` doc and one that fails against a closed port)
//! never appears — plain or base64 — in the captured log, any HTTP reply, `_scheduler/jobs`,
//! `_scheduler/docs`, `_active_tasks`, or the state/reason written back to the doc.
//! Unauthenticated and non-admin state changes get 401/403; a non-admin neither sees nor
//! cancels another user's job.

use std::process::Stdio;
use std::time::Duration;

use crate::support::couch::Couch;
use crate::support::server::{PouchServer, free_port};
use base64::Engine;
use reqwest::Method;
use serde_json::{Value, json};

const ADMIN: (&str, &str) = ("admin", "adm-Pw-4417");
const BOB: (&str, &str) = ("bob", "bob-Pw-9921");
const EVE: (&str, &str) = ("eve", "eve-Pw-3318");
/// The endpoint password that must never be shown.
const SECRET: &str = "Zq7-endpoint-SECRET-pw";

struct Serve {
    child: tokio::process::Child,
    base: String,
    http: reqwest::Client,
    log: std::path::PathBuf,
    /// Every reply body seen, for the final scan.
    seen: std::sync::Mutex<Vec<String>>,
}

impl Serve {
    async fn start(dir: &std::path::Path, repdb: &str) -> Serve {
        let cfg = dir.join("node.ini");
        std::fs::write(
            &cfg,
            format!(
                "[replicator]\ninterval_sec = 1\nstartup_jitter = 100\nstats_update_interval_sec = 1\n\
                 [admins]\n{} = {}\n[users]\n{} = {}\n{} = {}\n[replicator_dbs]\njobs_replicator = {repdb}\n",
                ADMIN.0, ADMIN.1, BOB.0, BOB.1, EVE.0, EVE.1
            ),
        )
        .unwrap();
        let log = dir.join("serve.log");
        let crate::support::serve::ServeProcess { child, base } =
            crate::support::serve::spawn_serve(
                &dir.join("data"),
                &cfg,
                &[],
                "debug",
                Stdio::from(std::fs::File::create(&log).unwrap()),
            )
            .await;
        Serve {
            child,
            base,
            http: reqwest::Client::new(),
            log,
            seen: Default::default(),
        }
    }

    async fn call(
        &self,
        who: Option<(&str, &str)>,
        m: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self.http.request(m, format!("{}{path}", self.base));
        if let Some(w) = who {
            r = r.basic_auth(w.0, Some(w.1));
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let s = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        self.seen.lock().unwrap().push(format!("{path} -> {text}"));
        (s, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// The forms of the secret that must not appear anywhere.
fn forbidden() -> Vec<String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    vec![
        SECRET.to_owned(),
        b64(&format!("repuser:{SECRET}")),
        b64(&format!("hdruser:{SECRET}")),
    ]
}

fn assert_clean(what: &str, text: &str) {
    for f in forbidden() {
        if let Some(at) = text.find(&f) {
            let from = at.saturating_sub(200);
            panic!(
                "{what} leaks the secret: ...{}...",
                &text[from..(at + f.len() + 50).min(text.len())]
            );
        }
    }
}

async fn add_user(c: &Couch, name: &str, pw: &str) {
    let (s, v) = c
        .put_doc(
            "_users",
            &format!("org.couchdb.user:{name}"),
            &json!({"name": name, "password": pw, "roles": [], "type": "user"}),
        )
        .await;
    assert!(s == 201 || s == 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_shown_and_state_changes_need_rights() {
    crate::support::deadline(150, "the security checks", async {
        let (a, b) = tokio::join!(PouchServer::start(), PouchServer::start());
        let (ca, cb) = (Couch::new(&a.root()), Couch::new(&b.root()));
        ca.create_db("src").await;
        ca.create_db("jobs_replicator").await;
        // pouchdb-server drops the connection when a non-admin user creates a database.
        for db in ["once", "live", "bydoc"] {
            cb.create_db(db).await;
        }
        ca.bulk_insert("src", &crate::support::couch::numbered_docs("d", 40))
            .await;
        add_user(&ca, "repuser", SECRET).await;
        add_user(&cb, "repuser", SECRET).await;
        add_user(&cb, "hdruser", SECRET).await;
        let with_pw = |p: &PouchServer, db: &str| {
            format!("http://repuser:{SECRET}@127.0.0.1:{}/{db}", p.port())
        };
        let hdr = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("hdruser:{SECRET}"))
        );
        let dir = tempfile::tempdir().unwrap();
        let node = Serve::start(dir.path(), &a.db_url("jobs_replicator")).await;

        // Unauthenticated and bad-password state changes: 401.
        let body = json!({"source": with_pw(&a, "src"), "target": with_pw(&b, "t0")});
        let (s, _) = node
            .call(None, Method::POST, "/_replicate", Some(body.clone()))
            .await;
        assert_eq!(s, 401);
        let (s, _) = node
            .call(
                Some(("bob", "wrong")),
                Method::POST,
                "/_replicate",
                Some(body.clone()),
            )
            .await;
        assert_eq!(s, 401);
        let (s, _) = node.call(None, Method::GET, "/_scheduler/jobs", None).await;
        assert!(s == 401 || s == 403, "anonymous _scheduler/jobs: {s}");

        // A one-shot with the password in both URLs works and shows no secret.
        let (s, v) = node
            .call(
                Some(BOB),
                Method::POST,
                "/_replicate",
                Some(json!({"source": with_pw(&a, "src"), "target": with_pw(&b, "once")})),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(cb.db_info("once").await.1["doc_count"], 40);

        // Bob's continuous job: password in the source URL and in a target header.
        let (s, bobs) = node
            .call(
                Some(BOB),
                Method::POST,
                "/_replicate",
                Some(json!({"source": with_pw(&a, "src"),
                    "target": {"url": b.db_url("live"), "headers": {"Authorization": hdr}},
                    "continuous": true})),
            )
            .await;
        assert_eq!(s, 202, "{bobs}");
        let bob_id = bobs["_local_id"].as_str().unwrap().to_owned();
        // A job that fails: password in a URL to a closed port (error messages).
        let dead = format!("http://repuser:{SECRET}@127.0.0.1:{}/nowhere", free_port());
        let (s, v) = node
            .call(
                Some(ADMIN),
                Method::POST,
                "/_replicate",
                Some(json!({"source": dead, "target": with_pw(&b, "x"), "continuous": true})),
            )
            .await;
        assert!(s == 202 || s >= 400, "{s} {v}");
        // A _replicator doc with the password in its URLs.
        ca.put_doc(
            "jobs_replicator",
            "withpw",
            &json!({"source": with_pw(&a, "src"), "target": with_pw(&b, "bydoc")}),
        )
        .await;
        crate::support::wait_for(60, "the doc's replication to complete", || async {
            let d = ca.get_doc("jobs_replicator", "withpw").await.1;
            assert_clean(
                "_replication_state_reason",
                &d["_replication_state_reason"].to_string(),
            );
            assert_clean("_replication_stats", &d["_replication_stats"].to_string());
            (d["_replication_state"] == "completed").then_some(())
        })
        .await;
        crate::support::wait_for(30, "bob's live copy", || async {
            (cb.db_info("live").await.1["doc_count"] == 40).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;

        // Every view, as admin and as bob.
        for who in [ADMIN, BOB, EVE] {
            for path in [
                "/_scheduler/jobs",
                "/_scheduler/docs",
                "/_scheduler/docs/jobs_replicator",
                "/_scheduler/docs/jobs_replicator/withpw",
                "/_active_tasks",
                &format!("/_scheduler/jobs/{bob_id}"),
            ] {
                node.call(Some(who), Method::GET, path, None).await;
            }
        }
        let (_, admin_jobs) = node
            .call(Some(ADMIN), Method::GET, "/_scheduler/jobs", None)
            .await;
        assert!(
            admin_jobs["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|j| j["id"] == bob_id.as_str()),
            "the admin does not see bob's job: {admin_jobs}"
        );

        // Eve sees none of bob's jobs or tasks and cannot cancel his job.
        let (_, eve_jobs) = node
            .call(Some(EVE), Method::GET, "/_scheduler/jobs", None)
            .await;
        assert_eq!(eve_jobs["total_rows"], 0, "{eve_jobs}");
        let (_, eve_tasks) = node
            .call(Some(EVE), Method::GET, "/_active_tasks", None)
            .await;
        assert_eq!(eve_tasks.as_array().map(Vec::len), Some(0), "{eve_tasks}");
        let (s, _) = node
            .call(
                Some(EVE),
                Method::GET,
                &format!("/_scheduler/jobs/{bob_id}"),
                None,
            )
            .await;
        assert!(s == 404 || s == 403, "eve reads bob's job: {s}");
        let cancel = json!({"cancel": true, "replication_id": bob_id});
        let (s, _) = node
            .call(Some(EVE), Method::POST, "/_replicate", Some(cancel.clone()))
            .await;
        assert!(s == 404 || s == 403, "eve cancels bob's job: {s}");
        let (s, _) = node
            .call(None, Method::POST, "/_replicate", Some(cancel.clone()))
            .await;
        assert_eq!(s, 401);
        let (_, bob_jobs) = node
            .call(Some(BOB), Method::GET, "/_scheduler/jobs", None)
            .await;
        assert!(
            bob_jobs["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|j| j["id"] == bob_id.as_str()),
            "bob's job was cancelled by eve: {bob_jobs}"
        );
        let (s, v) = node
            .call(Some(BOB), Method::POST, "/_replicate", Some(cancel))
            .await;
        assert_eq!(s, 200, "bob cancels his own job: {v}");

        // Stop, then scan everything captured.
        let mut child = node.child;
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
        let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
        let replies = node.seen.lock().unwrap().join("\n");
        assert_clean("HTTP replies", &replies);
        let log = std::fs::read_to_string(&node.log).unwrap();
        assert!(log.contains("DEBUG"), "no debug log captured");
        assert_clean("the debug log", &log);
        println!(
            "security: RESULT replies_scanned={} log_lines_scanned={}",
            replies.lines().count(),
            log.lines().count()
        );
    })
    .await;
}
