//! `POST /_replicate` answers as CouchDB 3.4.3's: the same bodies sent to a real CouchDB
//! (`COUCHDB_PEER_SCRIPT`; skipped with a message when unset) and to our node (same server
//! uuid) give replies of the same shape (keys in the same order, values of the same JSON
//! types): one-shot, one-shot with nothing to do (`no_changes`), `doc_ids`; the same
//! `_local_id` for a continuous replication, answered at once even when the source is
//! unreachable (the job is listed under that id); a missing filter design document is a 404 `not_found`; a cancel returns once
//! the job has stopped.

use crate::support::couch::{Couch, numbered_docs};
use crate::support::couchdb::CouchPeer;
use crate::support::http::{ADMIN, Node, fast_settings};
use crate::support::{deadline, wait_for};
use couch_replicator::http::HttpConfig;
use couch_replicator::replication::{Context, RepId, ReplicationSpec, compute_id};
use couch_replicator::replicator::ReplicatorSettings;
use serde_json::{Value, json};

pub(super) const UUID: &str = "0ddba11c0ddba11c0ddba11c0ddba11c";

/// The shape of a JSON value: object keys in order with their shapes, an array's first
/// element, the JSON type of scalars.
pub(super) fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Array(m.iter().map(|(k, v)| json!([k, shape(v)])).collect()),
        Value::Array(a) => json!(["array", a.first().map(shape)]),
        Value::String(_) => json!("string"),
        Value::Number(_) => json!("number"),
        Value::Bool(_) => json!("bool"),
        Value::Null => json!("null"),
    }
}

pub(super) struct Both {
    pub(super) peer: CouchPeer,
    pub(super) c: Couch,
    pub(super) node: Node,
    pub(super) http: reqwest::Client,
}

impl Both {
    pub(super) async fn start(test: &str) -> Option<Self> {
        Self::start_with(test, fast_settings()).await
    }

    /// Both sides, ours with these settings.
    pub(super) async fn start_with(test: &str, settings: ReplicatorSettings) -> Option<Self> {
        let peer = CouchPeer::start(test, Some(UUID))?;
        let c = Couch::new(&peer.admin_url());
        peer.warm_up_sessions().await;
        let node = Node::with_uuid_and_settings(HttpConfig::default(), UUID, settings).await;
        Some(Self {
            peer,
            c,
            node,
            http: reqwest::Client::new(),
        })
    }

    pub(super) fn db(&self, name: &str) -> String {
        format!("{}/{name}", self.peer.admin_url())
    }

    pub(super) async fn couch(&self, body: &Value) -> (u16, Value) {
        let r = deadline(120, "CouchDB's _replicate", async {
            self.http
                .post(format!("{}/_replicate", self.peer.url()))
                .basic_auth("admin", Some("admin"))
                .json(body)
                .send()
                .await
                .expect("_replicate")
        })
        .await;
        (r.status().as_u16(), r.json().await.expect("JSON"))
    }

