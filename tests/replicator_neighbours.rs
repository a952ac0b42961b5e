//! The 000 draft's neighbour rules on a real node: the node that finds its right-hand
//! neighbour dead re-enqueues that node's jobs at once — even while a zombie worker of the
//! dead node still updates them, which the activity monitor alone would never catch.

mod replicator_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use couch_replicator::jobs::{AcceptOpts, JobData, Jobs, JobsError, JobsOptions, TokioClock};
use couch_replicator::replicator::context::NODES;
use couch_replicator::replicator::rep_job::REP_JOBS;
use couch_replicator::store::tuple::{self, Bytes};
use couch_replicator::store::{StoreError, Tx};
use replicator_support::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_neighbours_jobs_are_requeued_at_once_even_while_its_zombie_updates_them() {
    deadline(60, async {
        let store = Store::open();
        let options = JobsOptions {
            config: jobs_config(),
            clock: Arc::new(TokioClock::new()),
            ..JobsOptions::default()
        };
        let prefix = options.prefix.clone();
        let jobs = Jobs::new(store.db.clone(), options);
        jobs.set_type_timeout(REP_JOBS, 3).await.unwrap();

        // Node "zz-dead": a member whose last heartbeat is an hour old, running one job.
        let mut member = prefix.clone();
        tuple::pack_into(
            &(NODES, "member", Bytes::from(&b"zz-dead"[..])),
            &mut member,
        );
        let stale = jobs.clock().now_ms() - 3_600_000;
        store
            .db
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

        // Its zombie worker keeps the job alive far more often than the 3 s timeout.
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

        // "a" has "zz-dead" as its right-hand neighbour: it removes it when it joins.
        let node = node(&store.db, "a", test_settings()).await;
        tokio::time::timeout(Duration::from_secs(30), zombie)
            .await
            .expect("the dead node's job was not re-enqueued")
            .unwrap();
        let members = store
            .db
            .run(|tx: Tx| {
                let member = member.clone();
                async move { tx.get(&member, false).await }
            })
            .await
            .unwrap();
        assert_eq!(members, None, "the dead neighbour was removed");
        node.shutdown().await;
    })
    .await;
}
