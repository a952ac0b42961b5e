//! Several couch_jobs "nodes" (one `Jobs` handle and one background tree each) working one
//! queue on one embedded store. One node dies mid-work (its workers vanish without finishing
//! and its background is killed): the other nodes' activity monitors re-enqueue its jobs, the
//! survivors finish them, the dead node's locks are fenced, and no job is lost or finished
//! twice. Real time and a real on-disk store (the type timeout is 1 s).

use crate::support::deadline;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_replicator::jobs::{
    AcceptOpts, Job, JobData, JobState, Jobs, JobsConfig, JobsError, JobsOptions,
};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use serde_json::json;

const T: &str = "multinode";
const JOBS: usize = 60;
const NODES: usize = 3;
const WORKERS: usize = 3;
const DOOMED: usize = 1;

fn data(v: serde_json::Value) -> JobData {
    v.as_object().cloned().expect("object")
}

/// What every worker reports: jobs held right now per node, and who finished what.
#[derive(Default)]
struct Ledger {
    held: Vec<HashMap<String, Job>>,
    finished: HashMap<String, usize>,
    halted: usize,
}

/// One worker: accept, three updates 100 ms apart, finish; until nothing is left anywhere.
async fn worker(j: Jobs, node: usize, ledger: Arc<Mutex<Ledger>>) -> Result<(), JobsError> {
    loop {
        let (mut job, _) = match j
            .accept(T, AcceptOpts::default().timeout(Duration::from_millis(300)))
            .await
        {
            Ok(found) => found,
            Err(JobsError::NotFound) => {
                let pending = j.pending_count(T, None, None).await?;
                if pending == 0 && j.get_active_jobs_ids(T).await?.is_empty() {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        ledger.lock().unwrap().held[node].insert(job.id.clone(), job.clone());
        let mut halted = false;
        for step in 1..=3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            match j
                .update(&job, Some(data(json!({"node": node, "step": step}))))
                .await
            {
                Ok(next) => job = next,
                Err(JobsError::Halt) => {
                    halted = true;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let outcome = if halted {
            Err(JobsError::Halt)
        } else {
            j.finish(&job, Some(data(json!({"done_by": node})))).await
        };
        let mut l = ledger.lock().unwrap();
        l.held[node].remove(&job.id);
        match outcome {
            Ok(()) => {
                let before = l.finished.insert(job.id.clone(), node);
                assert!(before.is_none(), "{} finished twice", job.id);
            }
            Err(JobsError::Halt) => l.halted += 1,
            Err(e) => return Err(e),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_loses_no_job() {
    deadline(90, "a dead node's jobs to run elsewhere", run()).await;
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path().join("jobs.redb")).unwrap();
    let db = Db::new(Arc::new(store.clone()));
    let config = JobsConfig {
        activity_monitor_max_jitter: Duration::from_millis(200),
        type_check_period: Duration::from_millis(500),
        type_check_max_jitter: Duration::from_millis(100),
        ..JobsConfig::default()
    };
    let nodes: Vec<Jobs> = (0..NODES)
        .map(|_| {
            Jobs::new(
                db.clone(),
                JobsOptions {
                    config: config.clone(),
                    ..JobsOptions::default()
                },
            )
        })
        .collect();
    nodes[0].set_type_timeout(T, 1).await.unwrap();
    for i in 0..JOBS {
        nodes[0]
            .add(T, &format!("job-{i:03}"), data(json!({"i": i})), 0)
            .await
            .unwrap();
    }
    let ledger = Arc::new(Mutex::new(Ledger {
        held: vec![HashMap::new(); NODES],
        ..Ledger::default()
    }));
    let mut backgrounds = Vec::new();
    let mut workers: Vec<Vec<tokio::task::JoinHandle<Result<(), JobsError>>>> = Vec::new();
    for (n, j) in nodes.iter().enumerate() {
        backgrounds.push(Some(j.start_background().await.unwrap()));
        workers.push(
            (0..WORKERS)
                .map(|_| tokio::spawn(worker(j.clone(), n, ledger.clone())))
                .collect(),
        );
    }

    // Let the doomed node finish a few jobs, then kill it while it holds some.
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let l = ledger.lock().unwrap();
        let done_by_doomed = l.finished.values().filter(|n| **n == DOOMED).count();
        if done_by_doomed >= 2 && l.held[DOOMED].len() >= 2 {
            break;
        }
    }
    for w in std::mem::take(&mut workers[DOOMED]) {
        w.abort();
        let _ = w.await;
    }
    if let Some(bg) = backgrounds[DOOMED].take() {
        bg.kill().await;
    }
    let orphans: HashMap<String, Job> = ledger.lock().unwrap().held[DOOMED].clone();
    assert!(!orphans.is_empty(), "the node died holding jobs");

    // The survivors drain the queue, orphans included.
    for (n, ws) in workers.into_iter().enumerate() {
        for w in ws {
            w.await
                .unwrap()
                .unwrap_or_else(|e| panic!("node {n} worker: {e}"));
        }
    }

    // Nothing lost: every job finished, by whoever the ledger says (the store is the truth:
    // a worker aborted inside `finish` may have committed without recording it).
    let (finished, halted) = {
        let l = ledger.lock().unwrap();
        (l.finished.clone(), l.halted)
    };
    let j = &nodes[0];
    let mut by_store = HashMap::new();
    for i in 0..JOBS {
        let id = format!("job-{i:03}");
        assert_eq!(
            j.get_job_state(T, &id).await.unwrap(),
            JobState::Finished,
            "{id}"
        );
        let done_by = j.get_job_data(T, &id).await.unwrap()["done_by"]
            .as_u64()
            .unwrap_or_else(|| panic!("{id} has no done_by")) as usize;
        if let Some(n) = finished.get(&id) {
            assert_eq!(*n, done_by, "{id}");
        }
        by_store.insert(id, done_by);
    }
    assert!(finished.len() >= JOBS - orphans.len());
    // The orphans were re-enqueued and finished by the survivors, and the dead node's locks
    // on them are fenced.
    let rescued = orphans
        .keys()
        .filter(|id| by_store[id.as_str()] != DOOMED)
        .count();
    assert!(rescued >= 1, "no orphan was rescued: {orphans:?}");
    for (id, job) in &orphans {
        if by_store[id] != DOOMED {
            assert_eq!(j.update(job, None).await, Err(JobsError::Halt), "{id}");
            assert_eq!(j.finish(job, None).await, Err(JobsError::Halt), "{id}");
        }
    }
    assert_eq!(j.pending_count(T, None, None).await.unwrap(), 0);
    assert!(j.get_active_jobs_ids(T).await.unwrap().is_empty());
    let survivors_did: usize = by_store.values().filter(|n| **n != DOOMED).count();
    println!(
        "{} jobs: {} by survivors, {} orphans ({} rescued), {} halted workers",
        JOBS,
        survivors_did,
        orphans.len(),
        rescued,
        halted
    );
    for bg in backgrounds.into_iter().flatten() {
        bg.stop().await;
    }
    store.close().await.unwrap();
}
