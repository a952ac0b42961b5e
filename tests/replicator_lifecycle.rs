//! Job lifecycle through the embedded handle against real pouchdb-server endpoints.

mod replicator_support;

use std::time::Duration;

use couch_replicator::replicator::{JobKind, NewJob, RepState, ReplicatorEvent, WaitFor};
use replicator_support::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_transient_job_completes_and_copies_every_doc() {
    deadline(60, async {
        let pouch = Pouch::start().await;
        pouch.create_db("src").await;
        pouch.put_docs("src", "d", 50).await;
        let store = Store::open();
        let node = node(&store.db, "n1", test_settings()).await;
        let mut events = node.subscribe().unwrap();
        let view = node
            .add(NewJob {
                kind: JobKind::Transient { user: None },
                rep: json!({"source": pouch.url("src"), "target": pouch.url("tgt"), "create_target": true}),
            })
            .await
            .unwrap();
        assert_eq!(view.state, RepState::Pending);
        let done = node
            .wait(&view.job_id, WaitFor::Completed, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(done.state, RepState::Completed);
        assert_eq!(done.info["docs_written"], 50);
        assert!(done.rep_id.is_some());
        assert_eq!(pouch.doc_count("tgt").await, 50);
        let history: Vec<&str> = done.history.iter().map(|h| h.kind.as_str()).collect();
        assert_eq!(history, ["started", "added"]);
        // The bus saw the start and the finish of this job.
        let mut seen = Vec::new();
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(500), events.recv()).await {
            seen.push(ev);
        }
        assert!(seen.iter().any(|e| matches!(e, ReplicatorEvent::Started { job_id, .. } if *job_id == view.job_id)));
        assert!(seen.iter().any(|e| matches!(e, ReplicatorEvent::Finished { job_id, .. } if *job_id == view.job_id)));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_documents_are_rejected_with_a_reason() {
    deadline(30, async {
        let store = Store::open();
        let node = node(&store.db, "n1", test_settings()).await;
        let err = node
            .add(NewJob {
                kind: JobKind::Transient { user: None },
                rep: json!({"source": "http://127.0.0.1:1/a"}),
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("target"), "{err}");
        assert!(node.get("nope").await.is_err());
        node.shutdown().await;
    })
    .await;
}
