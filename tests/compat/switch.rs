//! The operator's switch from CouchDB 3.4.3's replicator to ours, on a real CouchDB
//! (`COUCHDB_PEER_SCRIPT`; skipped with a message when unset), with ours as the built `serve`
//! binary. CouchDB's doc processor follows every database named `_replicator` or
//! `…/_replicator` and no setting turns it off; each setup below leaves a document to exactly
//! one of the two replicators:
//!
//! - the README's move to `ours_replicator`, which CouchDB does not follow: a continuous
//!   replication CouchDB runs from `_replicator` (the control: the same checks see CouchDB's
//!   traces) is copied there and deleted from `_replicator`; ours then runs it, and CouchDB
//!   neither lists nor starts it nor moves its checkpoint;
//! - documents kept in `_replicator`, CouchDB with `cluster_start_period = 1000000000` (the
//!   README's setup: CouchDB never attaches, never lists the document) or `max_jobs = 0` (not
//!   recommended: CouchDB lists the job, never starts it); ours runs it and writes `completed`.
//!
//! CouchDB and ours have different server uuids here, so their replication ids and `_local`
//! checkpoint documents differ and tell who ran a replication.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::couchdb::CouchPeer;
use crate::support::serve::{ServeProcess, spawn_serve};
use crate::support::{deadline, wait_for};
use couch_replicator::replication::{Context, ReplicationSpec, compute_id};
use serde_json::{Value, json};

const COUCH_UUID: &str = "c0ffee00c0ffee00c0ffee00c0ffee00";
const OUR_UUID: &str = "0a5e0a5e0a5e0a5e0a5e0a5e0a5e0a5e";
const OUR_ADMIN: (&str, &str) = ("adm", "adm-secret");
/// Longer than CouchDB's doc processor takes to pick up a document (1-5 s once running).
const WATCH: Duration = Duration::from_secs(10);

/// A CouchDB and an admin client for it.
struct Peer {
    peer: CouchPeer,
    c: Couch,
    http: reqwest::Client,
}

/// What CouchDB's replicator shows of one document, watched over [`WATCH`].
#[derive(Debug, Default)]
struct Traces {
    /// A job for the document in CouchDB's `_scheduler/jobs`.
    listed: bool,
    /// That job had a `started` event, or `_scheduler/docs` said `running`.
    started: bool,
    /// `_rev` of the target's `_local` checkpoint under CouchDB's replication id.
    checkpoint: Option<String>,
}

impl Peer {
    async fn start(test: &str) -> Option<Self> {
        let peer = CouchPeer::start(test, Some(COUCH_UUID))?;
        peer.warm_up_sessions().await;
        let c = Couch::new(&peer.admin_url());
        Some(Self {
            peer,
            c,
            http: reqwest::Client::new(),
        })
    }

