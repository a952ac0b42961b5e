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

use std::collections::BTreeSet;
use std::time::Duration;

use super::couchdb_shapes::{Couch, assert_same_shape, by_doc};
use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::http::{ADMIN, Node, fast_settings};
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::ReplicatorSettings;
use couch_replicator::replicator::doc_processor::{DocProcessor, DocProcessorConfig, ReplicatorDb};
use serde_json::{Value, json};

/// The database our doc processor follows: a name CouchDB does not take for a replicator
/// database (only `_replicator` and `…/_replicator` are), while ours accepts any name ending
/// in `_replicator` in `/_scheduler/docs/{db}/{doc}`.
const OURS: &str = "ours_replicator";

/// One side's views once it shows the scenario.
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

    /// One running and two pending documents, the transient job listed, the running job's
    /// task shown.
    fn ready(&self) -> bool {
        self.docs.len() == 3
            && self.docs_in("running").len() == 1
            && self.docs_in("pending").len() == 2
            && self.jobs["total_rows"] == 4
            && self.tasks.as_array().is_some_and(|t| t.len() == 1)
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

fn history_kinds(job: &Value) -> Vec<String> {
    job["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["type"].as_str().unwrap().to_owned())
        .collect()
}

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
        let node = Node::with_settings(
            HttpConfig::default(),
            ReplicatorSettings {
                max_jobs: 1,
                max_churn: 0,
                ..fast_settings()
            },
        )
        .await;
        let _dp = DocProcessor::start(
            node.replicator.clone(),
            DocProcessorConfig {
                dbs: vec![ReplicatorDb::from_url(&couch.db(OURS)).unwrap()],
                poll_timeout: Duration::from_millis(500),
                retry_delay: Duration::from_millis(200),
                rescan_interval: Duration::from_millis(300),
                tls: Default::default(),
            },
        )
        .unwrap();
        let rep = |target: String| {
            json!({"source": couch.db("a"), "target": target, "continuous": true,
                "create_target": true})
        };
        for i in 1..=3 {
            couch
                .put(
                    &format!("/_replicator/r{i}"),
                    rep(couch.db(&format!("c{i}"))),
                )
                .await;
            couch
                .put(&format!("/{OURS}/r{i}"), rep(couch.db(&format!("o{i}"))))
                .await;
        }
        run_one_then_post(
            "CouchDB",
            async |p| couch.get(p).await,
            async || {
                let r = couch
                    .http
                    .post(format!("{}/_replicate", couch.peer.url()))
                    .basic_auth("admin", Some("admin"))
                    .json(&rep(couch.db("ct")))
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
                let body = rep(couch.db("ot")).to_string();
                let (s, v) = node.post("/_replicate", Some(ADMIN), &body).await;
                assert_eq!(s, 202, "{v}");
            },
        )
        .await;

        let mut theirs = None;
        let mut ours = None;
        for _ in 0..300 {
            if theirs.is_none() {
                let v = seen(async |p| couch.get(p).await).await;
                theirs = v.ready().then_some(v);
            }
            if ours.is_none() {
                let v = seen(async |p| node.get(p, Some(ADMIN)).await.1).await;
                ours = v.ready().then_some(v);
            }
            if theirs.is_some() && ours.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let (Some(c), Some(o)) = (&theirs, &ours) else {
            let show = |s: &Option<Seen>| s.as_ref().map(|s| (s.docs.clone(), s.jobs.clone()));
            panic!(
                "scenario not reached: CouchDB {:#?}\nours {:#?}",
                show(&theirs),
                show(&ours)
            );
        };
        compare(&couch, &node, c, o).await;
        drop(node);
        rotated(&couch).await;
    })
    .await;
}

/// A job stopped by its scheduler and pending again: its `_scheduler/jobs` entry (found in
/// one listing) and a pending `_scheduler/docs` entry with stats.
async fn stopped_job(mut get: impl AsyncFnMut(&str) -> Value) -> Option<(Value, Value)> {
    let jobs = get("/_scheduler/jobs").await;
    let job = jobs["jobs"].as_array()?.iter().find(|j| {
        j["pid"].is_null() && !j["info"].is_null() && history_kinds(j).contains(&"stopped".into())
    })?;
    let docs = get("/_scheduler/docs").await;
    let doc = docs["docs"]
        .as_array()?
        .iter()
        .find(|d| d["state"] == "pending" && !d["info"].is_null())?;
    Some((job.clone(), doc.clone()))
}

