//! The whole-server part of `cargo bench --bench tools`: a real CouchDB 3.4.3 source holding
//! `BENCH_ALL_DBS` (200) small databases of `BENCH_ALL_DBS_DOCS` (50) documents, copied into a second CouchDB 3.4.3 in the same run
//! - by one server job of ours (an in-process node with the settings of
//!   `couch-replicator replicate --all-dbs`, on the embedded store), into `db-NNN`;
//! - by the target CouchDB's own replicator, with one `_replicator` document per database
//!   (`create_target`), into `c-db-NNN`;
//!
//! each timed from the request until every database's replication completed (ours: the server
//! job is `completed`; CouchDB's: every document reads `_replication_state: completed`). Both
//! copies are then checked (every target database holds every document), a table is printed,
//! then `RESULT all_dbs_seconds_ours_over_couchdb = X` (target <= 0.5). Needs
//! `COUCHDB_PEER_SCRIPT` (the CouchDB 3.4.3 peer script). `BENCH_TRACE=1` prints our
//! progress every poll; `BENCH_ACCEPTORS=N` sets our node's `max_acceptors` (default 2).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::entry;
use crate::peers::Couch;
use couch_replicator::replicator::{
    RepState, Replicator, ReplicatorConfig, ReplicatorSettings, ServerState,
};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use futures::{StreamExt, TryStreamExt, stream};
use serde_json::{Value, json};

/// How often completion is checked.
const POLL: Duration = Duration::from_millis(100);
/// A copy that takes longer than this failed.
const LIMIT: Duration = Duration::from_secs(900);

/// Runs the whole-server comparison and prints its table and RESULT line.
pub async fn run() -> Result<(), String> {
    let dbs = entry::env_num("BENCH_ALL_DBS", 200);
    let docs = entry::env_num("BENCH_ALL_DBS_DOCS", 50);
    let (src, tgt) = (Couch::start()?, Couch::start()?);
    let http = reqwest::Client::new();
    fill(&http, &src, dbs, docs).await?;
    eprintln!("source: {dbs} databases of {docs} documents");

    let ours = ours(&src, &tgt).await?;
    eprintln!("ours: {ours:.2} s");
    let theirs = couchdb(&http, &src, &tgt, dbs).await?;
    eprintln!("CouchDB: {theirs:.2} s");
    for i in 0..dbs {
        for name in [db_name(i), format!("c-{}", db_name(i))] {
            let n = doc_count(&http, &tgt, &name).await?;
            if n != docs as u64 {
                return Err(format!("target {name} holds {n} of {docs} documents"));
            }
        }
    }
    println!("| copier | databases | docs each | seconds |");
    println!("|---|---|---|---|");
    println!("| ours: one server job | {dbs} | {docs} | {ours:.2} |");
    println!("| CouchDB 3.4.3: {dbs} _replicator docs | {dbs} | {docs} | {theirs:.2} |");
    println!(
        "RESULT all_dbs_seconds_ours_over_couchdb = {:.3}",
        ours / theirs
    );
    Ok(())
}

fn db_name(i: usize) -> String {
    format!("db-{i:03}")
}

fn check(r: reqwest::Response, what: &str) -> Result<reqwest::Response, String> {
    if r.status().is_success() {
        Ok(r)
    } else {
        Err(format!("{what}: {}", r.status()))
    }
}

/// Creates the source databases, 8 at a time.
async fn fill(http: &reqwest::Client, src: &Couch, dbs: usize, docs: usize) -> Result<(), String> {
    stream::iter(0..dbs)
        .map(|i| async move {
            let db = db_name(i);
            let r = http
                .put(src.url(&db))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            check(r, &format!("PUT {db}"))?;
            let body: Vec<Value> = (0..docs)
                .map(|d| json!({"_id": format!("doc-{d:04}"), "n": d, "text": "small"}))
                .collect();
            let r = http
                .post(src.url(&format!("{db}/_bulk_docs")))
                .json(&json!({ "docs": body }))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            check(r, &format!("_bulk_docs {db}")).map(|_| ())
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

/// Our copy: one server job on an in-process node; seconds until it completed.
async fn ours(src: &Couch, tgt: &Couch) -> Result<f64, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = EmbeddedStore::open(dir.path().join("bench.redb")).map_err(|e| e.to_string())?;
    let config = ReplicatorConfig {
        settings: ReplicatorSettings {
            startup_jitter: Duration::from_millis(100),
            max_acceptors: entry::env_num("BENCH_ACCEPTORS", 2),
            ..ReplicatorSettings::default()
        },
        ..ReplicatorConfig::new(Db::new(Arc::new(store)))
    };
    let node = Replicator::start(config).await.map_err(|e| e.to_string())?;
    let body = json!({"all_dbs": true, "source": src.url(""), "target": tgt.url(""),
        "create_target": true});
    let t0 = Instant::now();
    let job = node
        .add_server_job(&body, None)
        .await
        .map_err(|e| e.to_string())?;
    let out = loop {
        tokio::time::sleep(POLL).await;
        let v = node.server_job(&job.id).await.map_err(|e| e.to_string())?;
        if std::env::var_os("BENCH_TRACE").is_some() {
            let running = v
                .dbs
                .values()
                .filter(|d| d.state == RepState::Running)
                .count();
            eprintln!(
                "{:6.2} s: {} listed, {running} running, {} completed",
                t0.elapsed().as_secs_f64(),
                v.total,
                v.completed
            );
        }
        if v.state == ServerState::Completed {
            break match v.failed {
                0 => Ok(t0.elapsed().as_secs_f64()),
                n => Err(format!("{n} databases failed")),
            };
        }
        if t0.elapsed() > LIMIT {
            break Err(format!("ours: {} of {} done", v.completed, v.total));
        }
    };
    node.shutdown().await;
    out
}

/// CouchDB's copy: one `_replicator` document per database on the target; seconds until
/// every document is `completed`.
async fn couchdb(
    http: &reqwest::Client,
    src: &Couch,
    tgt: &Couch,
    dbs: usize,
) -> Result<f64, String> {
    let docs: Vec<Value> = (0..dbs)
        .map(|i| {
            let db = db_name(i);
            json!({"_id": format!("copy-{db}"), "source": src.url(&db),
                "target": tgt.url(&format!("c-{db}")), "create_target": true})
        })
        .collect();
    let t0 = Instant::now();
    let r = http
        .post(tgt.url("_replicator/_bulk_docs"))
        .json(&json!({ "docs": docs }))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    check(r, "_replicator/_bulk_docs")?;
    loop {
        tokio::time::sleep(POLL).await;
        let v: Value = http
            .get(tgt.url("_replicator/_all_docs?include_docs=true"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let rows = v["rows"].as_array().cloned().unwrap_or_default();
        let state = |s: &str| {
            rows.iter()
                .filter(|r| r["doc"]["_replication_state"] == s)
                .count()
        };
        if state("failed") > 0 {
            return Err(format!("CouchDB: {} replications failed", state("failed")));
        }
        if state("completed") == dbs {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > LIMIT {
            return Err(format!("CouchDB: {} of {dbs} done", state("completed")));
        }
    }
}

async fn doc_count(http: &reqwest::Client, c: &Couch, db: &str) -> Result<u64, String> {
    let v: Value = http
        .get(c.url(db))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    Ok(v["doc_count"].as_u64().unwrap_or(0))
}
