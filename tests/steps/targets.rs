//! Steps jobs on a real embedded store: targets are honoured, order is strict, the
//! alternative command path marks the job failed with both exit statuses, and a step for a
//! node that does not exist yet waits visibly and runs once that node starts.

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use crate::support::steps::{Cluster, Recorder, test_config};
use couch_replicator::steps::{
    JobOutcome, JobSpec, ListOptions, RetryStrategy, StepSpec, StepStatus, StepsState, Target,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_are_honoured_and_steps_run_in_order() {
    deadline(60, "targets are honoured and steps run in order", async {
        let mut c = Cluster::open(test_config()).await;
        let rec = Recorder::default();
        c.start_node("a", 2, Arc::new(rec.clone())).await;
        c.start_node("b", 2, Arc::new(rec.clone())).await;
        let api = c.api("front");
        let shape = ["a", "b", "a", "any", "b"];
        let mut ids = Vec::new();
        for _ in 0..4 {
            let steps = shape
                .iter()
                .map(|t| StepSpec::new(*t, "sleep 0.05"))
                .collect();
            ids.push(api.submit(JobSpec::new(steps)).await.unwrap());
        }
        for id in &ids {
            let view = api
                .wait_done(id, Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(view.state, StepsState::Success);
            assert_eq!(view.doc.status, Some(JobOutcome::Success));
            assert_eq!(view.doc.current_step, shape.len());
            assert_eq!(view.doc.creator, "front");
            for (i, s) in view.doc.steps.iter().enumerate() {
                assert_eq!(s.status, StepStatus::Succeeded);
                assert_eq!((s.attempts, s.runs, s.exit_status), (1, 1, Some(0)));
                let ex = s.executor.as_ref().unwrap();
                assert!(
                    s.target.admits(&ex.node),
                    "step {i} for {} ran on {}",
                    s.target,
                    ex.node
                );
                assert!(s.started_at <= s.finished_at);
            }
            let runs: Vec<_> = rec.events().into_iter().filter(|e| &e.job == id).collect();
            assert_eq!(runs.len(), shape.len(), "each step runs exactly once");
            for (i, (e, target)) in runs.iter().zip(shape).enumerate() {
                assert_eq!(e.step, i, "steps run in order");
                if target != "any" {
                    assert_eq!(e.node, target);
                }
            }
            for pair in runs.windows(2) {
                assert!(
                    pair[0].end.unwrap() <= pair[1].start,
                    "step overlapped the previous one"
                );
            }
        }
        let list = api.list(ListOptions::default()).await.unwrap();
        assert_eq!(list.jobs.len(), 4);
        assert!(
            list.jobs
                .iter()
                .all(|j| j.state == StepsState::Success && j.step_count == 5)
        );
        // A worker counts its finish after the finishing commit returns, which may be just
        // after the job is seen done: wait for the count, then check it is exact.
        let counts = crate::support::wait_for(30, "every finish counted", || async {
            let counts = c.stats.snapshot();
            (counts.finishes >= 20).then_some(counts)
        })
        .await;
        assert_eq!(counts.finishes, 20);
        assert_eq!(counts.accepts, 20);
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_step_runs_the_alternative_and_fails_the_job() {
    deadline(
        60,
        "failing step runs the alternative and fails the job",
        async {
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            c.start_node("a", 1, Arc::new(rec.clone())).await;
            let api = c.api("a");
            let retry = RetryStrategy {
                max_retries: 2,
                sleep: 0.1,
                sleep_factor: 2.0,
                sleep_max: None,
            };
            let id = api
                .submit(JobSpec::new(vec![
                    StepSpec::new("a", "flaky 1").with_retry(retry.clone()),
                    StepSpec::new("any", "exit 4")
                        .with_retry(retry)
                        .with_alt("exit 9"),
                    StepSpec::new("a", "sleep 0"),
                ]))
                .await
                .unwrap();
            let view = api
                .wait_done(&id, Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(view.state, StepsState::Failed);
            let d = &view.doc;
            assert_eq!(d.status, Some(JobOutcome::Failed));
            assert_eq!(d.current_step, 1, "the failed step stays current");
            assert_eq!(d.steps[0].status, StepStatus::Succeeded);
            assert_eq!(
                d.steps[0].attempts, 2,
                "flaky 1 succeeds on its first retry"
            );
            let s = &d.steps[1];
            assert_eq!(s.status, StepStatus::Failed);
            assert_eq!(
                (s.attempts, s.exit_status, s.alt_exit_status),
                (3, Some(4), Some(9))
            );
            assert_eq!(s.output.as_deref(), Some("exit 4"));
            assert_eq!(s.alt_output.as_deref(), Some("exit 9"));
            assert_eq!(d.steps[2].status, StepStatus::Skipped);
            let ev = rec.events();
            assert!(
                ev.iter().all(|e| e.step < 2),
                "nothing runs after a failed step"
            );
            let retries: Vec<_> = ev.iter().filter(|e| e.step == 1).collect();
            assert_eq!(retries.len(), 4);
            assert!(retries[3].alternative);
            // Sleeps of 0.1 then 0.2 s between the three attempts.
            let gap = |a: usize, b: usize| retries[b].start.duration_since(retries[a].start);
            assert!(gap(0, 1) >= Duration::from_millis(100));
            assert!(gap(1, 2) >= Duration::from_millis(200));
            c.stop_all().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_for_an_unknown_node_waits_until_that_node_starts() {
    deadline(
        60,
        "a step for an unknown node waits until that node starts",
        async {
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            c.start_node("a", 2, Arc::new(rec.clone())).await;
            let api = c.api("a");
            let id = api
                .submit(JobSpec::new(vec![
                    StepSpec::new("a", "sleep 0"),
                    StepSpec::new("late", "sleep 0"),
                    StepSpec::new("any", "sleep 0"),
                ]))
                .await
                .unwrap();
            // Step 0 runs; step 1 waits for node "late", visibly.
            let waiting = async {
                loop {
                    let v = api.get(&id).await.unwrap();
                    if v.doc.current_step == 1 {
                        return v;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            let v = deadline(
                20,
                "a step for an unknown node waits until that node starts",
                waiting,
            )
            .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let v2 = api.get(&id).await.unwrap();
            assert_eq!(v2, v, "nothing happens while node late is absent");
            assert_eq!(v.state, StepsState::Pending);
            assert_eq!(v.doc.steps[1].status, StepStatus::Pending);
            assert_eq!(v.doc.steps[1].target, Target::Node("late".into()));
            let pending = api
                .list(ListOptions {
                    state: Some(StepsState::Pending),
                    ..ListOptions::default()
                })
                .await
                .unwrap();
            assert_eq!(pending.jobs.len(), 1);
            assert_eq!(
                pending.jobs[0].current_target,
                Some(Target::Node("late".into()))
            );
            c.start_node("late", 1, Arc::new(rec.clone())).await;
            let done = api
                .wait_done(&id, Duration::from_secs(20))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(done.state, StepsState::Success);
            assert_eq!(done.doc.steps[1].executor.as_ref().unwrap().node, "late");
            let success = api
                .list(ListOptions {
                    state: Some(StepsState::Pending),
                    ..ListOptions::default()
                })
                .await
                .unwrap();
            assert!(success.jobs.is_empty());
            c.stop_all().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_rejects_bad_jobs_and_unknown_ids() {
    deadline(30, "api rejects bad jobs and unknown ids", async {
        let c = Cluster::open(test_config()).await;
        let api = c.api("a");
        let err = api.submit(JobSpec::new(vec![])).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid job: a job needs at least one step"
        );
        let err = api
            .submit(JobSpec::new(vec![
                StepSpec::new("a", "x"),
                StepSpec::new("no way", "x"),
            ]))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("step 1: bad target"), "{err}");
        assert!(matches!(
            api.get("nope").await,
            Err(couch_replicator::steps::StepsError::NotFound(_))
        ));
        assert!(
            api.list(ListOptions::default())
                .await
                .unwrap()
                .jobs
                .is_empty()
        );
        // The default action refuses to run commands: the job fails, clearly.
        let mut c = c;
        c.start_node("a", 1, Arc::new(couch_replicator::steps::DisabledAction))
            .await;
        let id = api
            .submit(JobSpec::new(vec![StepSpec::new("a", "rm -rf /")]))
            .await
            .unwrap();
        let v = api
            .wait_done(&id, Duration::from_secs(20))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(v.state, StepsState::Failed);
        assert_eq!(
            v.doc.steps[0].error.as_deref(),
            Some("command execution is disabled")
        );
        c.stop_all().await;
    })
    .await;
}