    pub(super) async fn ours(&self, body: &Value) -> (u16, Value) {
        deadline(
            120,
            "our _replicate",
            self.node
                .post("/_replicate", Some(ADMIN), &body.to_string()),
        )
        .await
    }
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_replies_have_couchdbs_shape() {
    let Some(b) = Both::start("replicate_api_one_shot").await else {
        return;
    };
    for db in ["src", "tgt_c", "tgt_o"] {
        b.c.create_db(db).await;
    }
    b.c.bulk_insert("src", &numbered_docs("a", 5)).await;
    let theirs = json!({"source": b.db("src"), "target": b.db("tgt_c")});
    let mine = json!({"source": b.db("src"), "target": b.db("tgt_o")});

    let (sc, rc) = b.couch(&theirs).await;
    let (so, ro) = b.ours(&mine).await;
    assert_eq!((sc, so), (200, 200), "{rc} {ro}");
    assert_eq!(shape(&ro), shape(&rc), "ours {ro}\nCouchDB {rc}");
    assert_eq!(ro["history"][0]["start_last_seq"], 0);
    // The session id is the run's: the one in the checkpoint it wrote.
    let id = compute_id(
        &ReplicationSpec::from_json(&mine).unwrap(),
        &Context {
            server_uuid: UUID.into(),
            ..Context::default()
        },
    )
    .await
    .unwrap();
    let (_, ck) = b.c.get_doc("src", &format!("_local/{}", id.base)).await;
    assert_eq!(ro["session_id"], ck["session_id"], "{ck}");
    assert_eq!(ro["history"][0]["session_id"], ck["session_id"]);

    // Nothing to do: `no_changes: true` and the checkpoint as it is.
    let (_, rc) = b.couch(&theirs).await;
    let (_, ro) = b.ours(&mine).await;
    assert_eq!(rc["no_changes"], true, "{rc}");
    assert_eq!(shape(&ro), shape(&rc), "ours {ro}\nCouchDB {rc}");

    // `doc_ids` replications repeat some stats at the top.
    let theirs =
        json!({"source": b.db("src"), "target": b.db("tgt_c"), "doc_ids": ["a00001", "a00002"]});
    let mine =
        json!({"source": b.db("src"), "target": b.db("tgt_o"), "doc_ids": ["a00001", "a00002"]});
    let (_, rc) = b.couch(&theirs).await;
    let (_, ro) = b.ours(&mine).await;
    assert!(rc.get("docs_written").is_some(), "{rc}");
    assert_eq!(shape(&ro), shape(&rc), "ours {ro}\nCouchDB {rc}");
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_filter_design_doc_is_not_found() {
    let Some(b) = Both::start("replicate_api_filter").await else {
        return;
    };
    b.c.create_db("src").await;
    let body = json!({"source": b.db("src"), "target": b.db("tgt"), "filter": "nope/f"});
    let (sc, rc) = b.couch(&body).await;
    let (so, ro) = b.ours(&body).await;
    assert_eq!((sc, &rc["error"]), (404, &json!("not_found")), "{rc}");
    assert_eq!((so, &ro["error"]), (404, &json!("not_found")), "{ro}");
    assert!(!ro.to_string().contains("admin:admin"), "{ro}");
    assert!(
        b.node.replicator.list().await.unwrap().is_empty(),
        "no job added"
    );
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_answers_at_once_and_cancel_returns_once_stopped() {
    let Some(b) = Both::start("replicate_api_continuous").await else {
        return;
    };
    for db in ["src", "tgt"] {
        b.c.create_db(db).await;
    }
    // An unreachable source: both answer with the same id at once; the job then crashes.
    let body = json!({"source": "http://127.0.0.1:1/nowhere", "target": b.db("tgt"),
        "continuous": true});
    let (sc, rc) = b.couch(&body).await;
    let (so, ro) = b.ours(&body).await;
    assert_eq!((sc, so), (202, 202), "{rc} {ro}");
    assert_eq!(shape(&ro), shape(&rc));
    assert_eq!(ro["_local_id"], rc["_local_id"], "the same replication id");
    let local_id = ro["_local_id"].as_str().unwrap().to_owned();
    wait_for(60, "our job listed under that id", || async {
        b.node
            .replicator
            .get(RepId::from_full(&local_id))
            .await
            .ok()
    })
    .await;
    let mut cancel = body.clone();
    cancel["cancel"] = json!(true);
    let (sc, rc) = b.couch(&cancel).await;
    let (so, ro) = b.ours(&cancel).await;
    assert_eq!((sc, so), (200, 200), "{rc} {ro}");
    assert_eq!(ro, rc);

    // A running one: the cancel answer comes once this node's job actor is gone.
    b.c.bulk_insert("src", &numbered_docs("a", 5)).await;
    let body = json!({"source": b.db("src"), "target": b.db("tgt"), "continuous": true});
    let (s, started) = b.ours(&body).await;
    assert_eq!(s, 202, "{started}");
    wait_for(60, "the docs replicated", || async {
        (b.c.db_info("tgt").await.1["doc_count"] == 5).then_some(())
    })
    .await;
    assert_eq!(b.node.replicator.job_sup().which_children().len(), 1);
    let mut cancel = body.clone();
    cancel["cancel"] = json!(true);
    let (s, r) = b.ours(&cancel).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r, json!({"ok": true, "_local_id": started["_local_id"]}));
    assert!(
        b.node.replicator.job_sup().which_children().is_empty(),
        "the job has stopped when the cancel is answered"
    );
}
