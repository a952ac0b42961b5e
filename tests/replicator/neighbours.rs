//! The 000 draft's neighbour rules on a real node: the node that finds its right-hand
//! neighbour dead re-enqueues that node's jobs at once — even while a zombie worker of the
//! dead node still updates them, which the activity monitor alone would never catch — and
//! membership heartbeats that never conflict with each other on an optimistic engine, and a
//! node that finds itself removed stops its jobs.

use crate::support::deadline;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::nodes::Nodes;
use crate::support::replicator::*;
use couch_replicator::jobs::lifecycle::get_row;
use couch_replicator::jobs::{AcceptOpts, JobData, Jobs, JobsError, JobsOptions};
use couch_replicator::replicator::cluster::membership::Membership;
use couch_replicator::replicator::job::REP_JOBS;
use couch_replicator::replicator::node::context::NODES;
use couch_replicator::replicator::{JobKind, NewJob, ReplicatorSettings, WaitFor};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use couch_replicator::store::tuple::{self, Bytes};
use couch_replicator::store::{StoreError, Tx};
use serde_json::json;

/// On paused time with CouchDB's intervals (a 61 s activity timeout).
#[tokio::test(start_paused = true)]
async fn a_dead_neighbours_jobs_are_requeued_at_once_even_while_its_zombie_updates_them() {
    deadline(
        180,
        "a dead neighbours jobs are requeued at once even while its zombie updates them",
        async {
            let nodes = Nodes::paused();
            let options = JobsOptions {
                clock: nodes.clock(),
                ..JobsOptions::default()
            };
            let prefix = options.prefix.clone();
            let jobs = Jobs::new(nodes.db().clone(), options);
            let timeout = ReplicatorSettings::default().job_timeout;
            jobs.set_type_timeout(REP_JOBS, timeout.as_secs() as i64)
                .await
                .unwrap();

            // Node "zz-dead": a member whose last heartbeat is an hour old, running one job.
            let mut member = prefix.clone();
            tuple::pack_into(
                &(NODES, "member", Bytes::from(&b"zz-dead"[..])),
                &mut member,
            );
            let stale = jobs.clock().now_ms() - 3_600_000;
            nodes
                .db()
                .run(|tx: Tx| {
                    let member = member.clone();
                    async move {
                        tx.set(&member, &stale.to_le_bytes());
                        Ok::<_, StoreError>(())
                    }
                })
                .await
                .unwrap();
            let data: JobData = json!({"rep": {}, "node": "zz-dead"})
                .as_object()
                .cloned()
                .unwrap();
            jobs.add(REP_JOBS, "zombie-job", data.clone(), 0)
                .await
                .unwrap();
            let now = jobs.clock().now_secs();
            let opts = AcceptOpts::default()
                .timeout(Duration::ZERO)
                .max_sched_time(now);
            let (job, _) = jobs.accept(REP_JOBS, opts).await.unwrap();
            jobs.update(&job, Some(data)).await.unwrap();

            // Its zombie worker keeps the job alive far more often than the 61 s timeout.
            let updates = Arc::new(AtomicU32::new(0));
            let zombie = {
                let (jobs, job, updates) = (jobs.clone(), job.clone(), updates.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        match jobs.update(&job, None).await {
                            Ok(_) => updates.fetch_add(1, Ordering::SeqCst),
                            Err(JobsError::Halt) => return,
                            Err(e) => panic!("zombie update failed: {e}"),
                        };
                    }
                })
            };
            while updates.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }

            // "a" has "zz-dead" as its right-hand neighbour: it removes it once it has seen
            // its row stand still for `dead_after` (one activity timeout, on a's own clock;
            // the hour-old time in the row is not trusted).
            let node = nodes.start("a", ReplicatorSettings::default()).await;
            tokio::time::timeout(timeout * 2 + Duration::from_secs(30), zombie)
                .await
                .expect("the dead node's job was not re-enqueued")
                .unwrap();
            let members = nodes
                .db()
                .run(|tx: Tx| {
                    let member = member.clone();
                    async move { tx.get(&member, false).await }
                })
                .await
                .unwrap();
            assert_eq!(members, None, "the dead neighbour was removed");
            node.shutdown().await;
        },
    )
    .await;
}

