//! The alternative-command path with real `/bin/sh` commands through the shell action, on a
//! real store and node: when every attempt fails the alternative runs and the job is failed
//! with both exit statuses, whether the alternative itself exits 0 or not; steps after the
//! failed one are skipped, and a command's side effects happen once per attempt.

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use crate::support::steps::{Cluster, test_config};
use couch_replicator::steps::{
    JobOutcome, JobSpec, RetryStrategy, ShellAction, StepSpec, StepStatus, StepsState,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_steps_run_the_alternative_and_keep_both_exit_statuses() {
    deadline(
        60,
        "failed steps run the alternative and keep both exit statuses",
        async {
            let mut c = Cluster::open(test_config()).await;
            let shell = ShellAction::new(Duration::from_secs(10));
            c.start_node("a", 2, Arc::new(shell)).await;
            let api = c.api("a");
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("attempts");
            let log = log.to_str().unwrap();
            let retry = RetryStrategy {
                max_retries: 2,
                sleep: 0.05,
                sleep_factor: 2.0,
                sleep_max: None,
            };
            // Alternative exits 0: the job is still failed (the step's command never succeeded).
            let alt_ok = api
                .submit(JobSpec::new(vec![
                    StepSpec::new("a", format!("echo try >> {log}; exit 3"))
                        .with_retry(retry.clone())
                        .with_alt("echo cleaned up; exit 0"),
                    StepSpec::new("any", format!("echo never >> {log}")),
                ]))
                .await
                .unwrap();
            // Alternative exits non-zero.
            let alt_bad = api
                .submit(JobSpec::new(vec![
                    StepSpec::new("any", "echo fine"),
                    StepSpec::new("a", "echo oops >&2; exit 4").with_alt("echo alt failed; exit 7"),
                ]))
                .await
                .unwrap();
            let wait = |id: String| {
                let api = api.clone();
                async move {
                    api.wait_done(&id, Duration::from_secs(30))
                        .await
                        .unwrap()
                        .unwrap()
                }
            };
            let v = wait(alt_ok).await;
            assert_eq!(
                (v.state, v.doc.status),
                (StepsState::Failed, Some(JobOutcome::Failed))
            );
            let s = &v.doc.steps[0];
            assert_eq!(s.status, StepStatus::Failed);
            assert_eq!(
                (s.attempts, s.exit_status, s.alt_exit_status),
                (3, Some(3), Some(0))
            );
            assert_eq!(s.alt_output.as_deref().map(str::trim), Some("cleaned up"));
            assert_eq!(v.doc.steps[1].status, StepStatus::Skipped);
            let tries = std::fs::read_to_string(log).unwrap();
            assert_eq!(
                tries, "try\ntry\ntry\n",
                "one side effect per attempt, none after"
            );

            let v = wait(alt_bad).await;
            assert_eq!(v.state, StepsState::Failed);
            assert_eq!(v.doc.steps[0].status, StepStatus::Succeeded);
            assert_eq!(
                v.doc.steps[0].output.as_deref().map(str::trim),
                Some("fine")
            );
            let s = &v.doc.steps[1];
            assert_eq!(
                (s.attempts, s.exit_status, s.alt_exit_status),
                (1, Some(4), Some(7))
            );
            assert!(
                s.output.as_deref().unwrap().contains("oops"),
                "{:?}",
                s.output
            );
            assert_eq!(s.alt_output.as_deref().map(str::trim), Some("alt failed"));
            c.stop_all().await;
        },
    )
    .await;
}
