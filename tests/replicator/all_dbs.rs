//! Whole-server replication (`server_jobs`): one server job copies every matching database
//! of a pouchdb-server or a real CouchDB 3.4.3 into another server through per-database
//! replications, picks up databases created while it runs (`_db_updates` on CouchDB, an
//! `_all_dbs` poll on pouchdb-server), drops deleted ones (deleting the target when asked)
//! and reports progress over all databases.

use std::sync::Arc;
use std::time::Duration;

use couch_replicator::replicator::replicator_db::doc_processor::{
    DocProcessor, DocProcessorConfig, ReplicatorDb,
};
use couch_replicator::replicator::{
    HistoryKind, Replicator, ServerJobId, ServerJobView, ServerState,
};
use serde_json::{Value, json};

use crate::support::couch::{Couch, numbered_docs};
use crate::support::couchdb::CouchPeer;
use crate::support::nodes::Nodes;
use crate::support::replicator::{Pouch, test_settings};
use crate::support::wait_for;

/// Waits until server job `id` satisfies `ok`, returning its view.
async fn wait_server(
    rep: &Replicator,
    id: &ServerJobId,
    secs: u64,
    what: &str,
    ok: impl Fn(&ServerJobView) -> bool,
) -> ServerJobView {
    wait_for(secs, what, || async {
        let v = rep.server_job(id).await.ok()?;
        ok(&v).then_some(v)
    })
    .await
}

/// Creates `n` databases `db-000..` with `docs` documents each.
async fn fill(c: &Couch, n: usize, docs: usize) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..n {
        let db = format!("db-{i:03}");
        c.create_db(&db).await;
        c.bulk_insert(&db, &numbered_docs(&format!("{db}-"), docs))
            .await;
        names.push(db);
    }
    names
}

/// Waits until target `db` exists and holds `n` documents.
async fn wait_doc_count(c: &Couch, db: &str, n: u64, secs: u64) {
    wait_for(secs, &format!("{db} to hold {n} docs"), || async {
        let (s, v) = c.db_info(db).await;
        (s == 200 && v["doc_count"].as_u64() == Some(n)).then_some(())
    })
    .await
}

