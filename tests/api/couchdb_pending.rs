//! The `pending` state against a real CouchDB 3.4.3. CouchDB keeps a job pending while the
//! node runs `max_jobs` jobs; it starts a newly added job only while the total number of jobs
//! (the new one included) is below `max_jobs`, so with `max_jobs = 2` its first document runs
//! and every later one waits for the next reschedule (a minute after CouchDB started, then
//! every `interval`, set far away here). Our node with `max_jobs = 1` and no churn runs one job
//! and keeps the others pending, so both sides show one running and two pending documents
//! plus a pending transient job; their `_scheduler/jobs`, `_scheduler/docs` (list and single
//! document), `_active_tasks` and `_replicator` documents are compared by shape and by the
//! values that must agree.
//!
//! Then both sides rotate jobs (CouchDB restarted with a one-second `interval`, so its timer
//! takes it; a second node of ours with churn): a job the scheduler stopped to run another is
//! pending again and still shows the stats of its run.

use std::time::Duration;

use super::couchdb_shapes::{
    Couch, assert_same_history, assert_same_shape, both, by_doc, events, follow,
};
use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::http::{ADMIN, Node, fast_settings};
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::ReplicatorSettings;
use couch_replicator::replicator::replicator_db::doc_processor::DocProcessor;
use serde_json::{Value, json};

/// The database our doc processor follows: a name CouchDB does not take for a replicator
/// database (only `_replicator` and `…/_replicator` are), while ours accepts any name ending
/// in `_replicator` in `/_scheduler/docs/{db}/{doc}`.
const OURS: &str = "ours_replicator";

/// One side's views once it shows the scenario.
#[derive(Debug)]
struct Seen {
    docs: serde_json::Map<String, Value>,
    jobs: Value,
    tasks: Value,
}

impl Seen {
    fn docs_in(&self, state: &str) -> Vec<&str> {
        self.docs
            .iter()
            .filter(|(_, d)| d["state"] == state)
            .map(|(k, _)| k.as_str())
            .collect()
    }

    fn pending_doc(&self) -> &str {
        self.docs_in("pending")[0]
    }

    /// The `_scheduler/jobs` entry of a document (or of the transient job, `None`).
    fn job(&self, doc: Option<&str>) -> &Value {
        self.jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["doc_id"].as_str() == doc)
            .unwrap()
    }

    /// Itself once it shows one running and two pending documents, the transient job
    /// listed, the running job's task shown; else what it shows.
    fn ready(self) -> Result<Self, String> {
        let ok = self.docs.len() == 3
            && self.docs_in("running").len() == 1
            && self.docs_in("pending").len() == 2
            && self.jobs["total_rows"] == 4
            && self.tasks.as_array().is_some_and(|t| t.len() == 1);
        if ok {
            Ok(self)
        } else {
            Err(format!("docs {:#?}\njobs {:#}", self.docs, self.jobs))
        }
    }
}

async fn seen(mut get: impl AsyncFnMut(&str) -> Value) -> Seen {
    Seen {
        docs: by_doc(&get("/_scheduler/docs").await["docs"]),
        jobs: get("/_scheduler/jobs").await,
        tasks: get("/_active_tasks").await,
    }
}