    async fn call(&self, m: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self
            .http
            .request(m, format!("{}{path}", self.peer.url()))
            .basic_auth("admin", Some("admin"))
            .timeout(Duration::from_secs(60));
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.expect("request to CouchDB");
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None).await.1
    }

    fn db(&self, name: &str) -> String {
        format!("{}/{name}", self.peer.admin_url())
    }

    /// A replication document from `src` to `tgt` on this CouchDB.
    fn rep(&self, tgt: &str, extra: Value) -> Value {
        let mut d =
            json!({"source": self.db("src"), "target": self.db(tgt), "create_target": true});
        for (k, v) in extra.as_object().into_iter().flatten() {
            d[k] = v.clone();
        }
        d
    }

    /// Source and target with `n` documents in the source.
    async fn setup(&self, n: usize) {
        self.c.create_db("src").await;
        self.c.bulk_insert("src", &numbered_docs("a", n)).await;
        // A single-node CouchDB may have created `_replicator` already (412).
        assert!(matches!(
            self.c.try_create_db("_replicator").await,
            201 | 202 | 412
        ));
    }

    async fn local_rev(&self, db: &str, id: &str) -> Option<String> {
        let (s, v) = self.c.get_doc(db, &format!("_local/{id}")).await;
        (s == 200).then(|| v["_rev"].as_str().unwrap_or_default().to_owned())
    }

    /// One look at CouchDB's scheduler and the target, added to `t`.
    async fn look(&self, db: &str, doc: &str, tgt: &str, couch_id: &str, t: &mut Traces) {
        let jobs = self.get("/_scheduler/jobs").await;
        for j in jobs["jobs"].as_array().into_iter().flatten() {
            if j["database"] == db && j["doc_id"] == doc {
                t.listed = true;
                let history = j["history"].as_array().into_iter().flatten();
                t.started |= history.into_iter().any(|h| h["type"] == "started");
            }
        }
        let path = format!("/_scheduler/docs/{}/{doc}", db.replace('/', "%2F"));
        let (s, d) = self.call(reqwest::Method::GET, &path, None).await;
        t.started |= s == 200 && d["state"] == "running";
        t.checkpoint = self.local_rev(tgt, couch_id).await;
    }

    /// One look.
    async fn watch_once(&self, db: &str, doc: &str, tgt: &str, couch_id: &str) -> Traces {
        let mut t = Traces::default();
        self.look(db, doc, tgt, couch_id, &mut t).await;
        t
    }

    /// What CouchDB shows of document `doc` of `db` (replicating into `tgt`) over [`WATCH`].
    async fn watch(&self, db: &str, doc: &str, tgt: &str, couch_id: &str) -> Traces {
        let mut t = Traces::default();
        let end = tokio::time::Instant::now() + WATCH;
        while tokio::time::Instant::now() < end {
            self.look(db, doc, tgt, couch_id, &mut t).await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        t
    }

    /// The README's second step: deletes from `_replicator` every non-design document of
    /// `ours_replicator` at the revision copied (`_all_docs` into `_bulk_docs`).
    async fn delete_copied(&self) {
        let all = self.get("/ours_replicator/_all_docs").await;
        let docs: Vec<Value> = all["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| !r["id"].as_str().unwrap_or("_").starts_with("_design/"))
            .map(|r| json!({"_id": r["id"], "_rev": r["value"]["rev"], "_deleted": true}))
            .collect();
        assert_eq!(docs.len(), 1, "{all}");
        let body = json!({ "docs": docs });
        let (s, v) = self
            .call(reqwest::Method::POST, "/_replicator/_bulk_docs", Some(body))
            .await;
        assert_eq!(s, 201, "{v}");
        assert_eq!(v[0]["ok"], true, "{v}");
    }

    /// `POST /_node/_local/_restart` (Erlang's `init:restart`: every application restarts and
    /// the config is re-read from the ini files, where `_config` writes went), then waits
    /// until `/_up` has failed and answered again: the restart takes seconds.
    async fn restart(&self) {
        let (s, v) = self
            .call(reqwest::Method::POST, "/_node/_local/_restart", None)
            .await;
        assert_eq!(s, 200, "{v}");
        let up = || async {
            let r = self
                .http
                .get(format!("{}/_up", self.peer.url()))
                .send()
                .await;
            r.is_ok_and(|r| r.status().is_success())
        };
        wait_for(60, "CouchDB going down", || async {
            (!up().await).then_some(())
        })
        .await;
        wait_for(60, "CouchDB up again", || async {
            up().await.then_some(())
        })
        .await;
        self.peer.warm_up_sessions().await;
    }

    /// `PUT /_node/_local/_config/replicator/{key}` (CouchDB also writes it to its local.ini).
    async fn set_replicator(&self, key: &str, value: &str) {
        let path = format!("/_node/_local/_config/replicator/{key}");
        let (s, v) = self
            .call(reqwest::Method::PUT, &path, Some(json!(value)))
            .await;
        assert_eq!(s, 200, "{path}: {v}");
    }
}

/// The base replication id of `doc` for a server with `uuid`.
async fn rep_id(doc: &Value, uuid: &str) -> String {
    let ctx = Context {
        server_uuid: uuid.into(),
        ..Context::default()
    };
    let spec = ReplicationSpec::from_json(doc).expect("replication document");
    compute_id(&spec, &ctx).await.expect("replication id").base
}

/// Our node (`serve`), following the `_replicator`-type database at `repdb_url`.
struct Ours {
    _dir: tempfile::TempDir,
    _node: ServeProcess,
    base: String,
    http: reqwest::Client,
}

impl Ours {
    async fn start(repdb_url: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ini = dir.path().join("ours.ini");
        std::fs::write(
            &ini,
            format!(
                "[couchdb]\nuuid = {OUR_UUID}\n[admins]\n{} = {}\n\
                 [replicator]\ninterval_sec = 1\nstartup_jitter = 100\n",
                OUR_ADMIN.0, OUR_ADMIN.1
            ),
        )
        .expect("write ours.ini");
        let data = dir.path().join("data");
        let args = ["--replicator-db", repdb_url];
        let node = spawn_serve(&data, Path::new(&ini), &args, "warn", Stdio::inherit()).await;
        let base = node.base.clone();
        Self {
            _dir: dir,
            _node: node,
            base,
            http: reqwest::Client::new(),
        }
    }

    /// The state of a document in our `_scheduler/docs`, if listed.
    async fn doc_state(&self, db: &str, doc: &str) -> Option<String> {
        let r = self
            .http
            .get(format!("{}/_scheduler/docs/{db}/{doc}", self.base))
            .basic_auth(OUR_ADMIN.0, Some(OUR_ADMIN.1))
            .send()
            .await
            .ok()?;
        let v: Value = r.json().await.ok()?;
        v["state"].as_str().map(str::to_owned)
    }
}

/// Without a setup CouchDB runs a `_replicator` document, and `watch` sees it; moved to
/// `ours_replicator` as the README says, the same document is run by ours alone.
#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_documents_run_on_ours_alone() {
    let Some(p) = Peer::start("couchdb_switch_move").await else {
        return;
    };
    deadline(240, "the switch by moving the documents", async {
        p.setup(5).await;
        let doc = p.rep(
            "tgt",
            json!({"continuous": true, "checkpoint_interval": 500}),
        );
        let (couch_id, our_id) = (rep_id(&doc, COUCH_UUID).await, rep_id(&doc, OUR_UUID).await);
        assert_ne!(couch_id, our_id);
        assert_eq!(p.c.put_doc("_replicator", "r", &doc).await.0, 201);

        // The control: CouchDB runs it, and the traces show it.
        wait_for(60, "CouchDB's checkpoint of the control", || async {
            p.local_rev("tgt", &couch_id).await
        })
        .await;
        let control = p.watch("_replicator", "r", "tgt", &couch_id).await;
        assert!(control.listed && control.started, "{control:?}");
        assert_eq!(p.c.db_info("tgt").await.1["doc_count"], 5);

        // The README's move: copy all but design documents, then delete the originals.
        let copy = json!({"source": p.db("_replicator"), "target": p.db("ours_replicator"),
            "create_target": true, "selector": {"_id": {"$regex": "^[^_]"}}});
        let (s, v) = p
            .call(reqwest::Method::POST, "/_replicate", Some(copy))
            .await;
        assert_eq!((s, v["ok"].clone()), (200, json!(true)), "{v}");
        let (_, r) = p.c.get_doc("_replicator", "r").await;
        p.delete_copied().await;
        let stopped = wait_for(60, "CouchDB stops the deleted document's job", || async {
            let t = p.watch_once("_replicator", "r", "tgt", &couch_id).await;
            (!t.listed).then_some(t)
        })
        .await;
        let (_, moved) = p.c.get_doc("ours_replicator", "r").await;
        assert_eq!(moved["_rev"], r["_rev"], "copied as it was");

        // Ours takes it over; new writes reach the target through ours only.
        let ours = Ours::start(&p.db("ours_replicator")).await;
        p.c.bulk_insert("src", &numbered_docs("b", 3)).await;
        wait_for(60, "ours runs the moved document", || async {
            let running =
                ours.doc_state("ours_replicator", "r").await.as_deref() == Some("running");
            let n = p.c.db_info("tgt").await.1["doc_count"].as_u64();
            let ck = p.local_rev("tgt", &our_id).await;
            (running && n == Some(8) && ck.is_some()).then_some(())
        })
        .await;
        let after = p.watch("ours_replicator", "r", "tgt", &couch_id).await;
        assert!(!after.listed && !after.started, "{after:?}");
        assert_eq!(
            after.checkpoint, stopped.checkpoint,
            "CouchDB's checkpoint did not move"
        );
        let (_, now) = p.c.get_doc("ours_replicator", "r").await;
        assert_eq!(
            now["_rev"], moved["_rev"],
            "nothing written to the document: {now}"
        );
        let (s, _) = p
            .call(
                reqwest::Method::GET,
                "/_scheduler/docs/ours_replicator/r",
                None,
            )
            .await;
        assert_ne!(s, 200, "CouchDB does not know ours_replicator/r");
    })
    .await;
}

