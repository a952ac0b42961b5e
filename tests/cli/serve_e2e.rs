//! End to end: the `couch-replicator serve` binary on a temp data dir, with two
//! pouchdb-servers. `POST /_replicate` (one-shot and continuous) copies the data and
//! `_scheduler/jobs` + `_active_tasks` show the running job; a `_replicator` document
//! replicates and gets `completed` written back; SIGTERM stops the node cleanly.

use crate::support::deadline;
use std::process::Stdio;
use std::time::Duration;

use crate::support::http::Pouch;
use serde_json::{Value, json};

const ADMIN: (&str, &str) = ("admin", "e2e-secret");

struct Serve {
    child: tokio::process::Child,
    base: String,
    http: reqwest::Client,
}

impl Serve {
    async fn start(dir: &std::path::Path, repdb: &str) -> Serve {
        let cfg = dir.join("node.ini");
        std::fs::write(
            &cfg,
            format!(
                "[replicator]\ninterval_sec = 1\nstartup_jitter = 100\nstats_update_interval_sec = 1\n\
                 [admins]\n{} = {}\n[users]\nbob = bob-pw\n[replicator_dbs]\njobs_replicator = {repdb}\n",
                ADMIN.0, ADMIN.1
            ),
        )
        .unwrap();
        let crate::support::serve::ServeProcess { child, base } =
            crate::support::serve::spawn_serve(
                &dir.join("data"),
                &cfg,
                &[],
                "warn",
                Stdio::inherit(),
            )
            .await;
        Serve {
            child,
            base,
            http: reqwest::Client::new(),
        }
    }

    async fn call(&self, m: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(ADMIN, m, path, body).await
    }

    async fn call_as(
        &self,
        who: (&str, &str),
        m: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self
            .http
            .request(m, format!("{}{path}", self.base))
            .basic_auth(who.0, Some(who.1));
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let s = resp.status().as_u16();
        (s, resp.json().await.unwrap_or(Value::Null))
    }
}

