//! The operator-facing JSON of our node against a real CouchDB 3.4.3: the same replications
//! run on CouchDB's replicator (its `_replicator` database) and on ours (a database our doc
//! processor follows on the same CouchDB, plus `POST /_replicate`), then `_scheduler/jobs`,
//! `_scheduler/docs`, `_active_tasks` and the written-back documents are compared by key sets
//! and value types, and by the values that must agree (states, error counts, event types).
//! States covered: running, crashing, completed, failed (persistent) and running (transient).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::http::{ADMIN, Node};
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::replicator_db::doc_processor::{
    DocProcessor, DocProcessorConfig, ReplicatorDb,
};
use serde_json::{Map, Value, json};

/// The type skeleton of a JSON value: objects keep their keys, arrays become the set of their
/// elements' skeletons, scalars their type name.
pub(super) fn shape(v: &Value) -> Value {
    match v {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
        Value::Array(a) => {
            let set: BTreeSet<String> = a.iter().map(|e| shape(e).to_string()).collect();
            json!(set.into_iter().collect::<Vec<_>>())
        }
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
    }
}

pub(super) fn assert_same_shape(what: &str, couch: &Value, ours: &Value) {
    assert_eq!(
        shape(couch),
        shape(ours),
        "{what}: shapes differ\nCouchDB: {couch:#}\nours: {ours:#}"
    );
}

pub(super) struct Couch {
    pub(super) peer: CouchPeer,
    pub(super) http: reqwest::Client,
}

impl Couch {
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.peer.url()))
            .basic_auth("admin", Some("admin"));
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send().await.unwrap().json().await.unwrap()
    }

    pub(super) async fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub(super) async fn put(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::PUT, path, Some(body)).await
    }

    pub(super) fn db(&self, name: &str) -> String {
        format!("{}/{name}", self.peer.admin_url())
    }
}

/// Entries of a list keyed by `doc_id` (transient ones under `transient`).
pub(super) fn by_doc(list: &Value) -> Map<String, Value> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let key = e["doc_id"].as_str().unwrap_or("transient").to_owned();
            (key, e.clone())
        })
        .collect()
}

/// The views once they show every state of the scenario; else what they show.
fn ready(views: Views) -> Result<Views, String> {
    let (docs, jobs, tasks) = &views;
    let state = |d: &str| docs.get(d).map(|e| e["state"].clone());
    let ok = state("run") == Some(json!("running"))
        && docs["run"]["info"]["docs_written"] == 3
        && state("crash") == Some(json!("crashing"))
        && state("done") == Some(json!("completed"))
        && state("dup") == Some(json!("failed"))
        && jobs
            .get("transient")
            .is_some_and(|j| j["info"]["docs_written"] == 3)
        && tasks.contains_key("run")
        && tasks.contains_key("transient");
    if ok {
        Ok(views)
    } else {
        Err(format!("{views:#?}"))
    }
}

