//! `POST /_replicate` against real pouchdb-server endpoints: a replication already run by
//! another job (a `_replicator` document's, or another user's transient one) is a 409 with
//! the reason instead of a wait, and the running job is untouched.

use crate::support::deadline;
use std::time::Duration;

use crate::support::http::{ADMIN, BOB, Node, Pouch};
use couch_replicator::http::HttpConfig;
use couch_replicator::replication::RepId;
use couch_replicator::replicator::{JobKind, NewJob, RepState, WaitFor};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_replication_is_a_conflict() {
    deadline(90, "a duplicate replication is a conflict", async {
        let pouch = Pouch::start().await;
        pouch.put("src", json!({})).await;
        let node = Node::start(HttpConfig::default()).await;
        let rep = node.replicator.clone();
        let spec = json!({"source": pouch.db("src"), "target": pouch.db("dst"),
            "create_target": true, "continuous": true});
        let persistent = rep
            .add(NewJob::from_body(
                JobKind::Persistent {
                    db_name: "_replicator".into(),
                    doc_id: "d".into(),
                },
                spec.clone(),
            ))
            .await
            .unwrap();
        rep.wait(
            &persistent.job_id,
            WaitFor::Running,
            Duration::from_secs(30),
        )
        .await
        .unwrap();

        let (s, e) = node.post("/_replicate", Some(BOB), &spec.to_string()).await;
        assert_eq!((s, e["error"].as_str()), (409, Some("conflict")), "{e}");
        assert!(
            e["reason"]
                .as_str()
                .unwrap()
                .contains("Duplicate job running"),
            "{e}"
        );
        let p = rep.get(&persistent.job_id).await.unwrap();
        assert_eq!(p.state, RepState::Running);

        // Another user's transient job of the same replication as a running transient one.
        let other = json!({"source": pouch.db("src"), "target": pouch.db("dst2"),
            "create_target": true, "continuous": true});
        let (s, e) = node
            .post("/_replicate", Some(ADMIN), &other.to_string())
            .await;
        assert_eq!(s, 202, "{e}");
        // The reply comes once the job is added; the conflict is with a running job.
        let local_id = e["_local_id"].as_str().unwrap().to_owned();
        crate::support::wait_for(30, "admin's job running", || async {
            // Found by replication id once the job has started.
            let v = rep.get(RepId::from_full(&local_id)).await.ok()?;
            (v.state == RepState::Running).then_some(())
        })
        .await;
        let (s, e) = node
            .post("/_replicate", Some(BOB), &other.to_string())
            .await;
        assert_eq!((s, e["error"].as_str()), (409, Some("conflict")), "{e}");
        // The same user asking again joins their own job: 202 with the same id.
        let (s, again) = node
            .post("/_replicate", Some(ADMIN), &other.to_string())
            .await;
        assert_eq!(s, 202, "{again}");
    })
    .await;
}
