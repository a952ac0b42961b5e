//! Subscriptions and the notifier (CouchDB's couch_jobs.erl and couch_jobs_notifier.erl): event sequences, auto-unsubscribe,
//! already-finished jobs, removal, subscriber death, and a notifier round driven directly.

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::jobs::notifier::NotifierCore;
use couch_replicator::jobs::subscription::wait_any;
use couch_replicator::jobs::{
    AcceptOpts, EventState, JobData, JobState, Jobs, JobsError, JobsOptions, Subscribed, TokioClock,
};
use couch_replicator::store::Db;
use couch_replicator::store::memory::MemoryStore;
use serde_json::json;
use tokio::sync::mpsc;

const T: &str = "sub";
const W: Duration = Duration::from_secs(5);

fn data(v: serde_json::Value) -> JobData {
    v.as_object().cloned().expect("object")
}

fn jobs() -> Jobs {
    Jobs::new(
        Db::new(Arc::new(MemoryStore::new())),
        JobsOptions {
            clock: Arc::new(TokioClock::new()),
            ..JobsOptions::default()
        },
    )
}

fn now_opts() -> AcceptOpts {
    AcceptOpts::default().timeout(Duration::ZERO)
}

#[tokio::test(start_paused = true)]
async fn subscription_sees_pending_running_updates_finished_then_ends() {
    deadline(
        120,
        "subscription sees pending running updates finished then ends",
        async {
            let j = jobs();
            let bg = j.start_background().await.unwrap();
            j.set_type_timeout(T, 30).await.unwrap();
            assert!(matches!(
                j.subscribe(T, "a").await,
                Err(JobsError::NotFound)
            ));
            j.add(T, "a", data(json!({"v": 0})), 0).await.unwrap();
            let Subscribed::Active {
                mut sub,
                state,
                data: d,
            } = j.subscribe(T, "a").await.unwrap()
            else {
                panic!("expected an active subscription");
            };
            assert_eq!((state, d), (JobState::Pending, data(json!({"v": 0}))));
            // The type's notifier holds the subscription.
            let notifier = bg.notifier(T).expect("the type's notifier");
            let seen = supervisors::observe(&notifier).await.unwrap();
            assert_eq!(seen.job_type, T);
            assert_eq!((seen.subscribers, seen.jobs), (1, 1));
            // Nothing changed yet: no event.
            assert_eq!(sub.wait(Duration::from_millis(500)).await, None);

            let (job, _) = j.accept(T, now_opts()).await.unwrap();
            let ev = sub.wait(W).await.unwrap();
            assert_eq!((ev.state, ev.id.as_str()), (EventState::Running, "a"));
            let job = j.update(&job, Some(data(json!({"v": 1})))).await.unwrap();
            let ev = sub.wait(W).await.unwrap();
            assert_eq!(ev.state, EventState::Running);
            assert_eq!(ev.data, Some(data(json!({"v": 1}))));
            let job = j.update(&job, Some(data(json!({"v": 2})))).await.unwrap();
            let ev = sub.wait(W).await.unwrap();
            assert_eq!(ev.data, Some(data(json!({"v": 2}))));
            j.finish(&job, Some(data(json!({"done": true}))))
                .await
                .unwrap();
            let ev = sub.wait(W).await.unwrap();
            assert_eq!(ev.state, EventState::Finished);
            assert_eq!(ev.data, Some(data(json!({"done": true}))));
            // Auto-unsubscribed: the stream ends.
            assert_eq!(sub.wait(W).await, None);
            let seen = supervisors::observe(&notifier).await.unwrap();
            assert_eq!((seen.subscribers, seen.jobs), (0, 0));

            // Already finished → no subscription.
            match j.subscribe(T, "a").await.unwrap() {
                Subscribed::Finished(d) => assert_eq!(d, data(json!({"done": true}))),
                Subscribed::Active { .. } => panic!("finished job must not subscribe"),
            }
            bg.stop().await;
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn removal_is_not_found_and_resubmit_is_pending() {
    deadline(120, "removal is not found and resubmit is pending", async {
        let j = jobs();
        let bg = j.start_background().await.unwrap();
        j.set_type_timeout(T, 30).await.unwrap();
        j.add(T, "r", data(json!({})), 0).await.unwrap();
        j.add(T, "p", data(json!({})), 0).await.unwrap();
        let mut subs = Vec::new();
        for id in ["r", "p"] {
            match j.subscribe(T, id).await.unwrap() {
                Subscribed::Active { sub, .. } => subs.push(sub),
                Subscribed::Finished(_) => panic!("not finished"),
            }
        }
        let (job, _) = j.accept(T, now_opts()).await.unwrap();
        let first = wait_any(&mut subs, W).await.unwrap();
        assert_eq!(first.1.state, EventState::Running);
        assert_eq!(first.1.id, job.id);
        let other = if job.id == "r" { "p" } else { "r" };
        j.remove(T, other).await.unwrap();
        let (i, ev) = wait_any(&mut subs, W).await.unwrap();
        assert_eq!(
            (ev.state, ev.id.as_str(), ev.data),
            (EventState::NotFound, other, None)
        );
        assert_eq!(subs[i].wait(W).await, None);
        // The running job is resubmitted and finished: it goes back to pending.
        j.resubmit(T, &job.id, None, None).await.unwrap();
        j.finish(&job, None).await.unwrap();
        let (_, ev) = wait_any(&mut subs, W).await.unwrap();
        assert_eq!(
            (ev.state, ev.id.as_str()),
            (EventState::Pending, job.id.as_str())
        );
        bg.stop().await;
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn notifier_round_rules_and_dead_subscribers() {
    deadline(120, "notifier round rules and dead subscribers", async {
        let j = jobs();
        j.set_type_timeout(T, 30).await.unwrap();
        j.add(T, "a", data(json!({})), 0).await.unwrap();
        let mut core = NotifierCore::new(j.db().clone(), j.keys().clone(), T, j.config());
        assert_eq!(core.round().await.unwrap(), 0);
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let (tx2, rx2) = mpsc::unbounded_channel();
        core.subscribe("a", EventState::Pending, None, tx1);
        core.subscribe("a", EventState::Pending, None, tx2);
        assert_eq!(core.subscriber_count(), 2);
        // Unchanged non-running state: nothing delivered.
        assert_eq!(core.round().await.unwrap(), 0);
        // A subscriber that went away is cleaned up.
        drop(rx2);
        assert_eq!(core.subscriber_count(), 1);
        let (job, _) = j.accept(T, now_opts()).await.unwrap();
        assert_eq!(core.round().await.unwrap(), 1);
        assert_eq!(rx1.try_recv().unwrap().state, EventState::Running);
        // Same Seq → no repeat; newer Seq → delivered.
        assert_eq!(core.round().await.unwrap(), 0);
        let job = j.update(&job, None).await.unwrap();
        assert_eq!(core.round().await.unwrap(), 1);
        assert_eq!(rx1.try_recv().unwrap().state, EventState::Running);
        j.finish(&job, None).await.unwrap();
        assert_eq!(core.round().await.unwrap(), 1);
        assert_eq!(rx1.try_recv().unwrap().state, EventState::Finished);
        assert_eq!(core.subscriber_count(), 0);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn subscribing_without_background_is_unavailable() {
    deadline(
        120,
        "subscribing without background is unavailable",
        async {
            let j = jobs();
            j.set_type_timeout(T, 30).await.unwrap();
            j.add(T, "a", data(json!({})), 0).await.unwrap();
            assert!(matches!(
                j.subscribe(T, "a").await,
                Err(JobsError::Unavailable(_))
            ));
        },
    )
    .await
}
