//! Switching between CouchDB 3.4.3's replicator and ours without a re-scan, against a real
//! CouchDB (`COUCHDB_PEER_SCRIPT`; skipped with a message when unset): with the same server uuid
//! each resumes from the other's `_local` checkpoints, both directions, for a plain, a
//! filtered and a continuous replication and after new writes (only those are transferred);
//! checkpoints written under older id versions are found and moved to the current id by both.

use crate::support::couch::{Couch, numbered_docs};
use crate::support::couchdb::CouchPeer;
use crate::support::{deadline, wait_for};
use couch_replicator::replication::id::rep_id::checkpoint_ids;
use couch_replicator::replication::{
    Context, ReplicationSpec, ReplicationStats, compute_id, replicate, start,
};
use serde_json::{Value, json};

const UUID: &str = "5a1c0ffee5a1c0ffee5a1c0ffee5a1c0";

struct Node {
    peer: CouchPeer,
    c: Couch,
    http: reqwest::Client,
}

impl Node {
    async fn start(test: &str) -> Option<Self> {
        let peer = CouchPeer::start(test, Some(UUID))?;
        let c = Couch::new(&peer.admin_url());
        peer.warm_up_sessions().await;
        Some(Self {
            peer,
            c,
            http: reqwest::Client::new(),
        })
    }