/// A one-shot replication document in `_replicator`; its ids for CouchDB and for ours.
async fn put_shared_doc(p: &Peer) -> (String, String) {
    p.setup(5).await;
    let doc = p.rep("tgt", json!({}));
    let ids = (rep_id(&doc, COUCH_UUID).await, rep_id(&doc, OUR_UUID).await);
    assert_eq!(p.c.put_doc("_replicator", "r", &doc).await.0, 201);
    ids
}

/// Ours, following `_replicator` too, runs the document, writes `completed` and checkpoints.
async fn ours_completes_the_shared_doc(p: &Peer, our_id: &str) -> Ours {
    let ours = Ours::start(&p.db("_replicator")).await;
    wait_for(60, "ours completes the document", || async {
        let done = ours.doc_state("_replicator", "r").await.as_deref() == Some("completed");
        let (_, d) = p.c.get_doc("_replicator", "r").await;
        (done && d["_replication_state"] == "completed").then_some(())
    })
    .await;
    assert_eq!(p.c.db_info("tgt").await.1["doc_count"], 5);
    assert!(p.local_rev("tgt", our_id).await.is_some(), "our checkpoint");
    ours
}

/// CouchDB never started the document's job, checkpointed nothing under its id, and wrote
/// nothing into the document (one write: ours).
async fn assert_untouched(p: &Peer, couch_id: &str, t: &Traces) {
    assert!(!t.started && t.checkpoint.is_none(), "{t:?}");
    assert!(p.local_rev("src", couch_id).await.is_none());
    let (_, d) = p.c.get_doc("_replicator", "r?conflicts=true").await;
    let rev = d["_rev"].as_str().unwrap_or_default();
    assert!(rev.starts_with("2-"), "one write (ours): {d}");
    assert!(
        d.get("_conflicts").is_none() && d.get("_replication_id").is_none(),
        "{d}"
    );
}

