//! Retry timing on paused tokio time, through the whole stack (memory engine, couch_jobs with
//! a tokio clock and its activity monitor, a supervised node, the worker's keep-alives): the
//! attempts of a failing step happen exactly at the strategy's offsets, the step keeps its
//! worker through retry sleeps far longer than the activity timeout, and the alternative
//! command runs right after the last failed attempt.

use std::sync::Arc;
use std::time::Duration;

use crate::support::steps::{Recorder, jobs_config};
use couch_replicator::jobs::{Jobs, JobsOptions, TokioClock};
use couch_replicator::steps::{
    JobSpec, RetryStrategy, StepSpec, StepStatus, Steps, StepsConfig, StepsNode, StepsState,
};
use couch_replicator::store::Db;
use couch_replicator::store::memory::MemoryStore;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn attempts_follow_the_strategy_on_paused_time_and_keep_their_worker() {
    let run = async {
        let jobs = Jobs::new(
            Db::new(Arc::new(MemoryStore::new())),
            JobsOptions {
                clock: Arc::new(TokioClock::new()),
                config: jobs_config(),
                ..JobsOptions::default()
            },
        );
        let background = jobs.start_background().await.unwrap();
        let config = StepsConfig {
            activity_timeout_secs: 5,
            ..StepsConfig::default()
        };
        let steps = Steps::new(jobs, "a", config).unwrap();
        let rec = Recorder::default();
        let node = StepsNode::start(steps.clone(), Arc::new(rec.clone()), 1)
            .await
            .unwrap();
        // 10 s, 20 s, then 40 s capped at 30 s: every sleep outlasts the 5 s activity timeout.
        let retry = RetryStrategy {
            max_retries: 3,
            sleep: 10.0,
            sleep_factor: 2.0,
            sleep_max: Some(30.0),
        };
        let ok = steps
            .submit(JobSpec::new(vec![
                StepSpec::new("a", "flaky 3").with_retry(retry.clone()),
            ]))
            .await
            .unwrap();
        let v = steps
            .wait_done(&ok, Duration::from_secs(600))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(v.state, StepsState::Success);
        assert_eq!((v.doc.steps[0].runs, v.doc.steps[0].attempts), (1, 4));
        let offsets = |job: &str| {
            let ev: Vec<_> = rec.events().into_iter().filter(|e| e.job == job).collect();
            let t0: Instant = ev[0].start;
            ev.iter()
                .map(|e| (e.start.duration_since(t0).as_secs(), e.alternative))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            offsets(&ok),
            [(0, false), (10, false), (30, false), (60, false)]
        );

        let failing = steps
            .submit(JobSpec::new(vec![
                StepSpec::new("a", "exit 2")
                    .with_retry(retry)
                    .with_alt("exit 0"),
            ]))
            .await
            .unwrap();
        let v = steps
            .wait_done(&failing, Duration::from_secs(600))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(v.state, StepsState::Failed);
        let s = &v.doc.steps[0];
        assert_eq!(s.status, StepStatus::Failed);
        assert_eq!(
            (s.runs, s.attempts, s.exit_status, s.alt_exit_status),
            (1, 4, Some(2), Some(0))
        );
        assert_eq!(
            offsets(&failing),
            [
                (0, false),
                (10, false),
                (30, false),
                (60, false),
                (60, true)
            ]
        );
        node.stop(Duration::from_secs(5)).await;
        background.stop().await;
    };
    tokio::time::timeout(Duration::from_secs(3600), run)
        .await
        .expect("test deadline");
}
