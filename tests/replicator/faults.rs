//! Faults of the real tree against pouchdb-server: crash backoff and healing, a killed job
//! actor re-enqueued by the activity monitor, rest_for_one restarts, duplicate replications,
//! graceful shutdown handing jobs to another node.

use crate::support::deadline;
use std::time::Duration;

use crate::support::nodes::{Nodes, until_job};
use crate::support::replicator::*;
use couch_replicator::jobs::JobState;
use couch_replicator::replicator::job::REP_JOBS;
use couch_replicator::replicator::job::actor::JobMsg;
use couch_replicator::replicator::{HistoryKind, JobError};
use couch_replicator::replicator::{
    JobId, JobKind, JobView, NewJob, RepState, Replicator, ReplicatorSettings, WaitFor,
};
use serde_json::{Value, json};

fn persistent(doc: &str, rep: Value) -> NewJob {
    NewJob::from_body(
        JobKind::Persistent {
            db_name: "_replicator".into(),
            doc_id: doc.into(),
        },
        rep,
    )
}

/// Waits (on the node's events, up to 60 s) until the job's view satisfies `ok`.
async fn wait_until(
    node: &Replicator,
    id: &JobId,
    what: &str,
    ok: impl Fn(&JobView) -> bool,
) -> JobView {
    until_job(node, id, 60, what, ok).await
}

