//! couch_jobs' queue peek for callers serving several types: `pending_head_tx` names the
//! most urgent pending job without taking it, and `watch_pending_tx` fires when a job of the
//! type is enqueued (on the embedded engine, whose watches are real).

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::jobs::{AcceptOpts, JobData, Jobs, JobsOptions};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;

async fn head(j: &Jobs, ty: &str) -> Option<(i64, String)> {
    j.db()
        .run(|tx| async move { j.pending_head_tx(&tx, ty).await })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_is_the_earliest_pending_job_and_a_watch_sees_enqueues() {
    deadline(30, "the pending head and its watch", async {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("j.redb")).unwrap();
        let j = Jobs::new(Db::new(Arc::new(store)), JobsOptions::default());
        for ty in ["q1", "q2"] {
            j.set_type_timeout(ty, 30).await.unwrap();
        }
        assert_eq!(head(&j, "q1").await, None);
        j.add("q1", "late", JobData::new(), 50).await.unwrap();
        j.add("q1", "early", JobData::new(), 20).await.unwrap();
        j.add("q2", "other", JobData::new(), 1).await.unwrap();
        assert_eq!(head(&j, "q1").await, Some((20, "early".to_string())));
        assert_eq!(
            head(&j, "q1").await,
            Some((20, "early".to_string())),
            "peeking takes nothing"
        );
        let (job, _) = j
            .accept(
                "q1",
                AcceptOpts::default()
                    .max_sched_time(20)
                    .timeout(Duration::ZERO),
            )
            .await
            .unwrap();
        assert_eq!(job.id, "early");
        assert_eq!(head(&j, "q1").await, Some((50, "late".to_string())));
        assert_eq!(head(&j, "q2").await, Some((1, "other".to_string())));

        // A watch on q1 does not fire for q2, and fires once q1 gets a job.
        let jr = &j;
        let watch = j
            .db()
            .run(|tx| async move {
                Ok::<_, couch_replicator::store::StoreError>(jr.watch_pending_tx(&tx, "q1"))
            })
            .await
            .unwrap();
        tokio::pin!(watch);
        j.add("q2", "more", JobData::new(), 2).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut watch)
                .await
                .is_err(),
            "a q2 enqueue woke a q1 watcher"
        );
        j.add("q1", "new", JobData::new(), 5).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), &mut watch)
            .await
            .expect("the q1 watch did not fire")
            .unwrap();
        assert_eq!(head(&j, "q1").await, Some((5, "new".to_string())));
    })
    .await;
}