async fn bulk(p: &Pouch, db: &str, prefix: &str, n: usize) {
    let docs: Vec<Value> = (0..n)
        .map(|i| json!({"_id": format!("{prefix}{i:04}"), "v": i}))
        .collect();
    let r = reqwest::Client::new()
        .post(format!("{}/_bulk_docs", p.db(db)))
        .json(&json!({ "docs": docs }))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

async fn count(p: &Pouch, db: &str) -> u64 {
    p.get(db).await.1["doc_count"].as_u64().unwrap_or(0)
}

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..600 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_replicates_between_two_pouchdb_servers() {
    deadline(150, "serve replicates between two pouchdb servers", async {
        let (a, b) = tokio::join!(Pouch::start(), Pouch::start());
        a.put("src", json!({})).await;
        a.put("jobs_replicator", json!({})).await;
        bulk(&a, "src", "d", 120).await;
        let dir = tempfile::tempdir().unwrap();
        let node = Serve::start(dir.path(), &a.db("jobs_replicator")).await;
        let (s, up) = node.call(reqwest::Method::GET, "/_up", None).await;
        assert_eq!((s, up["status"].as_str()), (200, Some("ok")));

        // One-shot: the reply comes when the data is there.
        let (s, done) = node
            .call(
                reqwest::Method::POST,
                "/_replicate",
                Some(json!({"source": a.db("src"), "target": b.db("once"), "create_target": true})),
            )
            .await;
        assert_eq!(s, 200, "{done}");
        assert_eq!(done["ok"], true);
        assert_eq!(done["history"][0]["docs_written"], 120, "{done}");
        assert!(done["source_last_seq"].is_string() || done["source_last_seq"].is_number());
        assert_eq!(count(&b, "once").await, 120);

        // Continuous: 202 with the replication id once running; later writes follow.
        let (s, started) = node
            .call(
                reqwest::Method::POST,
                "/_replicate",
                Some(json!({"source": a.db("src"), "target": b.db("live"),
                    "create_target": true, "continuous": true})),
            )
            .await;
        assert_eq!(s, 202, "{started}");
        let local_id = started["_local_id"].as_str().unwrap().to_owned();
        assert!(
            local_id.ends_with("+continuous+create_target"),
            "{local_id}"
        );
        bulk(&a, "src", "late", 30).await;
        until("the continuous copy", async || {
            (count(&b, "live").await == 150).then_some(())
        })
        .await;
        // CouchDB's job entries carry no state: a running one has a pid, and stats from its
        // first stats update on.
        let live = until("the job's stats", async || {
            let (_, jobs) = node
                .call(reqwest::Method::GET, "/_scheduler/jobs", None)
                .await;
            jobs["jobs"]
                .as_array()?
                .iter()
                .find(|j| j["id"] == local_id.as_str())
                .filter(|j| j["pid"].is_string() && j["info"].is_object())
                .cloned()
        })
        .await;
        // The replication id (with its `+`s) finds the job too.
        let (s, by_rep_id) = node
            .call(
                reqwest::Method::GET,
                &format!("/_scheduler/jobs/{local_id}"),
                None,
            )
            .await;
        assert_eq!((s, &by_rep_id["id"]), (200, &live["id"]), "{by_rep_id}");
        assert!(live["node"].is_string());
        let task = until("the active task", async || {
            let (_, t) = node
                .call(reqwest::Method::GET, "/_active_tasks", None)
                .await;
            t.as_array()?
                .iter()
                .find(|t| t["docs_written"].as_u64() == Some(150))
                .cloned()
        })
        .await;
        assert_eq!(task["type"], "replication");
        // The D.8 fields.
        for k in [
            "replication_id",
            "source",
            "target",
            "source_seq",
            "through_seq",
            "checkpoint_interval",
            "revisions_checked",
            "missing_revisions_found",
            "docs_read",
            "docs_written",
            "doc_write_failures",
            "changes_pending",
            "started_on",
            "updated_on",
            "node",
            "pid",
            "database",
            "doc_id",
        ] {
            assert!(task.get(k).is_some(), "task lacks `{k}`: {task}");
        }
        assert_eq!(task["replication_id"], local_id.as_str());
        assert_eq!(task["continuous"], true);

        // A plain user runs their own replication and sees only it.
        let bob = ("bob", "bob-pw");
        let (s, bobs) = node
            .call_as(
                bob,
                reqwest::Method::POST,
                "/_replicate",
                Some(json!({"source": a.db("src"), "target": b.db("bobs"),
                    "create_target": true, "continuous": true})),
            )
            .await;
        assert_eq!(s, 202, "{bobs}");
        let bob_tasks = until("bob's task", async || {
            let (_, t) = node
                .call_as(bob, reqwest::Method::GET, "/_active_tasks", None)
                .await;
            let t = t.as_array()?.clone();
            (!t.is_empty()).then_some(t)
        })
        .await;
        assert_eq!(bob_tasks.len(), 1, "{bob_tasks:?}");
        assert!(bob_tasks[0]["target"].as_str().unwrap().ends_with("/bobs/"));
        let (_, bob_jobs) = node
            .call_as(bob, reqwest::Method::GET, "/_scheduler/jobs", None)
            .await;
        assert_eq!(bob_jobs["total_rows"], 1, "{bob_jobs}");
        let (_, all_jobs) = node
            .call(reqwest::Method::GET, "/_scheduler/jobs", None)
            .await;
        assert_eq!(all_jobs["total_rows"], 2, "{all_jobs}");
        let (s, _) = node
            .call_as(
                bob,
                reqwest::Method::POST,
                "/_replicate",
                Some(json!({"cancel": true, "replication_id": local_id})),
            )
            .await;
        assert_eq!(s, 404, "bob must not cancel the admin's job");

        // A _replicator document replicates and is marked completed with stats.
        a.put(
            "jobs_replicator/viadoc",
            json!({"source": a.db("src"), "target": b.db("bydoc"),
            "create_target": true}),
        )
        .await;
        let doc = until("the doc's completed state", async || {
            let (_, d) = a.get("jobs_replicator/viadoc").await;
            (d["_replication_state"] == "completed").then_some(d)
        })
        .await;
        assert_eq!(count(&b, "bydoc").await, 150);
        assert_eq!(doc["_replication_stats"]["docs_written"], 150, "{doc}");
        let (s, d) = node
            .call(
                reqwest::Method::GET,
                "/_scheduler/docs/jobs_replicator/viadoc",
                None,
            )
            .await;
        assert_eq!((s, d["state"].as_str()), (200, Some("completed")), "{d}");

        // Cancel the continuous job, then stop the node with SIGTERM.
        let (s, c) = node
            .call(
                reqwest::Method::POST,
                "/_replicate",
                Some(json!({"cancel": true, "replication_id": local_id})),
            )
            .await;
        assert_eq!(s, 200, "{c}");
        let mut child = node.child;
        let pid = child.id().unwrap() as i32;
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .expect("serve did not stop on SIGTERM")
            .unwrap();
        assert!(status.success(), "{status:?}");
    })
    .await;
}
