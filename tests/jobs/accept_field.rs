//! `AcceptOpts::set_field`: the take itself writes a field into the job's data (the
//! replicator stamps its node this way), visible to every reader once the accept returns,
//! in the running job's activity row as well, and kept by the worker's updates.

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::jobs::{AcceptOpts, JobData, Jobs, JobsOptions};
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