/// Waits until `get` shows one running document, then posts the transient job with `post`.
async fn run_one_then_post(
    what: &str,
    mut get: impl AsyncFnMut(&str) -> Value,
    post: impl AsyncFnOnce(),
) {
    for _ in 0..300 {
        let docs = by_doc(&get("/_scheduler/docs").await["docs"]);
        if docs.values().any(|d| d["state"] == "running") {
            post().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what}: no document ever ran");
}

/// A node of ours with `max_jobs = 1` and `max_churn` as given, following `db` on CouchDB.
async fn ours(couch: &Couch, db: &str, max_churn: usize) -> (Node, DocProcessor) {
    let node = Node::with_settings(
        HttpConfig::default(),
        ReplicatorSettings {
            max_jobs: 1,
            max_churn,
            ..fast_settings()
        },
    )
    .await;
    let dp = follow(&node, couch, db);
    (node, dp)
}

/// A continuous replication from `a` to `target`.
fn rep(couch: &Couch, target: &str) -> Value {
    json!({"source": couch.db("a"), "target": couch.db(target), "continuous": true,
        "create_target": true})
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_jobs_and_documents_match_couchdb() {
    let Some(peer) = CouchPeer::start("couchdb pending shapes", None) else {
        return;
    };
    deadline(240, "couchdb pending shapes", async {
        peer.warm_up_sessions().await;
        let couch = Couch {
            peer,
            http: reqwest::Client::new(),
        };
        for (key, value) in [
            ("max_jobs", "2"),
            ("max_churn", "1"),
            ("interval", "600000"),
        ] {
            let path = format!("/_node/_local/_config/replicator/{key}");
            couch.put(&path, json!(value)).await;
        }
        for db in ["_replicator", "a", OURS] {
            couch.put(&format!("/{db}"), json!({})).await;
        }
        couch.put("/a/doc0", json!({"n": 0})).await;
        let (node, _dp) = ours(&couch, OURS, 0).await;
        for i in 1..=3 {
            let (c, o) = (rep(&couch, &format!("c{i}")), rep(&couch, &format!("o{i}")));
            couch.put(&format!("/_replicator/r{i}"), c).await;
            couch.put(&format!("/{OURS}/r{i}"), o).await;
        }
        run_one_then_post(
            "CouchDB",
            async |p| couch.get(p).await,
            async || {
                let r = couch
                    .http
                    .post(format!("{}/_replicate", couch.peer.url()))
                    .basic_auth("admin", Some("admin"))
                    .json(&rep(&couch, "ct"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 202);
            },
        )
        .await;
        run_one_then_post(
            "ours",
            async |p| node.get(p, Some(ADMIN)).await.1,
            async || {
                let body = rep(&couch, "ot").to_string();
                let (s, v) = node.post("/_replicate", Some(ADMIN), &body).await;
                assert_eq!(s, 202, "{v}");
            },
        )
        .await;
        let (c, o) = both(
            async || seen(async |p| couch.get(p).await).await.ready(),
            async || {
                seen(async |p| node.get(p, Some(ADMIN)).await.1)
                    .await
                    .ready()
            },
        )
        .await;
        compare_docs(&couch, &node, &c, &o).await;
        compare_jobs(&couch, &node, &c, &o).await;
        drop(node);
        rotated(&couch).await;
    })
    .await;
}

/// A job stopped by its scheduler and pending again: its `_scheduler/jobs` entry (found in
/// one listing) and a pending `_scheduler/docs` entry with stats.
async fn stopped_job(mut get: impl AsyncFnMut(&str) -> Value) -> Result<(Value, Value), String> {
    let jobs = get("/_scheduler/jobs").await;
    let docs = get("/_scheduler/docs").await;
    let job = jobs["jobs"].as_array().and_then(|a| {
        a.iter().find(|j| {
            j["pid"].is_null() && !j["info"].is_null() && events(j).contains(&"stopped".into())
        })
    });
    let doc = docs["docs"].as_array().and_then(|a| {
        a.iter()
            .find(|d| d["state"] == "pending" && !d["info"].is_null())
    });
    match (job, doc) {
        (Some(j), Some(d)) => Ok((j.clone(), d.clone())),
        _ => Err(format!("jobs {jobs:#}\ndocs {docs:#}")),
    }
}

/// Both schedulers rotate two continuous jobs through one slot; a stopped one is compared.
async fn rotated(couch: &Couch) {
    couch
        .put("/_node/_local/_config/replicator/interval", json!("1000"))
        .await;
    // The scheduler's timer only takes a new interval when it fires: restart CouchDB, and
    // know it restarted by its uptime (its `_up` may still answer just after the request).
    let uptime = async || -> Option<u64> {
        let url = format!("{}/_node/_local/_system", couch.peer.url());
        let r = couch.http.get(url).basic_auth("admin", Some("admin"));
        let v: Value = r.send().await.ok()?.json().await.ok()?;
        v["uptime"].as_u64()
    };
    let before = uptime().await.expect("CouchDB's uptime");
    let restart = Some(json!({}));
    couch
        .call(reqwest::Method::POST, "/_node/_local/_restart", restart)
        .await;
    let mut restarted = false;
    for _ in 0..300 {
        restarted = uptime().await.is_some_and(|u| u < before);
        if restarted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(restarted, "CouchDB did not come back after its restart");
    couch.put("/rot_replicator", json!({})).await;
    let (node, _dp) = ours(couch, "rot_replicator", 1).await;
    for i in 1..=2 {
        let doc = rep(couch, &format!("rot{i}"));
        couch.put(&format!("/rot_replicator/r{i}"), doc).await;
    }
    let ((cj, cd), (oj, od)) = both(
        async || stopped_job(async |p| couch.get(p).await).await,
        async || stopped_job(async |p| node.get(p, Some(ADMIN)).await.1).await,
    )
    .await;
    assert_same_shape("_scheduler/jobs stopped, pending", &cj, &oj);
    assert_same_shape("_scheduler/docs stopped, pending", &cd, &od);
    assert_same_history(&cj, &oj, "a stopped job");
}

/// `_scheduler/docs` (list, single document, `states=`) and the `_replicator` document of a
/// pending document.
async fn compare_docs(couch: &Couch, node: &Node, c: &Seen, o: &Seen) {
    let (cd, od) = (c.pending_doc(), o.pending_doc());
    assert_same_shape("_scheduler/docs pending", &c.docs[cd], &o.docs[od]);
    for k in ["state", "info", "error_count"] {
        assert_eq!(c.docs[cd][k], o.docs[od][k], "_scheduler/docs pending {k}");
    }
    let c_one = couch
        .get(&format!("/_scheduler/docs/_replicator/{cd}"))
        .await;
    let o_one = node
        .get(&format!("/_scheduler/docs/{OURS}/{od}"), Some(ADMIN))
        .await
        .1;
    assert_same_shape("_scheduler/docs/{db}/{doc} pending", &c_one, &o_one);
    assert_eq!(o_one["state"], "pending");
    let c_pending = couch.get("/_scheduler/docs?states=pending").await;
    let o_pending = node
        .get("/_scheduler/docs?states=pending", Some(ADMIN))
        .await
        .1;
    // `total_rows` counts every document, whatever `states` keeps.
    assert_eq!(c_pending["total_rows"], 3);
    assert_eq!(o_pending["total_rows"], 3);
    let states = |v: &Value| -> Vec<Value> {
        v["docs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["state"].clone())
            .collect()
    };
    assert_eq!(states(&c_pending), states(&o_pending));

    // Nothing is written back while pending. CouchDB stamps `owner` when the document is
    // written into a `_replicator` database (ours is not one to this CouchDB, so it has none).
    let mut c_doc = couch.get(&format!("/_replicator/{cd}")).await;
    assert_eq!(c_doc["owner"], "admin");
    c_doc.as_object_mut().unwrap().remove("owner");
    let o_doc = couch.get(&format!("/{OURS}/{od}")).await;
    assert_same_shape("_replicator pending document", &c_doc, &o_doc);
}

/// `_scheduler/jobs` (a pending persistent job and the pending transient one, lookup by
/// replication id) and `_active_tasks`.
async fn compare_jobs(couch: &Couch, node: &Node, c: &Seen, o: &Seen) {
    let (cd, od) = (c.pending_doc(), o.pending_doc());
    for (what, cj, oj) in [
        ("persistent", c.job(Some(cd)), o.job(Some(od))),
        ("transient", c.job(None), o.job(None)),
    ] {
        assert_same_shape(&format!("_scheduler/jobs pending {what}"), cj, oj);
        for k in ["pid", "info"] {
            assert_eq!(cj[k], oj[k], "_scheduler/jobs pending {what} {k}");
        }
        // The names differ (our admin is not CouchDB's); which of them are null must not.
        for k in ["user", "database", "doc_id"] {
            let what = format!("_scheduler/jobs pending {what} {k}");
            assert_eq!(cj[k].is_null(), oj[k].is_null(), "{what}");
        }
        assert_eq!(events(cj), events(oj), "history of {what}");
    }
    // A pending job is found by its replication id, before it ever ran.
    let id = |s: &Seen, d| s.job(Some(d))["id"].as_str().unwrap().replace('+', "%2B");
    let c_by_id = couch.get(&format!("/_scheduler/jobs/{}", id(c, cd))).await;
    let (s, o_by_id) = node
        .get(&format!("/_scheduler/jobs/{}", id(o, od)), Some(ADMIN))
        .await;
    assert_eq!(s, 200, "{o_by_id}");
    assert_same_shape("_scheduler/jobs/{id} pending", &c_by_id, &o_by_id);
    assert_eq!(o_by_id["doc_id"], od);
    let idle = |s: &Seen| -> usize {
        let jobs = s.jobs["jobs"].as_array().unwrap();
        jobs.iter().filter(|j| j["pid"].is_null()).count()
    };
    assert_eq!(idle(c), idle(o), "jobs without a process");
    // A pending job has no task.
    let has_task = |s: &Seen, d: &str| {
        let tasks = s.tasks.as_array().unwrap();
        tasks.iter().any(|t| t["doc_id"] == d)
    };
    assert!(!has_task(c, cd) && !has_task(o, od));
}