/// Polls both sides until each has shown what it must (`theirs` on CouchDB, `ours` on our
/// node), returning what each showed.
pub(super) async fn both<T: std::fmt::Debug>(
    mut theirs: impl AsyncFnMut() -> Result<T, String>,
    mut ours: impl AsyncFnMut() -> Result<T, String>,
) -> (T, T) {
    let (mut c, mut o) = (Err(String::new()), Err(String::new()));
    for _ in 0..300 {
        if c.is_err() {
            c = theirs().await;
        }
        if o.is_err() {
            o = ours().await;
        }
        if let (Ok(_), Ok(_)) = (&c, &o) {
            return (c.unwrap(), o.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("not reached: CouchDB {c:#?}\nours {o:#?}");
}

/// Puts the scenario's documents into `db` on CouchDB, targets prefixed by `p`.
async fn scenario(couch: &Couch, db: &str, p: &str) {
    let src = couch.db("a");
    let run = json!({"source": src, "target": couch.db(&format!("{p}b")),
        "continuous": true, "create_target": true});
    couch.put(&format!("/{db}/run"), run.clone()).await;
    couch
        .put(
            &format!("/{db}/crash"),
            json!({"source": "http://127.0.0.1:9/a", "target": couch.db(&format!("{p}b")),
                "continuous": true, "retries_per_request": 1}),
        )
        .await;
    couch
        .put(
            &format!("/{db}/done"),
            json!({"source": src, "target": couch.db(&format!("{p}c")), "create_target": true}),
        )
        .await;
}

async fn wait_run(what: &str, mut get: impl AsyncFnMut() -> Value) {
    for _ in 0..300 {
        let docs = get().await;
        if by_doc(&docs["docs"])
            .get("run")
            .is_some_and(|d| d["state"] == "running")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what}: `run` never ran");
}

type Views = (Map<String, Value>, Map<String, Value>, Map<String, Value>);

async fn views(mut get: impl AsyncFnMut(&str) -> Value) -> Views {
    let docs = by_doc(&get("/_scheduler/docs").await["docs"]);
    let jobs = by_doc(&get("/_scheduler/jobs").await["jobs"]);
    let tasks = by_doc(&get("/_active_tasks").await);
    (docs, jobs, tasks)
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_task_and_document_shapes_match_couchdb() {
    let Some(peer) = CouchPeer::start("couchdb shapes", None) else {
        return;
    };
    deadline(240, "couchdb shapes", async {
        let couch = Couch {
            peer,
            http: reqwest::Client::new(),
        };
        couch.peer.warm_up_sessions().await;
        for db in ["_replicator", "a", "ourdocs"] {
            couch.put(&format!("/{db}"), json!({})).await;
        }
        for i in 0..3 {
            couch.put(&format!("/a/doc{i}"), json!({"n": i})).await;
        }
        let node = Node::start(HttpConfig::default()).await;
        let _dp = follow(&node, &couch, "ourdocs");

        scenario(&couch, "_replicator", "c").await;
        scenario(&couch, "ourdocs", "o").await;
        // The duplicate comes once `run` owns its replication id, on both sides.
        wait_run("CouchDB", async || couch.get("/_scheduler/docs").await).await;
        wait_run("ours", async || {
            node.get("/_scheduler/docs", Some(ADMIN)).await.1
        })
        .await;
        let run = couch.get("/_replicator/run").await;
        let mut dup = run.as_object().unwrap().clone();
        dup.retain(|k, _| !k.starts_with('_') && k != "owner");
        couch.put("/_replicator/dup", Value::Object(dup)).await;
        let ours_run = couch.get("/ourdocs/run").await;
        let mut dup = ours_run.as_object().unwrap().clone();
        dup.retain(|k, _| !k.starts_with('_'));
        couch.put("/ourdocs/dup", Value::Object(dup)).await;
        let transient = |p: &str| {
            json!({"source": couch.db("a"), "target": couch.db(&format!("{p}d")),
                "continuous": true, "create_target": true})
            .to_string()
        };
        let r = couch
            .http
            .post(format!("{}/_replicate", couch.peer.url()))
            .basic_auth("admin", Some("admin"))
            .header("content-type", "application/json")
            .body(transient("c"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let (s, _) = node.post("/_replicate", Some(ADMIN), &transient("o")).await;
        assert_eq!(s, 202);

        let (theirs, ours) = both(
            async || ready(views(async |p| couch.get(p).await).await),
            async || ready(views(async |p| node.get(p, Some(ADMIN)).await.1).await),
        )
        .await;
        compare_views(&theirs, &ours);
        written_back_and_refused(&couch).await;
    })
    .await;
}

/// `v` without what ours adds to CouchDB's shapes: a running job's `info.lag_seconds` (a
/// number, checked here, then removed).
fn without_extensions(what: &str, v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(info) = v.get_mut("info").and_then(Value::as_object_mut)
        && let Some(lag) = info.remove("lag_seconds")
    {
        assert!(lag.is_u64(), "{what}: lag_seconds {lag}");
    }
    v
}

/// `_scheduler/docs`, `_scheduler/jobs` and `_active_tasks` of both sides, state by state.
fn compare_views(theirs: &Views, ours: &Views) {
    let ((c_docs, c_jobs, c_tasks), (o_docs, o_jobs, o_tasks)) = (theirs, ours);
    let strip = |what: &str, m: &Map<String, Value>| {
        m.iter()
            .map(|(k, v)| (k.clone(), without_extensions(&format!("{what} {k}"), v)))
            .collect::<Map<String, Value>>()
    };
    let (o_docs, o_jobs) = (
        &strip("_scheduler/docs", o_docs),
        &strip("_scheduler/jobs", o_jobs),
    );
    for d in ["run", "crash", "done", "dup"] {
        assert_same_shape(&format!("_scheduler/docs {d}"), &c_docs[d], &o_docs[d]);
        for k in ["state", "error_count"] {
            assert_eq!(c_docs[d][k], o_docs[d][k], "_scheduler/docs {d} {k}");
        }
    }
    for j in ["run", "crash", "transient"] {
        assert_same_shape(&format!("_scheduler/jobs {j}"), &c_jobs[j], &o_jobs[j]);
        let (c, o) = (&c_jobs[j], &o_jobs[j]);
        assert_same_history(c, o, j);
    }
    assert!(!o_jobs.contains_key("done") && !o_jobs.contains_key("dup"));
    for t in ["run", "transient"] {
        assert_same_shape(&format!("_active_tasks {t}"), &c_tasks[t], &o_tasks[t]);
    }
    // Credentials are stripped from URLs, as CouchDB strips them.
    for v in [&o_docs["run"], &o_jobs["transient"], &o_tasks["run"]] {
        assert!(!v.to_string().contains("admin:"), "{v}");
        assert!(v["source"].as_str().unwrap().ends_with("/a/"), "{v}");
    }
}

/// The written-back documents, and invalid documents refused at write time.
async fn written_back_and_refused(couch: &Couch) {
    // The written-back documents.
    for d in ["done", "dup"] {
        let mut c = Value::Null;
        let mut o = Value::Null;
        for _ in 0..100 {
            c = couch.get(&format!("/_replicator/{d}")).await;
            o = couch.get(&format!("/ourdocs/{d}")).await;
            if c.get("_replication_state").is_some() && o.get("_replication_state").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_same_shape(&format!("_replicator/{d}"), &c, &o);
        assert_eq!(c["_replication_state"], o["_replication_state"]);
        assert_eq!(o["owner"], "admin");
    }

    // Invalid documents are refused at write time, as CouchDB refuses them.
    let bad = [
        json!({"source": couch.db("a"), "target": couch.db("x"), "worker_processes": "x"}),
        json!({"source": couch.db("a")}),
    ];
    for (i, doc) in bad.into_iter().enumerate() {
        let c = couch
            .put(&format!("/_replicator/bad{i}"), doc.clone())
            .await;
        let o = couch.put(&format!("/ourdocs/bad{i}"), doc).await;
        assert_eq!(c["error"], "forbidden", "{c}");
        assert_eq!(o["error"], "forbidden", "{o}");
    }
}

/// A doc processor of `node` following `db` on CouchDB.
pub(super) fn follow(node: &Node, couch: &Couch, db: &str) -> DocProcessor {
    DocProcessor::start(
        node.replicator.clone(),
        DocProcessorConfig {
            dbs: vec![ReplicatorDb::from_url(&couch.db(db)).unwrap()],
            poll_timeout: Duration::from_millis(500),
            retry_delay: Duration::from_millis(200),
            rescan_interval: Duration::from_millis(300),
            tls: Default::default(),
        },
    )
    .unwrap()
}

/// The event types of a `_scheduler/jobs` entry's history, newest first.
pub(super) fn events(job: &Value) -> Vec<String> {
    let history = job["history"].as_array().unwrap();
    history
        .iter()
        .map(|h| h["type"].as_str().unwrap().to_owned())
        .collect()
}

/// Both histories hold the same kinds of event, and the newest is the same event: tools read
/// a crash's reason from `history[0]`, so CouchDB shows no event for going back to pending.
pub(super) fn assert_same_history(theirs: &Value, ours: &Value, what: &str) {
    let kinds = |j: &Value| events(j).into_iter().collect::<BTreeSet<String>>();
    assert_eq!(kinds(theirs), kinds(ours), "history of {what}");
    let (c, o) = (&theirs["history"][0], &ours["history"][0]);
    assert_eq!(c["type"], o["type"], "history[0] of {what}");
    assert_eq!(
        c["reason"].is_string(),
        o["reason"].is_string(),
        "history[0] reason of {what}: {c} / {o}"
    );
}