async fn stime_of(node: &Replicator, id: &str) -> i64 {
    node.jobs()
        .fold_jobs(
            REP_JOBS,
            None,
            |acc, j| if j.id == id { Some(j.stime) } else { acc },
        )
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_job_backs_off_by_the_formula_then_heals() {
    deadline(
        280,
        "a crashing job backs off by the formula then heals",
        async {
            let pouch = Pouch::start().await;
            let nodes = Nodes::on_disk();
            let settings = ReplicatorSettings {
                min_backoff_penalty: Duration::from_secs(2),
                max_backoff_penalty: Duration::from_secs(1000),
                health_threshold: Duration::from_secs(2),
                ..test_settings()
            };
            let n = nodes.start("n1", settings).await;
            let rep = json!({"source": pouch.url("missing"), "target": pouch.url("t"),
                         "create_target": true, "continuous": true});
            let id = n.add(persistent("crashy", rep)).await.unwrap().job_id;
            for errors in 1..=3u32 {
                let v = wait_until(&n, &id, "crashed", |v| {
                    v.state == RepState::Crashing && v.error_count == errors
                })
                .await;
                assert!(
                    matches!(&v.state_info, Some(JobError::Replication { tag, .. }) if tag.as_str() == "db_not_found"),
                    "{:?}",
                    v.state_info
                );
                let crashed = v
                    .history
                    .iter()
                    .find(|h| h.kind == HistoryKind::Crashed)
                    .unwrap()
                    .timestamp;
                let wait = (stime_of(&n, id.as_str()).await - crashed) as f64;
                // min(2 s x 2^errors, max) with 25 % jitter, rounded up to whole seconds.
                let full = 2.0 * 2f64.powi(errors as i32);
                assert!(
                    wait >= (0.75 * full).floor() && wait <= full + 2.0,
                    "crash {errors}: rescheduled {wait} s later, formula gives {full} s"
                );
                // The crash is the newest event (CouchDB shows none for going back to pending).
                assert_eq!(v.history[0].kind, HistoryKind::Crashed);
                assert!(v.history[0].reason.is_some(), "{:?}", v.history[0]);
                // Skip the wait: make it eligible now.
                let now = n.jobs().clock().now_secs();
                n.jobs()
                    .resubmit(REP_JOBS, id.as_str(), Some(now), None)
                    .await
                    .unwrap();
            }
            // Fix the cause: the job runs, and after health_threshold its count is reset.
            pouch.create_db("missing").await;
            pouch.put_docs("missing", "d", 10).await;
            let now = n.jobs().clock().now_secs();
            n.jobs()
                .resubmit(REP_JOBS, id.as_str(), Some(now), None)
                .await
                .unwrap();
            wait_until(&n, &id, "ran", |v| v.state == RepState::Running).await;
            pouch.wait_count("t", 10, Duration::from_secs(20)).await;
            let healed = wait_until(&n, &id, "healed", |v| v.error_count == 0).await;
            assert_eq!(healed.state, RepState::Running);
            n.shutdown().await;
        },
    )
    .await;
}

async fn job_actors(n: &Replicator) -> Vec<ractor::ActorRef<JobMsg>> {
    let sup = n.job_sup();
    sup.which_children()
        .iter()
        .filter_map(|id| sup.which_child(id))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_job_actor_is_reenqueued_and_runs_again() {
    deadline(
        270,
        "a killed job actor is reenqueued and runs again",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("s").await;
            pouch.put_docs("s", "a", 20).await;
            let nodes = Nodes::on_disk();
            let n = nodes.start("n1", test_settings()).await;
            let rep = json!({"source": pouch.url("s"), "target": pouch.url("t"),
                         "create_target": true, "continuous": true});
            let id = n.add(persistent("k", rep)).await.unwrap().job_id;
            let first = wait_until(&n, &id, "ran", |v| v.state == RepState::Running).await;
            pouch.wait_count("t", 20, Duration::from_secs(20)).await;
            let actors = job_actors(&n).await;
            assert_eq!(actors.len(), 1);
            actors[0].kill();
            // No terminate hook ran: couch_jobs still says running until the activity monitor
            // (3 s timeout) re-enqueues it; then an acceptor takes it again.
            let again = wait_until(&n, &id, "restarted", |v| {
                v.state == RepState::Running && v.pid != first.pid
            })
            .await;
            assert_eq!(
                again
                    .history
                    .iter()
                    .filter(|h| h.kind == HistoryKind::Started)
                    .count(),
                2
            );
            assert_eq!(again.error_count, 0, "a kill is not a crash");
            pouch.put_docs("s", "b", 5).await;
            pouch.wait_count("t", 25, Duration::from_secs(20)).await;
            n.shutdown().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_the_pool_restarts_later_children_and_jobs_resume() {
    deadline(
        270,
        "crashing the pool restarts later children and jobs resume",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("s").await;
            pouch.put_docs("s", "a", 10).await;
            let nodes = Nodes::on_disk();
            let n = nodes.start("n1", test_settings()).await;
            let rep = json!({"source": pouch.url("s"), "target": pouch.url("t"),
                         "create_target": true, "continuous": true});
            let id = n.add(persistent("r", rep)).await.unwrap().job_id;
            let first = wait_until(&n, &id, "ran", |v| v.state == RepState::Running).await;
            pouch.wait_count("t", 10, Duration::from_secs(20)).await;
            let order = [
                "event_bus",
                "clustering",
                "connection_pool",
                "rate_limiter",
                "job_server",
                "job_sup",
            ];
            let ids = |n: &Replicator| {
                order
                    .iter()
                    .map(|c| n.tree().children().cell(c).map(|c| c.get_id()))
                    .collect::<Vec<_>>()
            };
            let before = ids(&n);
            assert!(before.iter().all(Option::is_some));
            n.tree().children().cell("connection_pool").unwrap().kill();
            let mut after = ids(&n);
            for _ in 0..100 {
                if after.iter().all(Option::is_some) && after[5] != before[5] {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                after = ids(&n);
            }
            assert_eq!(after[..2], before[..2], "earlier children are untouched");
            for i in 2..6 {
                assert_ne!(after[i], before[i], "{} was not restarted", order[i]);
            }
            // The job was stopped gracefully with job_sup (back to pending) and runs again.
            let again = wait_until(&n, &id, "resumed", |v| {
                v.state == RepState::Running && v.pid != first.pid
            })
            .await;
            assert!(again.history.iter().any(|h| h.kind == HistoryKind::Stopped));
            pouch.put_docs("s", "b", 5).await;
            pouch.wait_count("t", 15, Duration::from_secs(20)).await;
            n.shutdown().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_replications_fail_or_crash_as_couchdb_does() {
    deadline(
        270,
        "duplicate replications fail or crash as couchdb does",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("s").await;
            pouch.put_docs("s", "a", 5).await;
            let nodes = Nodes::on_disk();
            let n = nodes.start("n1", test_settings()).await;
            let rep = json!({"source": pouch.url("s"), "target": pouch.url("t"),
                         "create_target": true, "continuous": true});
            let a = n.add(persistent("a", rep.clone())).await.unwrap().job_id;
            let ra = wait_until(&n, &a, "ran", |v| v.state == RepState::Running).await;
            let b = n.add(persistent("b", rep.clone())).await.unwrap().job_id;
            let rb = wait_until(&n, &b, "failed", |v| v.state == RepState::Failed).await;
            let reason = rb.state_info.clone().unwrap();
            assert!(
                matches!(&reason, JobError::DuplicateDocument { other_doc, .. } if a.as_str().ends_with(other_doc.as_str())),
                "{reason:?}"
            );
            assert!(reason.to_string().contains("already started"), "{reason}");
            let t = n
                .add(NewJob::from_body(JobKind::Transient { user: None }, rep))
                .await
                .unwrap()
                .job_id;
            let rt = wait_until(&n, &t, "crashed", |v| v.state == RepState::Crashing).await;
            assert!(
                matches!(&rt.state_info, Some(JobError::DuplicateJob { other }) if *other == a),
                "{:?}",
                rt.state_info
            );
            // The original keeps running and owns the replication id.
            let owner = n
                .get(ra.rep_id.as_ref().unwrap())
                .await
                .unwrap();
            assert_eq!(owner.job_id, a);
            assert_eq!(owner.state, RepState::Running);
            n.shutdown().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_checkpoints_and_another_node_takes_over() {
    deadline(
        270,
        "graceful shutdown checkpoints and another node takes over",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("s").await;
            pouch.put_docs("s", "a", 30).await;
            let nodes = Nodes::on_disk();
            let n1 = nodes.start("n1", test_settings()).await;
            let rep = json!({"source": pouch.url("s"), "target": pouch.url("t"),
                         "create_target": true, "continuous": true, "checkpoint_interval": 500});
            let id = n1.add(persistent("g", rep)).await.unwrap().job_id;
            wait_until(&n1, &id, "ran", |v| v.state == RepState::Running).await;
            pouch.wait_count("t", 30, Duration::from_secs(20)).await;
            let jobs = n1.jobs().clone();
            n1.shutdown().await;
            // Queued, not taken back by the stopping node's own acceptors (they held it until
            // the activity timeout when they took it as job_sup stopped).
            let state = jobs.get_job_state(REP_JOBS, id.as_str()).await.unwrap();
            assert_eq!(state, JobState::Pending);
            let data = jobs.get_job_data(REP_JOBS, id.as_str()).await.unwrap();
            let v = JobView::from_data(&id, &data).unwrap();
            assert_eq!(v.state, RepState::Pending);
            assert_eq!(v.history[0].kind, HistoryKind::Stopped);
            assert!(v.history.iter().all(|h| h.kind != HistoryKind::Pending));
            assert_eq!(
                v.stats.as_ref().unwrap().docs_written,
                30,
                "final stats were saved: {:#?}",
                v
            );
            let n2 = nodes.start("n2", test_settings()).await;
            let moved = wait_until(&n2, &id, "moved", |v| {
                v.state == RepState::Running && v.node.as_ref().is_some_and(|n| n == "n2")
            })
            .await;
            assert_eq!(moved.error_count, 0);
            pouch.put_docs("s", "b", 5).await;
            pouch.wait_count("t", 35, Duration::from_secs(20)).await;
            // Stats carry over, and the checkpoint let n2 start where n1 stopped: it checked only
            // the 5 new revisions (from scratch it would have checked 30 + 35).
            let later = wait_until(&n2, &id, "counted", |v| {
                v.stats
                    .as_ref()
                    .is_some_and(|s| s.docs_written == 35 && s.checkpointed_source_seq == 35)
            })
            .await;
            let stats = later.stats.unwrap();
            assert_eq!(stats.revisions_checked, 35);
            assert_eq!(stats.checkpointed_source_seq, 35);
            let _ = n2
                .wait(&id, WaitFor::Running, Duration::from_secs(1))
                .await
                .unwrap();
            n2.shutdown().await;
        },
    )
    .await;
}
