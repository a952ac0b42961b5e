//! Crash-restart torture (issue 7, item 1): a real `couch-replicator serve` process runs a
//! `_replicator`-document replication between two pouchdb-servers (a source with conflicts,
//! deletions and attachments) and is SIGKILLed at seeded random moments, then restarted on the
//! same data dir. While it is dead the `_local` checkpoint on the target is checked: every
//! document whose source sequence is at or below the claimed `source_last_seq` must have all
//! its leaves on the target. At the end the target equals the source leaf by leaf (deleted
//! flags, attachment digests) and the store file reopens.
//!
//! CI size: 5 kills, 5,000 docs. `RELIABILITY_LONG=1`: 20 kills, 50,000 docs. Overrides:
//! `RELIABILITY_SEED`, `RELIABILITY_KILLS`, `RELIABILITY_DOCS`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::couch::Couch;
use crate::support::server::PouchServer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const ADMIN: (&str, &str) = ("admin", "kill9-secret");

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Serve {
    child: tokio::process::Child,
    base: String,
}

async fn start_serve(dir: &Path, repdb: &str) -> Serve {
    let cfg = dir.join("node.ini");
    std::fs::write(
        &cfg,
        format!(
            "[replicator]\ninterval_sec = 1\nstartup_jitter = 100\nstats_update_interval_sec = 1\njob_timeout_sec = 3\n\
             [admins]\n{} = {}\n[replicator_dbs]\njobs_replicator = {repdb}\n",
            ADMIN.0, ADMIN.1
        ),
    )
    .unwrap();
    let log = std::env::var("RELIABILITY_LOG").unwrap_or_else(|_| "warn".into());
    let crate::support::serve::ServeProcess { child, base } =
        crate::support::serve::spawn_serve(&dir.join("data"), &cfg, &[], &log, Stdio::inherit())
            .await;
    Serve { child, base }
}

/// Fills `db` with `n` docs: every 10th with an attachment, every 20th with a conflicting
/// sibling branch, every 15th deleted.
async fn fill_source(c: &Couch, db: &str, n: usize) {
    let docs: Vec<Value> = (0..n)
        .map(|i| {
            let mut d = json!({"_id": format!("d{i:06}"), "n": i, "text": format!("value {i}")});
            if i % 10 == 0 {
                use base64::Engine;
                let data = base64::engine::general_purpose::STANDARD
                    .encode(format!("attachment body of {i} ").repeat(1 + i % 7));
                d["_attachments"] = json!({"a.txt": {"content_type": "text/plain", "data": data}});
            }
            d
        })
        .collect();
    let revs = c.bulk_insert(db, &docs).await;
    let conflicts: Vec<Value> = (0..n)
        .step_by(20)
        .map(|i| {
            json!({"_id": format!("d{i:06}"), "_rev": format!("1-{:032x}", i as u128 + 7),
                "n": i, "branch": "other"})
        })
        .collect();
    for chunk in conflicts.chunks(1000) {
        c.bulk_no_edits(db, chunk).await;
    }
    let deletions: Vec<Value> = (0..n)
        .step_by(15)
        .map(|i| json!({"_id": format!("d{i:06}"), "_rev": revs[i], "_deleted": true}))
        .collect();
    c.bulk_insert(db, &deletions).await;
}