/// Three nodes heart-beat in fully overlapping transactions on the embedded engine (real
/// optimistic conflict detection, as on FDB): every commit succeeds. Reading the members
/// without snapshot isolation would make all but the first conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_heartbeats_never_conflict_and_a_removed_node_notices() {
    deadline(
        90,
        "overlapping heartbeats never conflict and a removed node notices",
        async {
            let dir = tempfile::tempdir().unwrap();
            let store = EmbeddedStore::open(dir.path().join("members.redb")).unwrap();
            let options = JobsOptions::default();
            let prefix = options.prefix.clone();
            let jobs = Jobs::new(Db::new(Arc::new(store.clone())), options);
            let nodes: Vec<Membership> = ["a", "b", "c"]
                .iter()
                .map(|n| {
                    Membership::new(jobs.clone(), &prefix, &(*n).into(), Duration::from_secs(30))
                })
                .collect();
            for m in &nodes {
                m.beat(true).await.unwrap();
            }
            let db = jobs.db();
            for round in 0..5 {
                let now = jobs.clock().now_ms() + round;
                let mut txs = Vec::new();
                for _ in &nodes {
                    txs.push(db.begin().await.unwrap());
                }
                for (m, tx) in nodes.iter().zip(&txs) {
                    let beat = m.beat_tx(tx, now, false).await.unwrap();
                    assert_eq!(beat.removed, None);
                    assert!(!beat.was_removed);
                }
                for (i, tx) in txs.iter().enumerate() {
                    tx.commit()
                        .await
                        .unwrap_or_else(|e| panic!("round {round}: node {i}'s heartbeat: {e}"));
                }
            }
            assert_eq!(nodes[0].members().await.unwrap().len(), 3);

            // A neighbour's removal of "a" (its key cleared) is what "a" sees next.
            let tx = db.begin().await.unwrap();
            tx.clear(&nodes[0].member_key(&"a".into()));
            tx.commit().await.unwrap();
            assert!(nodes[0].beat(false).await.unwrap().was_removed);
            assert!(
                !nodes[0].beat(false).await.unwrap().was_removed,
                "back as a member"
            );
            store.close().await.unwrap();
        },
    )
    .await;
}

/// The lock a job runs under now (`None` when not running).
async fn lock_of(jobs: &Jobs, id: &str) -> Option<String> {
    jobs.db()
        .run(|tx: Tx| async move { get_row(jobs.keys(), &tx, REP_JOBS, id, false).await })
        .await
        .unwrap()
        .and_then(|row| row.jlock)
}

/// A node that finds itself removed from the membership stops the jobs it runs, even when
/// nobody re-enqueued them (their locks still valid, so nothing else would stop them): the
/// job goes back to pending and runs again under a new lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_finds_itself_removed_stops_its_jobs() {
    deadline(
        180,
        "a node that finds itself removed stops its jobs",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("src").await;
            pouch.put_docs("src", "a", 5).await;
            let nodes = Nodes::on_disk();
            let b = nodes.start("b", test_settings()).await;
            let rep = json!({"source": pouch.url("src"), "target": pouch.url("tgt"),
                         "create_target": true, "continuous": true});
            let view = b
                .add(NewJob::from_body(
                    JobKind::Persistent {
                        db_name: "_replicator".into(),
                        doc_id: "j".into(),
                    },
                    rep,
                ))
                .await
                .unwrap();
            let id = view.job_id;
            b.wait(&id, WaitFor::Running, Duration::from_secs(30))
                .await
                .unwrap();
            let jobs = b.jobs().clone();
            let first = lock_of(&jobs, id.as_str())
                .await
                .expect("running under a lock");

            // A neighbour declared "b" dead but (say) crashed before re-enqueueing its jobs.
            let mut member = JobsOptions::default().prefix;
            tuple::pack_into(&(NODES, "member", Bytes::from(&b"b"[..])), &mut member);
            nodes
                .db()
                .run(|tx: Tx| {
                    let member = member.clone();
                    async move {
                        tx.clear(&member);
                        Ok::<_, StoreError>(())
                    }
                })
                .await
                .unwrap();
            let restarted = async {
                loop {
                    match lock_of(&jobs, id.as_str()).await {
                        Some(l) if l != first => return,
                        _ => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            };
            tokio::time::timeout(Duration::from_secs(20), restarted)
                .await
                .expect("the removed node kept running its job under the old lock");
            b.shutdown().await;
        },
    )
    .await;
}
