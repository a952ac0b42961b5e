//! What a taker can ask of `accept` beyond couch_jobs': `AcceptOpts::set_field` (the take
//! itself writes a field into the job's data, as the replicator stamps its node: visible
//! to every reader once the accept returns, in the activity row too, and kept by the
//! worker's updates), and `accept_until` (a waiter told to stop ends its wait at once
//! and takes nothing enqueued afterwards).

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::jobs::{AcceptOpts, JobData, Jobs, JobsError, JobsOptions};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_writes_the_field_every_reader_sees() {
    deadline(30, "the take writes its field", async {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("j.redb")).unwrap();
        let j = Jobs::new(Db::new(Arc::new(store)), JobsOptions::default());
        j.set_type_timeout("t", 30).await.unwrap();
        let mut data = JobData::new();
        data.insert("rep".into(), json!({"source": "a"}));
        j.add("t", "a", data.clone(), 0).await.unwrap();
        j.add("t", "b", data.clone(), 0).await.unwrap();
        let opts = AcceptOpts::default()
            .timeout(Duration::ZERO)
            .set_field("node", json!("n1"));
        let (job, taken) = j.accept("t", opts).await.unwrap();
        assert_eq!(taken["node"], json!("n1"), "the accept's answer");
        assert_eq!(taken["rep"], data["rep"], "the rest of the data kept");
        let stored = j.get_job_data("t", &job.id).await.unwrap();
        assert_eq!(stored, taken, "the job's row");
        let active = j.get_active_jobs("t").await.unwrap();
        assert_eq!(
            active,
            vec![(job.id.clone(), taken.clone())],
            "the activity row"
        );
        // The worker's lock holds: its update goes through and keeps what it sends.
        let mut next = taken.clone();
        next.insert("n".into(), json!(1));
        j.update(&job, Some(next.clone())).await.unwrap();
        assert_eq!(j.get_job_data("t", &job.id).await.unwrap(), next);
        // Without the option the other job's data is left as it was added.
        let plain = AcceptOpts::default().timeout(Duration::ZERO);
        let (_, other) = j.accept("t", plain).await.unwrap();
        assert_eq!(other, data);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_told_to_stop_ends_at_once_and_takes_nothing_after() {
    deadline(30, "a waiter told to stop", async {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("j.redb")).unwrap();
        let j = Jobs::new(Db::new(Arc::new(store)), JobsOptions::default());
        j.set_type_timeout("t", 30).await.unwrap();
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let waiter = {
            let j = j.clone();
            tokio::spawn(async move {
                let until = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                let opts = AcceptOpts::default().timeout(Duration::from_secs(20));
                j.accept_until("t", opts, until).await
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !waiter.is_finished(),
            "the waiter waits while the queue is empty"
        );
        let told = tokio::time::Instant::now();
        stop.send_replace(true);
        let answer = waiter.await.unwrap();
        assert_eq!(answer, Err(JobsError::NotFound));
        assert!(
            told.elapsed() < Duration::from_secs(2),
            "ended {:?} after",
            told.elapsed()
        );
        j.add("t", "late", JobData::new(), 0).await.unwrap();
        assert_eq!(
            j.pending_count("t", None, None).await.unwrap(),
            1,
            "nothing taken"
        );
        // A plain accept still takes it.
        let plain = AcceptOpts::default().timeout(Duration::ZERO);
        assert_eq!(j.accept("t", plain).await.unwrap().0.id, "late");
    })
    .await;
}