fn body(src: &str, tgt: &str, extra: Value) -> Value {
    let mut b = json!({"all_dbs": true, "source": src, "target": tgt, "create_target": true});
    if let (Some(m), Value::Object(e)) = (b.as_object_mut(), extra) {
        m.extend(e);
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_job_copies_fifty_pouchdb_databases() {
    let (src, tgt) = tokio::join!(Pouch::start(), Pouch::start());
    let (cs, ct) = (Couch::new(&src.url("")), Couch::new(&tgt.url("")));
    let names = fill(&cs, 50, 10).await;
    cs.create_db("other").await;
    let nodes = Nodes::on_disk();
    let rep = nodes.start("n1", test_settings()).await;
    let b = body(&src.url(""), &tgt.url(""), json!({"include": ["db-*"]}));
    let job = rep.add_server_job(&b, None).await.unwrap();
    // Adding it again is the same job.
    assert_eq!(rep.add_server_job(&b, None).await.unwrap().id, job.id);
    let done = wait_server(&rep, &job.id, 120, "all 50 databases", |v| {
        v.state == ServerState::Completed
    })
    .await;
    assert_eq!((done.total, done.completed, done.failed), (50, 50, 0));
    // A database job that ran twice (stopped or crashed on a loaded machine) counts, as
    // CouchDB's do, from its checkpoint: documents written after it and before the stop are
    // on the target but not counted again. Only without restarts must every one be counted.
    let restarted = rep
        .list()
        .await
        .unwrap()
        .iter()
        .filter(|v| {
            v.history
                .iter()
                .filter(|h| h.kind == HistoryKind::Started)
                .count()
                > 1
        })
        .count();
    match restarted {
        0 => assert_eq!(done.docs_written, 500),
        n => assert!(
            done.docs_written <= 500,
            "{} written with {n} jobs restarted",
            done.docs_written
        ),
    }
    for db in &names {
        assert_eq!(cs.assert_same(db, &ct, db).await, 10, "{db}");
    }
    assert_eq!(ct.db_info("other").await.0, 404, "excluded database copied");
    rep.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_job_picks_up_a_new_pouchdb_database() {
    let (src, tgt) = tokio::join!(Pouch::start(), Pouch::start());
    let (cs, ct) = (Couch::new(&src.url("")), Couch::new(&tgt.url("")));
    fill(&cs, 3, 5).await;
    let nodes = Nodes::on_disk();
    let rep = nodes.start("n1", test_settings()).await;
    let b = body(&src.url(""), &tgt.url(""), json!({"continuous": true}));
    let job = rep.add_server_job(&b, None).await.unwrap();
    wait_server(&rep, &job.id, 60, "3 databases running", |v| v.total == 3).await;
    cs.create_db("late").await;
    cs.bulk_insert("late", &numbered_docs("late-", 7)).await;
    wait_doc_count(&ct, "late", 7, 60).await;
    assert_eq!(cs.assert_same("late", &ct, "late").await, 7);
    let v = wait_server(&rep, &job.id, 30, "4 databases", |v| v.total == 4).await;
    assert!(v.continuous && v.state == ServerState::Running);
    // pouchdb-server has no `_db_updates`: the job polls `_all_dbs`.
    assert_eq!(v.follows.as_deref(), Some("_all_dbs"));
    rep.cancel_server_job(&job.id).await.unwrap();
    // A turn in flight may re-add a replication after the cancel; the worker then removes it.
    let group = format!("_server/{}", job.id);
    wait_for(30, "the job's replications to go", || async {
        let left = rep.list().await.ok()?;
        (!left.iter().any(|j| j.database.as_deref() == Some(&group))).then_some(())
    })
    .await;
    assert!(rep.server_job(&job.id).await.is_err());
    rep.shutdown().await;
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_job_on_couchdb_follows_db_updates() {
    let test = "server_job_on_couchdb_follows_db_updates";
    let Some(a) = CouchPeer::start(test, None) else {
        return;
    };
    let Some(b) = CouchPeer::start(test, None) else {
        return;
    };
    a.warm_up_sessions().await;
    b.warm_up_sessions().await;
    let (cs, ct) = (Couch::new(&a.admin_url()), Couch::new(&b.admin_url()));
    // CouchDB answers `_db_updates` only once its `_global_changes` database exists.
    cs.create_db("_global_changes").await;
    let names = fill(&cs, 50, 5).await;
    let nodes = Nodes::on_disk();
    let rep = nodes.start("n1", test_settings()).await;
    let extra = json!({"continuous": true, "delete_target_on_source_delete": true});
    let job = rep
        .add_server_job(&body(&a.admin_url(), &b.admin_url(), extra), None)
        .await
        .unwrap();
    for db in &names {
        wait_doc_count(&ct, db, 5, 120).await;
        assert_eq!(cs.assert_same(db, &ct, db).await, 5, "{db}");
    }
    // System databases (`_users`, `_replicator` exist on the source) are not copied unless
    // named.
    let v = rep.server_job(&job.id).await.unwrap();
    assert!(
        v.dbs.keys().all(|k| !k.starts_with('_')),
        "{:?}",
        v.dbs.keys()
    );
    cs.create_db("late").await;
    cs.bulk_insert("late", &numbered_docs("late-", 3)).await;
    wait_doc_count(&ct, "late", 3, 60).await;
    assert_eq!(cs.assert_same("late", &ct, "late").await, 3);
    assert_eq!(cs.delete_db("db-000").await, 200);
    wait_for(60, "target db-000 deleted", || async {
        (ct.db_info("db-000").await.0 == 404).then_some(())
    })
    .await;
    let v = wait_server(&rep, &job.id, 30, "progress of 50 databases", |v| {
        v.total == 50 && v.docs_written == 49 * 5 + 3
    })
    .await;
    assert!(!v.dbs.contains_key("db-000") && v.dbs.contains_key("late"));
    assert_eq!(v.follows.as_deref(), Some("_db_updates"));
    // The view holds no credentials, nor does its JSON.
    assert_eq!(v.source, a.url());
    assert!(!serde_json::to_string(&v).unwrap().contains("admin:admin"));
    rep.cancel_server_job(&job.id).await.unwrap();
    rep.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replicator_document_starts_and_stops_a_server_job() {
    let (src, tgt) = tokio::join!(Pouch::start(), Pouch::start());
    let (cs, ct) = (Couch::new(&src.url("")), Couch::new(&tgt.url("")));
    let names = fill(&cs, 3, 4).await;
    // The `_replicator` database lives on the target server, which is not listed.
    ct.create_db("jobs_replicator").await;
    let nodes = Nodes::on_disk();
    let rep = Arc::new(nodes.start("n1", test_settings()).await);
    let cfg = DocProcessorConfig {
        dbs: vec![ReplicatorDb::from_url(&tgt.url("jobs_replicator")).unwrap()],
        poll_timeout: Duration::from_millis(500),
        retry_delay: Duration::from_millis(200),
        rescan_interval: Duration::from_millis(500),
        ..DocProcessorConfig::default()
    };
    let dp = DocProcessor::start(rep.clone(), cfg).unwrap();
    let doc = body(&src.url(""), &tgt.url(""), json!({"include": ["db-*"]}));
    let (s, put) = ct.put_doc("jobs_replicator", "everything", &doc).await;
    assert_eq!(s, 201, "{put}");
    let id = &ServerJobId::from("jobs_replicator|everything");
    let done = wait_server(&rep, id, 60, "the document's server job", |v| {
        v.state == ServerState::Completed
    })
    .await;
    assert_eq!((done.total, done.completed), (3, 3));
    for db in &names {
        assert_eq!(cs.assert_same(db, &ct, db).await, 4, "{db}");
    }
    // The document gets the job's outcome, as a replication's document does.
    let written = wait_for(30, "the document's state", || async {
        let (_, d) = ct.get_doc("jobs_replicator", "everything").await;
        (d["_replication_state"] == "completed").then_some(d)
    })
    .await;
    assert_eq!(
        written["_replication_stats"]["docs_written"], 12,
        "{written}"
    );
    assert_eq!(written["_replication_stats"]["docs_read"], 12, "{written}");
    assert_ne!(written["_rev"], put["rev"]);
    let rev = written["_rev"].as_str().unwrap();
    // `delete_db` is a plain DELETE of the path: here the document.
    let s = ct
        .delete_db(&format!("jobs_replicator/everything?rev={rev}"))
        .await;
    assert_eq!(s, 200);
    wait_for(30, "the server job and its replications to go", || async {
        let gone = rep.server_job(id).await.is_err();
        let jobs = rep.list().await.ok()?;
        (gone && jobs.is_empty()).then_some(())
    })
    .await;
    dp.stop().await;
    if let Ok(rep) = Arc::try_unwrap(rep) {
        rep.shutdown().await;
    }
}

/// A node that stops gracefully hands its server job back at once: the other node runs it
/// long before the activity timeout (60 s here) could, and the copy goes on there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_stop_hands_the_server_job_to_another_node_at_once() {
    let (src, tgt) = tokio::join!(Pouch::start(), Pouch::start());
    let (cs, ct) = (Couch::new(&src.url("")), Couch::new(&tgt.url("")));
    fill(&cs, 2, 5).await;
    let nodes = Nodes::on_disk();
    let settings = couch_replicator::replicator::ReplicatorSettings {
        job_timeout: Duration::from_secs(60),
        ..test_settings()
    };
    let n1 = nodes.start("n1", settings.clone()).await;
    let b = body(&src.url(""), &tgt.url(""), json!({"continuous": true}));
    let job = n1.add_server_job(&b, None).await.unwrap();
    wait_server(&n1, &job.id, 60, "the job running on n1", |v| {
        v.total == 2 && v.node.as_ref().is_some_and(|n| n == "n1")
    })
    .await;
    let n2 = nodes.start("n2", settings).await;
    let t0 = std::time::Instant::now();
    n1.shutdown().await;
    wait_server(&n2, &job.id, 20, "the job running on n2", |v| {
        v.node.as_ref().is_some_and(|n| n == "n2") && v.state == ServerState::Running
    })
    .await;
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    cs.create_db("late").await;
    cs.bulk_insert("late", &numbered_docs("late-", 3)).await;
    wait_doc_count(&ct, "late", 3, 60).await;
    n2.cancel_server_job(&job.id).await.unwrap();
    n2.shutdown().await;
}