async fn rotated(couch: &Couch) {
    couch
        .put("/_node/_local/_config/replicator/interval", json!("1000"))
        .await;
    // The scheduler's timer only takes a new interval when it fires: restart CouchDB.
    couch
        .call(
            reqwest::Method::POST,
            "/_node/_local/_restart",
            Some(json!({})),
        )
        .await;
    let node = Node::with_settings(
        HttpConfig::default(),
        ReplicatorSettings {
            max_jobs: 1,
            max_churn: 1,
            ..fast_settings()
        },
    )
    .await;
    let up = async || {
        for _ in 0..150 {
            let r = couch
                .http
                .get(format!("{}/_up", couch.peer.url()))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("CouchDB did not come back after its restart");
    };
    up().await;
    couch.put("/rot_replicator", json!({})).await;
    let _dp = DocProcessor::start(
        node.replicator.clone(),
        DocProcessorConfig {
            dbs: vec![ReplicatorDb::from_url(&couch.db("rot_replicator")).unwrap()],
            poll_timeout: Duration::from_millis(500),
            retry_delay: Duration::from_millis(200),
            rescan_interval: Duration::from_millis(300),
            tls: Default::default(),
        },
    )
    .unwrap();
    for i in 1..=2 {
        let doc = json!({"source": couch.db("a"), "target": couch.db(&format!("rot{i}")),
            "continuous": true, "create_target": true});
        couch.put(&format!("/rot_replicator/r{i}"), doc).await;
    }
    let mut theirs = None;
    let mut ours = None;
    for _ in 0..300 {
        if theirs.is_none() {
            theirs = stopped_job(async |p| couch.get(p).await).await;
        }
        if ours.is_none() {
            ours = stopped_job(async |p| node.get(p, Some(ADMIN)).await.1).await;
        }
        if theirs.is_some() && ours.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (Some((cj, cd)), Some((oj, od))) = (&theirs, &ours) else {
        panic!("no stopped job: CouchDB {theirs:#?}\nours {ours:#?}");
    };
    assert_same_shape("_scheduler/jobs stopped, pending", cj, oj);
    assert_same_shape("_scheduler/docs stopped, pending", cd, od);
    // Ours also records the re-enqueueing as `pending` (couch_jobs, as CouchDB 4.x).
    let kinds = |j: &Value| -> BTreeSet<String> {
        history_kinds(j)
            .into_iter()
            .filter(|k| k != "pending")
            .collect()
    };
    assert_eq!(kinds(cj), kinds(oj), "history of a stopped job");
}

async fn compare(couch: &Couch, node: &Node, c: &Seen, o: &Seen) {
    let (cd, od) = (c.pending_doc(), o.pending_doc());
    // `_scheduler/docs`: the list entry and the single document.
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

    // `_scheduler/jobs`: a pending persistent job and the pending transient one.
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
            assert_eq!(
                cj[k].is_null(),
                oj[k].is_null(),
                "_scheduler/jobs pending {what} {k}"
            );
        }
        assert_eq!(history_kinds(cj), history_kinds(oj), "history of {what}");
    }
    // A pending job is found by its replication id, before it ever ran.
    let c_id = c.job(Some(cd))["id"].as_str().unwrap().replace('+', "%2B");
    let o_id = o.job(Some(od))["id"].as_str().unwrap().replace('+', "%2B");
    let c_by_id = couch.get(&format!("/_scheduler/jobs/{c_id}")).await;
    let (s, o_by_id) = node
        .get(&format!("/_scheduler/jobs/{o_id}"), Some(ADMIN))
        .await;
    assert_eq!(s, 200, "{o_by_id}");
    assert_same_shape("_scheduler/jobs/{id} pending", &c_by_id, &o_by_id);
    assert_eq!(o_by_id["doc_id"], od);
    let nulls = |s: &Seen| -> usize {
        s.jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["pid"].is_null())
            .count()
    };
    assert_eq!(nulls(c), nulls(o), "jobs without a process");
    // A pending job has no task.
    let task_docs = |s: &Seen| -> BTreeSet<String> {
        s.tasks
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["doc_id"].to_string())
            .collect()
    };
    assert!(!task_docs(c).contains(&format!("\"{cd}\"")));
    assert!(!task_docs(o).contains(&format!("\"{od}\"")));

    // The `_replicator` document: nothing is written back while pending. CouchDB stamps
    // `owner` when the document is written into a `_replicator` database (ours is not one to
    // this CouchDB, so it has none).
    let mut c_doc = couch.get(&format!("/_replicator/{cd}")).await;
    assert_eq!(c_doc["owner"], "admin");
    c_doc.as_object_mut().unwrap().remove("owner");
    let o_doc = couch.get(&format!("/{OURS}/{od}")).await;
    assert_same_shape("_replicator pending document", &c_doc, &o_doc);
}
