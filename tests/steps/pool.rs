//! A node's supervised pool of step workers: a crashed worker is restarted (and counted), a
//! graceful stop lets the running step finish and takes no new one, and a worker that keeps
//! crashing makes the supervisor give up (restart intensity) instead of spinning.

use crate::support::{deadline, wait_for};
use std::sync::Arc;
use std::time::Duration;

use crate::support::steps::{Cluster, Recorder, test_config};
use couch_replicator::steps::node::MAX_RESTARTS;
use couch_replicator::steps::{JobSpec, StepSpec, StepStatus, StepsState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_finishes_the_running_step_and_takes_no_new_one() {
    deadline(
        60,
        "a graceful stop finishes the running step and takes no new one",
        async {
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            c.start_node("a", 1, Arc::new(rec.clone())).await;
            let api = c.api("front");
            let id = api
                .submit(JobSpec::new(vec![
                    StepSpec::new("a", "sleep 0.6"),
                    StepSpec::new("a", "sleep 0"),
                ]))
                .await
                .unwrap();
            let running = async {
                while rec.events().is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            deadline(
                20,
                "a graceful stop finishes the running step and takes no new one",
                running,
            )
            .await;
            assert!(c.node("a").is_running());
            c.stop_node("a", Duration::from_secs(10)).await;
            let v = api.get(&id).await.unwrap();
            assert_eq!(
                v.doc.steps[0].status,
                StepStatus::Succeeded,
                "the running step ended"
            );
            assert_eq!(v.doc.current_step, 1);
            assert_eq!(v.state, StepsState::Pending, "step 1 waits for a node a");
            assert_eq!(
                rec.events().len(),
                1,
                "nothing new was taken after the stop"
            );
            // The same node name, started again, continues the job.
            c.start_node("a", 1, Arc::new(rec.clone())).await;
            let v = api
                .wait_done(&id, Duration::from_secs(20))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(v.state, StepsState::Success);
            assert_eq!(v.doc.steps[1].runs, 1);
            c.stop_all().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_worker_is_restarted_until_the_intensity_limit() {
    deadline(
        60,
        "a crashing worker is restarted until the intensity limit",
        async {
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            c.start_node("a", 2, Arc::new(rec.clone())).await;
            let api = c.api("front");
            let before = [0, 1].map(|i| c.node("a").worker(i).expect("a running worker"));
            for (i, w) in before.iter().enumerate() {
                let seen = supervisors::observe(w).await.unwrap();
                assert_eq!(seen.worker, format!("a/{i}"));
                assert!(seen.loop_running && !seen.shutting_down, "{seen:?}");
            }
            // One crash first: the worker comes back and runs the next job.
            let crash = api
                .submit(JobSpec::new(vec![StepSpec::new("a", "panic always")]))
                .await
                .unwrap();
            let restarted = async {
                while c.node("a").restarts() < 1 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            deadline(
                20,
                "a crashing worker is restarted until the intensity limit",
                restarted,
            )
            .await;
            assert!(c.node("a").is_running());
            // The crashed worker's actor is gone; its replacement runs a fresh loop.
            let crashed = wait_for(10, "one worker's actor ended", || async {
                let mut gone = Vec::new();
                for (i, w) in before.iter().enumerate() {
                    if supervisors::observe(w).await.is_none() {
                        gone.push(i);
                    }
                }
                gone.first().copied()
            })
            .await;
            let fresh = wait_for(10, "the crashed worker restarted", || async {
                let w = c.node("a").worker(crashed)?;
                supervisors::observe(&w).await
            })
            .await;
            assert!(fresh.loop_running && !fresh.shutting_down, "{fresh:?}");
            api.get(&crash).await.unwrap();
            // Every job crashes its worker: more than MAX_RESTARTS crashes within the period
            // (each crash takes a fresh job, so none waits for the activity monitor).
            for _ in 0..(2 * MAX_RESTARTS) {
                api.submit(JobSpec::new(vec![StepSpec::new("a", "panic always")]))
                    .await
                    .unwrap();
            }
            let gave_up = async {
                while c.node("a").is_running() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            deadline(
                30,
                "a crashing worker is restarted until the intensity limit",
                gave_up,
            )
            .await;
            // MAX_RESTARTS restarts are allowed; the crash after them ends the pool. A restart
            // the supervisor granted may still be waiting out its delay then (one per other
            // worker), so it never happens.
            let restarts = c.node("a").restarts();
            assert!(
                (u64::from(MAX_RESTARTS) - 1..=u64::from(MAX_RESTARTS)).contains(&restarts),
                "{restarts} restarts before giving up"
            );
            // No worker runs any more: later jobs stay pending.
            let seen = rec.events().len();
            let later = api
                .submit(JobSpec::new(vec![StepSpec::new("a", "sleep 0")]))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(rec.events().len(), seen);
            assert_eq!(api.get(&later).await.unwrap().state, StepsState::Pending);
            c.stop_all().await;
        },
    )
    .await;
}