/// Source `_changes` (all_docs style): `(seq, id, leaf revs)` in sequence order.
async fn source_changes(url: &str) -> Vec<(u64, String, Vec<String>)> {
    let v: Value = reqwest::get(format!("{url}/_changes?style=all_docs"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                seq_num(&r["seq"]),
                r["id"].as_str().unwrap().to_owned(),
                r["changes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["rev"].as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect()
}

fn seq_num(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(s) => s.split('-').next().unwrap().parse().unwrap(),
        other => panic!("unexpected seq {other}"),
    }
}

/// Checks the target's checkpoint against the target contents; returns the claimed seq.
async fn check_checkpoint(
    tgt_url: &str,
    base_id: &str,
    changes: &[(u64, String, Vec<String>)],
) -> Option<u64> {
    let http = reqwest::Client::new();
    let r = http
        .get(format!("{tgt_url}/_local/{base_id}"))
        .send()
        .await
        .unwrap();
    if r.status().as_u16() == 404 {
        return None;
    }
    let doc: Value = r.json().await.unwrap();
    let claimed = seq_num(&doc["source_last_seq"]);
    let covered: BTreeMap<String, Vec<String>> = changes
        .iter()
        .filter(|(s, _, _)| *s <= claimed)
        .map(|(_, id, revs)| (id.clone(), revs.clone()))
        .collect();
    let ids: Vec<(&String, &Vec<String>)> = covered.iter().collect();
    for chunk in ids.chunks(1000) {
        let body: serde_json::Map<String, Value> = chunk
            .iter()
            .map(|(id, revs)| ((*id).clone(), json!(revs)))
            .collect();
        let missing: Value = http
            .post(format!("{tgt_url}/_revs_diff"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(
            missing.as_object().is_some_and(|m| m.is_empty()),
            "checkpoint claims seq {claimed} but the target lacks: {}",
            missing.to_string().chars().take(500).collect::<String>()
        );
    }
    Some(claimed)
}

/// Documents (live and deleted) on the target, 0 before it exists.
async fn target_docs(c: &Couch) -> u64 {
    let (s, v) = c.db_info("tgt").await;
    if s != 200 {
        return 0;
    }
    v["doc_count"].as_u64().unwrap_or(0) + v["doc_del_count"].as_u64().unwrap_or(0)
}

async fn doc_state(c: &Couch) -> Value {
    c.get_doc("jobs_replicator", "torture").await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_torture_loses_nothing() {
    let long = std::env::var("RELIABILITY_LONG").is_ok_and(|v| v == "1");
    let seed = env_num("RELIABILITY_SEED", rand::random::<u32>() as u64);
    let kills = env_num("RELIABILITY_KILLS", if long { 20 } else { 5 });
    let n_docs = env_num("RELIABILITY_DOCS", if long { 50_000 } else { 5_000 }) as usize;
    let budget = if long { 1800 } else { 240 };
    // Long mode kills sooner after each restart so that all 20 kills land before the
    // 50,000-doc replication completes (each restart first waits out the activity timeout).
    let kill_ms = if long { 100..500u64 } else { 200..1500u64 };
    println!("kill9: seed={seed} kills={kills} docs={n_docs} (RELIABILITY_SEED={seed} to replay)");
    crate::support::deadline(budget, "the kill9 torture to finish", async {
        let started = Instant::now();
        let mut rng = StdRng::seed_from_u64(seed);
        let (a, b) = tokio::join!(PouchServer::start(), PouchServer::start());
        let (ca, cb) = (Couch::new(&a.root()), Couch::new(&b.root()));
        ca.create_db("src").await;
        ca.create_db("jobs_replicator").await;
        fill_source(&ca, "src", n_docs).await;
        let changes = source_changes(&a.db_url("src")).await;
        let leaves: usize = changes.iter().map(|c| c.2.len()).sum();
        println!(
            "kill9: source has {} docs, {leaves} leaves (filled in {:?})",
            changes.len(),
            started.elapsed()
        );
        let dir = tempfile::tempdir().unwrap();
        let mut rep_doc = json!({"source": a.db_url("src"), "target": b.db_url("tgt"),
            "create_target": true, "checkpoint_interval": 500});
        if long {
            // Smaller, fewer batches: each run between kills copies a few thousand docs, not
            // a fifth of the source, so 20 kills fit in one replication.
            rep_doc["worker_processes"] = json!(1);
            rep_doc["worker_batch_size"] = json!(50);
        }
        let (s, v) = ca
            .put_doc(
                "jobs_replicator",
                "torture",
                &rep_doc,
            )
            .await;
        assert_eq!(s, 201, "{v}");

        let mut base_id: Option<String> = None;
        let mut claims = Vec::new();
        let mut survived = 0;
        let mut mid_run = 0;
        let mut last_count = 0;
        for k in 0..kills {
            let mut node = start_serve(dir.path(), &a.db_url("jobs_replicator")).await;
            // A restarted node waits out the dead worker's activity timeout before running
            // the job again: kill only once it runs, so every kill lands mid-replication.
            let run_wait = Instant::now();
            // Wait for the target to grow (the job really runs again; `_scheduler` shows
            // `running` at once from the dead worker's record) or for the job to be done.
            let (id, running) = crate::support::wait_for(60, "the job to write again", || async {
                let (id, state) = rep_state(&node.base).await?;
                let now = target_docs(&cb).await;
                (now > last_count || state == "completed").then_some((id, state))
            })
            .await;
            if let Some(id) = id {
                base_id.get_or_insert(id);
            }
            let run_wait = run_wait.elapsed();
            let wait = rng.random_range(kill_ms.clone());
            mid_run += usize::from(running != "completed");
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let pid = node.child.id().unwrap() as i32;
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let st = node.child.wait().await.unwrap();
            assert!(!st.success(), "serve exited normally before the kill");
            survived += 1;
            let claimed = match &base_id {
                Some(id) => check_checkpoint(&b.db_url("tgt"), id, &changes).await,
                None => None,
            };
            let state = doc_state(&ca).await["_replication_state"].clone();
            last_count = target_docs(&cb).await;
            println!(
                "kill9: kill {} {wait} ms after `{running}` (restart took {run_wait:?}): \
                 checkpoint seq {claimed:?}, target docs {last_count}, doc state {state}",
                k + 1
            );
            claims.push(claimed);
        }
        // Final run: let the replication complete.
        let node = start_serve(dir.path(), &a.db_url("jobs_replicator")).await;
        let doc = crate::support::wait_for(budget / 2, "the torture doc to complete", || async {
            let d = doc_state(&ca).await;
            (d["_replication_state"] == "completed").then_some(d)
        })
        .await;
        if base_id.is_none() {
            base_id = rep_state(&node.base).await.and_then(|(id, _)| id);
        }
        let compared = ca.assert_same("src", &cb, "tgt").await;
        assert_eq!(compared, leaves);
        let mut child = node.child;
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGKILL) };
        child.wait().await.unwrap();
        let id = base_id.expect("the replication id was never shown");
        let last = check_checkpoint(&b.db_url("tgt"), &id, &changes).await;
        assert!(last.is_some(), "no checkpoint after completion");
        let store = dir.path().join("data/jobs.redb");
        let reopened = tokio::task::spawn_blocking(move || {
            couch_replicator::store::embedded::EmbeddedStore::open(store).map(|_| ())
        })
        .await
        .unwrap();
        assert!(reopened.is_ok(), "store did not reopen: {reopened:?}");
        if long {
            assert_eq!(mid_run, survived, "some kills landed after the replication completed");
        }
        println!(
            "kill9: RESULT kills_survived={survived} mid_replication={mid_run} docs={} \
             leaves_verified={compared} checkpoints_checked={} final_seq={last:?} stats={} elapsed={:?}",
            changes.len(),
            claims.iter().filter(|c| c.is_some()).count() + 1,
            doc["_replication_stats"],
            started.elapsed()
        );
    })
    .await;
}

/// The replication's base id (checkpoint doc name; CouchDB shows none for a completed
/// document) and its state, once the job runs or is done.
async fn rep_state(base: &str) -> Option<(Option<String>, String)> {
    let r = reqwest::Client::new()
        .get(format!("{base}/_scheduler/docs/jobs_replicator/torture"))
        .basic_auth(ADMIN.0, Some(ADMIN.1))
        .send()
        .await
        .ok()?;
    let v: Value = r.json().await.ok()?;
    let state = v["state"].as_str()?;
    if !matches!(state, "running" | "completed") {
        return None;
    }
    let id = v["id"]
        .as_str()
        .and_then(|id| id.split('+').next())
        .map(str::to_owned);
    Some((id, state.to_owned()))
}
