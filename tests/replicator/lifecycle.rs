//! Job lifecycle through the embedded handle against real pouchdb-server endpoints.

use crate::support::{deadline, wait_for};
use std::time::Duration;

use crate::support::nodes::{Nodes, until_job};
use crate::support::replicator::*;
use couch_replicator::replication::RepId;
use couch_replicator::replicator::{
    JobId, JobKind, NewJob, NodeName, RepState, ReplicatorEvent, ReplicatorSettings, WaitFor,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_transient_job_completes_and_copies_every_doc() {
    deadline( 180, "one shot transient job completes and copies every doc", async {
        let pouch = Pouch::start().await;
        pouch.create_db("src").await;
        pouch.put_docs("src", "d", 50).await;
        let nodes = Nodes::on_disk();
        let node = nodes.start("n1", test_settings()).await;
        let mut events = node.subscribe().unwrap();
        let view = node
            .add(NewJob::from_body(JobKind::Transient { user: None }, json!({"source": pouch.url("src"), "target": pouch.url("tgt"), "create_target": true})))
            .await
            .unwrap();
        assert_eq!(view.state, RepState::Pending);
        let done = node
            .wait(&view.job_id, WaitFor::Completed, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(done.state, RepState::Completed);
        assert_eq!(done.stats.as_ref().unwrap().docs_written, 50);
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

#[tokio::test(start_paused = true)]
async fn bad_documents_are_rejected_with_a_reason() {
    deadline(90, "bad documents are rejected with a reason", async {
        let nodes = Nodes::paused();
        let node = nodes.start("n1", ReplicatorSettings::default()).await;
        let err = node
            .add(NewJob::from_body(
                JobKind::Transient { user: None },
                json!({"source": "http://127.0.0.1:1/a"}),
            ))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("target"), "{err}");
        assert!(node.get(JobId::from("nope")).await.is_err());
        assert!(node.get(RepId::from_full("nope")).await.is_err());
        node.shutdown().await;
    })
    .await;
}

/// The harness fails a test that ends with a node still running (its actors would outlive
/// the test under plain `cargo test`).
#[tokio::test(start_paused = true)]
#[should_panic(expected = "were not shut down")]
async fn a_test_that_leaves_a_node_running_fails() {
    let nodes = Nodes::paused();
    let stopped = nodes.start("n1", ReplicatorSettings::default()).await;
    let _left = nodes.start("n2", ReplicatorSettings::default()).await;
    stopped.shutdown().await;
    assert_eq!(nodes.running(), ["n2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_get_active_tasks_and_cancel_through_the_handle() {
    deadline(
        180,
        "list get active tasks and cancel through the handle",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("src").await;
            pouch.put_docs("src", "d", 5).await;
            let nodes = Nodes::on_disk();
            let node = nodes.start("n1", test_settings()).await;
            // (pouchdb-server has no users, so credentials are not used here; masking is covered
            // by the unit tests of rep_job.)
            let url = pouch.url("src");
            let view = node
                .add(NewJob::from_body(
                    JobKind::Transient {
                        user: Some("bob".into()),
                    },
                    json!({"source": url, "target": pouch.url("tgt"),
                            "create_target": true, "continuous": true}),
                ))
                .await
                .unwrap();
            let running = node
                .wait(&view.job_id, WaitFor::Running, Duration::from_secs(30))
                .await
                .unwrap();
            let rep_id = running.rep_id.clone().unwrap();
            assert_eq!(rep_id.ext, "+continuous+create_target");
            // By replication id as well as by job id.
            let by_rep_id = rep_id.clone();
            assert_eq!(node.get(&by_rep_id).await.unwrap().job_id, view.job_id);
            let listed = node.list().await.unwrap();
            assert_eq!(listed.len(), 1);
            let sched = &listed[0];
            assert_eq!(sched.rep_id.as_ref(), Some(&rep_id));
            assert_eq!(sched.state, RepState::Running);
            assert_eq!(sched.user.as_deref(), Some("bob"));
            assert_eq!(sched.source, format!("{}/", pouch.url("src")));
            // _active_tasks shows the job once its first stats tick (1 s) wrote its stats.
            until_job(&node, &view.job_id, 5, "wrote its stats", |v| {
                v.stats.is_some()
            })
            .await;
            let tasks = node.active_tasks().await.unwrap();
            assert_eq!(tasks.len(), 1);
            assert!(tasks[0].stats.is_some());
            assert_eq!(tasks[0].rep_id.as_ref(), Some(&rep_id));
            assert_eq!(tasks[0].node.as_ref().map(NodeName::as_str), Some("n1"));
            // Cancel by replication id: the job is gone and its actor stops at its next update.
            let cancelled = node.cancel(&by_rep_id).await.unwrap();
            assert_eq!(cancelled.job_id, view.job_id);
            assert!(matches!(
                node.get(&view.job_id).await,
                Err(couch_replicator::ReplicatorError::NotFound(_))
            ));
            for _ in 0..50 {
                if node.active_tasks().await.unwrap().is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(node.active_tasks().await.unwrap().is_empty());
            assert!(node.cancel(&by_rep_id).await.is_err());
            node.shutdown().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_job_that_errors_fails_with_its_reason() {
    deadline(
        180,
        "a transient job that errors fails with its reason",
        async {
            let pouch = Pouch::start().await;
            let nodes = Nodes::on_disk();
            let node = nodes.start("n1", test_settings()).await;
            let view = node
                .add(NewJob::from_body(
                    JobKind::Transient { user: None },
                    json!({"source": pouch.url("nope"), "target": pouch.url("t")}),
                ))
                .await
                .unwrap();
            let err = node
                .wait(&view.job_id, WaitFor::Completed, Duration::from_secs(30))
                .await
                .unwrap_err();
            assert!(err.to_string().contains("db_not_found"), "{err}");
            assert_eq!(
                node.get(&view.job_id).await.unwrap().state,
                RepState::Failed
            );
            node.shutdown().await;
        },
    )
    .await;
}

/// A finished transient job is removed once it is older than `transient_job_max_age`, and a
/// persistent one is not (its `_replicator` document owns it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_transient_jobs_are_removed_after_their_max_age() {
    deadline(120, "finished transient jobs are removed", async {
        let pouch = Pouch::start().await;
        pouch.create_db("src").await;
        pouch.put_docs("src", "d", 5).await;
        let nodes = Nodes::on_disk();
        let settings = ReplicatorSettings {
            transient_job_max_age: Duration::from_secs(2),
            ..test_settings()
        };
        let node = nodes.start("n1", settings).await;
        let transient =
            NewJob::transient(ep(&pouch.url("src")), ep(&pouch.url("tgt"))).create_target();
        let t = node.add(transient).await.unwrap().job_id;
        let persistent = NewJob::from_body(
            JobKind::Persistent {
                db_name: "_replicator".into(),
                doc_id: "keep".into(),
            },
            json!({"source": pouch.url("src"), "target": pouch.url("tgt2"), "create_target": true}),
        );
        let p = node.add(persistent).await.unwrap().job_id;
        for id in [&t, &p] {
            node.wait(id, WaitFor::Completed, Duration::from_secs(60))
                .await
                .unwrap();
        }
        wait_for(60, "the finished transient job removed", || async {
            node.get(&t).await.is_err().then_some(())
        })
        .await;
        let kept = node.get(&p).await.unwrap();
        assert_eq!(kept.state, RepState::Completed);
        node.shutdown().await;
    })
    .await;
}

/// An idle continuous job rewrites its record only when its stats move, or at half the
/// activity timeout to stay alive: not at every stats tick (with 500 idle running jobs those
/// rewrites were most of the store's work), and never so rarely that couch_jobs' activity
/// monitor takes it for dead and re-enqueues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_running_job_rewrites_its_record_only_to_stay_alive() {
    deadline(
        180,
        "an idle running job rewrites its record only to stay alive",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("src").await;
            pouch.put_docs("src", "d", 3).await;
            let nodes = Nodes::on_disk();
            let settings = ReplicatorSettings {
                stats_update_interval: Duration::from_secs(1),
                // Keep-alive writes 8 s after the last write.
                job_timeout: Duration::from_secs(16),
                ..test_settings()
            };
            let n = nodes.start("n1", settings).await;
            let id = n
                .add(
                    NewJob::transient(ep(&pouch.url("src")), ep(&pouch.url("tgt")))
                        .continuous()
                        .create_target(),
                )
                .await
                .unwrap()
                .job_id;
            // The copy is done and its stats are in the record, the same at two reads 1.5 s
            // apart: the last write was at most ~3 s ago.
            let mut prev = None;
            let settled = loop {
                let v = n.get(&id).await.unwrap();
                if let Some(s) = v.stats.clone().filter(|s| s.docs_written == 3) {
                    if prev.as_ref() == Some(&s) {
                        break v;
                    }
                    prev = Some(s);
                }
                tokio::time::sleep(Duration::from_millis(1500)).await;
            };
            let before = settled.last_updated;
            // Two more ticks, well before the keep-alive is due.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let after = n.get(&id).await.unwrap();
            assert_eq!(
                after.last_updated, before,
                "nothing moved, yet the record was rewritten"
            );
            // Past the activity timeout it is still the same run: the keep-alive writes came.
            tokio::time::sleep(Duration::from_secs(16)).await;
            let later = n.get(&id).await.unwrap();
            assert_eq!(later.state, RepState::Running);
            assert!(later.last_updated > before, "no keep-alive write");
            let starts = later
                .history
                .iter()
                .filter(|h| h.kind.as_str() == "started")
                .count();
            assert_eq!(starts, 1, "re-enqueued as dead: {:?}", later.history);
            n.shutdown().await;
        },
    )
    .await;
}

/// `[replicator] max_jobs_per_user` counts a user's jobs without reading every job (issue 39):
/// with 30 other jobs stored, counting user u's two transient jobs lists no job row, and a
/// cancelled one no longer counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_unfinished_jobs_are_counted_without_reading_every_job() {
    deadline(120, "a user's jobs counted", async {
        let pouch = Pouch::start().await;
        pouch.create_db("src").await;
        let nodes = Nodes::on_disk();
        let settings = ReplicatorSettings {
            interval: Duration::from_secs(3600),
            ..test_settings()
        };
        let node = nodes.start("user_jobs_count", settings).await;
        let body = |k: usize| {
            json!({"source": pouch.url("src"), "target": pouch.url(&format!("t{k}")),
                "continuous": true, "create_target": true})
        };
        for k in 0..30 {
            let kind = JobKind::Persistent {
                db_name: "_replicator".into(),
                doc_id: format!("r{k}"),
            };
            node.add(NewJob::from_body(kind, body(k))).await.unwrap();
        }
        let mut mine = Vec::new();
        for k in 100..102 {
            let kind = JobKind::Transient {
                user: Some("u".into()),
            };
            mine.push(node.add(NewJob::from_body(kind, body(k))).await.unwrap());
        }
        // Past the census that the adds asked for (at most 2 s after the last).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let listed = node.jobs().rows_listed();
        assert_eq!(node.unfinished_jobs_of("u").await.unwrap(), 2);
        assert_eq!(node.unfinished_jobs_of("v").await.unwrap(), 0);
        assert_eq!(
            node.jobs().rows_listed(),
            listed,
            "a user's count read every job"
        );
        node.cancel(&mine[0].job_id).await.unwrap();
        assert_eq!(node.unfinished_jobs_of("u").await.unwrap(), 1);
        node.shutdown().await;
    })
    .await;
}