    /// A `_replicate` body from `src` to `tgt` on this CouchDB, with `extra` fields.
    fn body(&self, src: &str, tgt: &str, extra: Value) -> Value {
        let mut b = json!({
            "source": format!("{}/{src}", self.peer.admin_url()),
            "target": format!("{}/{tgt}", self.peer.admin_url()),
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        b
    }

    /// `POST /_replicate` on CouchDB (its own replicator).
    async fn couch_replicate(&self, body: &Value) -> Value {
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
        let status = r.status();
        let v: Value = r.json().await.expect("JSON reply");
        assert!(status.is_success(), "CouchDB _replicate: {status} {v}");
        v
    }

    async fn local(&self, db: &str, id: &str) -> Option<Value> {
        let (s, v) = self.c.get_doc(db, &format!("_local/{id}")).await;
        (s == 200).then_some(v)
    }

    async fn delete_local(&self, db: &str, id: &str) {
        if let Some(d) = self.local(db, id).await {
            let rev = d["_rev"].as_str().unwrap_or("0-1");
            let url = format!("{}/{db}/_local/{id}?rev={rev}", self.peer.url());
            let r = self
                .http
                .delete(url)
                .basic_auth("admin", Some("admin"))
                .send()
                .await
                .expect("DELETE _local");
            assert!(
                r.status().is_success(),
                "DELETE _local/{id}: {}",
                r.status()
            );
        }
    }

    /// Leaves, on both databases, only the checkpoint of `ids[0]`, stored under `to`.
    async fn move_checkpoint(&self, dbs: [&str; 2], ids: &[String], to: &str) {
        for db in dbs {
            let mut doc = self.local(db, &ids[0]).await.expect("a current checkpoint");
            for id in ids {
                self.delete_local(db, id).await;
            }
            let m = doc.as_object_mut().expect("object");
            m.remove("_id");
            m.remove("_rev");
            let (s, v) = self.c.put_doc(db, &format!("_local/{to}"), &doc).await;
            assert!(s == 201 || s == 200, "PUT _local/{to}: {s} {v}");
        }
    }
}

fn ctx() -> Context {
    Context {
        server_uuid: UUID.into(),
        ..Context::default()
    }
}

/// Our replicator, one-shot, for the same body.
async fn ours(body: &Value) -> ReplicationStats {
    let spec = ReplicationSpec::from_json(body).expect("spec");
    deadline(120, "our replication", replicate(spec, ctx()))
        .await
        .expect("our replication")
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The numeric part of a CouchDB 3 sequence (`"12-g1AAA..."`).
fn seq_num(v: &Value) -> u64 {
    match v {
        Value::String(s) => s
            .split('-')
            .next()
            .and_then(|x| x.parse().ok())
            .unwrap_or(0),
        other => other.as_u64().unwrap_or(0),
    }
}

async fn setup(node: &Node, docs: usize) {
    node.c.create_db("src").await;
    node.c.create_db("tgt").await;
    node.c.bulk_insert("src", &numbered_docs("a", docs)).await;
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_resumes_from_couchdb_and_couchdb_from_ours() {
    let Some(node) = Node::start("couchdb_handover_plain").await else {
        return;
    };
    setup(&node, 20).await;
    let body = node.body("src", "tgt", json!({}));

    // CouchDB first: it checks every revision.
    let first = node.couch_replicate(&body).await;
    let entry = &first["history"][0];
    assert_eq!(n(&entry["missing_checked"]), 20, "{first}");
    let id = compute_id(&ReplicationSpec::from_json(&body).unwrap(), &ctx())
        .await
        .unwrap();
    assert!(
        node.local("src", &id.base).await.is_some(),
        "CouchDB wrote its checkpoint under our id {id}"
    );

    // Ours with the same uuid: nothing checked again (counters continue CouchDB's).
    let s = ours(&body).await;
    assert_eq!(s.revisions_checked, 20, "{s:?}");
    assert_eq!(s.docs_written, 20, "{s:?}");
    assert_eq!(seq_num(&s.through_seq), seq_num(&first["source_last_seq"]));

    // New writes: ours transfers only those, and CouchDB then has nothing to do.
    node.c.bulk_insert("src", &numbered_docs("b", 5)).await;
    let s = ours(&body).await;
    assert_eq!(
        s.revisions_checked, 25,
        "only the 5 new revisions checked: {s:?}"
    );
    assert_eq!(s.docs_written, 25, "{s:?}");
    let again = node.couch_replicate(&body).await;
    assert_eq!(
        again["no_changes"], true,
        "CouchDB resumed from ours: {again}"
    );

    // More writes, CouchDB this time: it starts where our checkpoint is.
    node.c.bulk_insert("src", &numbered_docs("c", 3)).await;
    let ck = node.local("src", &id.base).await.unwrap();
    let third = node.couch_replicate(&body).await;
    let (h0, h1) = (&third["history"][0], &third["history"][1]);
    assert_eq!(h0["start_last_seq"], ck["source_last_seq"], "{third}");
    assert_eq!(
        n(&h0["missing_checked"]) - n(&h1["missing_checked"]),
        3,
        "{third}"
    );
    assert_eq!(
        n(&h0["docs_written"]) - n(&h1["docs_written"]),
        3,
        "{third}"
    );
    assert_eq!(node.c.db_info("tgt").await.1["doc_count"], 28);
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtered_replications_hand_over_both_ways() {
    let Some(node) = Node::start("couchdb_handover_filtered").await else {
        return;
    };
    node.c.create_db("src").await;
    node.c.create_db("tgt").await;
    let code = "function(doc, req) {\n  return doc.type === req.query.type;\n}";
    let ddoc = json!({"filters": {"by_type": code}});
    assert_eq!(node.c.put_doc("src", "_design/f", &ddoc).await.0, 201);
    let typed = |prefix: &str, k: usize, t: &str| -> Vec<Value> {
        (0..k)
            .map(|i| json!({"_id": format!("{prefix}{i}"), "type": t}))
            .collect()
    };
    node.c.bulk_insert("src", &typed("x", 10, "x")).await;
    node.c.bulk_insert("src", &typed("y", 10, "y")).await;
    let body = node.body(
        "src",
        "tgt",
        json!({"filter": "f/by_type", "query_params": {"type": "x"}}),
    );

    let first = node.couch_replicate(&body).await;
    assert_eq!(n(&first["history"][0]["docs_written"]), 10, "{first}");
    let s = ours(&body).await;
    assert_eq!(s.revisions_checked, 10, "nothing checked again: {s:?}");

    node.c.bulk_insert("src", &typed("x2-", 2, "x")).await;
    node.c.bulk_insert("src", &typed("y2-", 2, "y")).await;
    let s = ours(&body).await;
    assert_eq!(s.docs_written, 12, "only the 2 new matching docs: {s:?}");
    let again = node.couch_replicate(&body).await;
    assert_eq!(again["no_changes"], true, "{again}");
    assert_eq!(node.c.db_info("tgt").await.1["doc_count"], 12);
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_replications_hand_over_both_ways() {
    let Some(node) = Node::start("couchdb_handover_continuous").await else {
        return;
    };
    setup(&node, 15).await;
    let body = node.body("src", "tgt", json!({"checkpoint_interval": 200}));
    let mut continuous = body.clone();
    continuous["continuous"] = json!(true);
    let base = compute_id(&ReplicationSpec::from_json(&body).unwrap(), &ctx())
        .await
        .unwrap()
        .base;

    // CouchDB runs it continuously until its checkpoint covers the source, then stops.
    let r = node.couch_replicate(&continuous).await;
    assert_eq!(r["_local_id"], format!("{base}+continuous"), "{r}");
    let src_seq = seq_num(&node.c.db_info("src").await.1["update_seq"]);
    wait_for(60, "CouchDB's continuous checkpoint", || async {
        let d = node.local("src", &base).await?;
        (seq_num(&d["source_last_seq"]) >= src_seq).then_some(())
    })
    .await;
    let mut cancel = continuous.clone();
    cancel["cancel"] = json!(true);
    node.couch_replicate(&cancel).await;

    // Ours (one-shot, same base id) has nothing to check.
    let s = ours(&body).await;
    assert_eq!(s.revisions_checked, 15, "{s:?}");

    // Ours continuous picks up new writes, checkpoints when stopped; CouchDB then resumes.
    let h = start(ReplicationSpec::from_json(&continuous).unwrap(), ctx());
    node.c.bulk_insert("src", &numbered_docs("n", 4)).await;
    let mut progress = h.progress();
    deadline(60, "our continuous run writes the 4 new docs", async {
        while progress.borrow().docs_written < 19 {
            progress.changed().await.unwrap();
        }
    })
    .await;
    h.stop();
    let s = deadline(60, "our stop", h.wait()).await.unwrap();
    assert_eq!(s.revisions_checked, 19, "{s:?}");
    let again = node.couch_replicate(&body).await;
    assert_eq!(again["no_changes"], true, "{again}");
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_under_older_id_versions_are_found_and_migrated_by_both() {
    let Some(node) = Node::start("couchdb_handover_versions").await else {
        return;
    };
    setup(&node, 10).await;
    let body = node.body("src", "tgt", json!({}));
    let spec = ReplicationSpec::from_json(&body).unwrap();
    let ids = checkpoint_ids(UUID, &spec, None);
    let s = ours(&body).await;
    assert_eq!(s.revisions_checked, 10);

    // Our checkpoint moved to the id of version 3, 2 or 1: CouchDB finds it and moves it back.
    for (version, old) in [(3, &ids[1]), (2, &ids[2]), (1, &ids[3])] {
        node.move_checkpoint(["src", "tgt"], &ids, old).await;
        let r = node.couch_replicate(&body).await;
        assert_eq!(
            r["no_changes"], true,
            "CouchDB found our v{version} id: {r}"
        );
        for db in ["src", "tgt"] {
            assert!(
                node.local(db, &ids[0]).await.is_some(),
                "v{version} migrated on {db}"
            );
        }
    }

    // CouchDB's checkpoint under an older id: ours finds it and moves it to the current id.
    // (A fresh CouchDB checkpoint: after a migration CouchDB does not know the revision of
    // the copy it wrote, so it is not asked to checkpoint over it.)
    for db in ["src", "tgt"] {
        for id in &ids {
            node.delete_local(db, id).await;
        }
    }
    node.c.bulk_insert("src", &numbered_docs("b", 2)).await;
    let r = node.couch_replicate(&body).await;
    assert_eq!(n(&r["history"][0]["missing_checked"]), 12, "{r}");
    for (version, old) in [(3, &ids[1]), (1, &ids[3])] {
        node.move_checkpoint(["src", "tgt"], &ids, old).await;
        let s = ours(&body).await;
        assert_eq!(
            s.revisions_checked, 12,
            "found the v{version} checkpoint: {s:?}"
        );
        for db in ["src", "tgt"] {
            assert!(
                node.local(db, &ids[0]).await.is_some(),
                "v{version} migrated on {db}"
            );
        }
    }
    // With `create_target` on the existing target (412): the source's current id is read
    // while the target is created, the older versions after; still found and migrated.
    let with_create = node.body("src", "tgt", json!({"create_target": true}));
    let spec = ReplicationSpec::from_json(&with_create).unwrap();
    assert_eq!(checkpoint_ids(UUID, &spec, None), ids, "same ids");
    node.move_checkpoint(["src", "tgt"], &ids, &ids[2]).await;
    let s = ours(&with_create).await;
    assert_eq!(s.revisions_checked, 12, "found the v2 checkpoint: {s:?}");
    for db in ["src", "tgt"] {
        assert!(
            node.local(db, &ids[0]).await.is_some(),
            "v2 migrated on {db}"
        );
    }
}