/// `[replicator] max_jobs = 0` on CouchDB, both following `_replicator`: CouchDB lists the
/// document's job but never starts it; ours runs it.
#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_jobs_zero_leaves_a_shared_replicator_db_to_ours() {
    let Some(p) = Peer::start("couchdb_switch_max_jobs").await else {
        return;
    };
    deadline(240, "the switch by max_jobs = 0", async {
        p.set_replicator("max_jobs", "0").await;
        let (couch_id, our_id) = put_shared_doc(&p).await;
        // CouchDB has the job, pending, before ours starts.
        wait_for(60, "CouchDB has seen the document", || async {
            let t = p.watch_once("_replicator", "r", "tgt", &couch_id).await;
            t.listed.then_some(())
        })
        .await;
        let _ours = ours_completes_the_shared_doc(&p, &our_id).await;
        let t = p.watch("_replicator", "r", "tgt", &couch_id).await;
        assert!(t.listed, "{t:?}");
        assert_untouched(&p, &couch_id, &t).await;
    })
    .await;
}

/// `[replicator] cluster_start_period = 1000000000` on CouchDB (then restarted), both following
/// `_replicator`: CouchDB's doc processor never attaches to the database, so it does not even
/// list the document; ours runs it; CouchDB's `_replicate` still works.
#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_period_of_decades_leaves_a_shared_replicator_db_to_ours() {
    let Some(p) = Peer::start("couchdb_switch_start_period").await else {
        return;
    };
    deadline(240, "the switch by cluster_start_period", async {
        p.set_replicator("cluster_start_period", "1000000000").await;
        p.restart().await;
        let (couch_id, our_id) = put_shared_doc(&p).await;
        // Before ours starts, longer than CouchDB's default start delay (5 s): untouched.
        let before = p.watch("_replicator", "r", "tgt", &couch_id).await;
        assert!(
            !before.listed && !before.started && before.checkpoint.is_none(),
            "{before:?}"
        );
        let _ours = ours_completes_the_shared_doc(&p, &our_id).await;
        let t = p.watch("_replicator", "r", "tgt", &couch_id).await;
        assert!(!t.listed, "{t:?}");
        assert_untouched(&p, &couch_id, &t).await;
        let once = json!({"source": p.db("src"), "target": p.db("t2"), "create_target": true});
        let (s, v) = p
            .call(reqwest::Method::POST, "/_replicate", Some(once))
            .await;
        assert_eq!((s, v["ok"].clone()), (200, json!(true)), "{v}");
    })
    .await;
}
