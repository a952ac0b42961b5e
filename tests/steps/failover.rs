//! Exactly-once and strict order when nodes die or stall: a killed node's running step is
//! re-enqueued by the couch_jobs activity monitor and the job continues on the other nodes
//! (no step skipped, none completed twice, none started before its predecessor completed);
//! a stalled worker that lost its step cannot record its late result; a panicking worker is
//! restarted by the node's pool.

use crate::support::deadline;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::steps::{Cluster, Event, Recorder, test_config};
use couch_replicator::steps::{
    JobDoc, JobSpec, StepSpec, StepStatus, StepsConfig, StepsState, Target,
};

/// Checks the log of one job against its final document: each step completed exactly once,
/// in order, and no run of step k+1 started before step k's recorded run ended. A run on
/// `dead` that is not the step's recorded executor was lost with that node (killed before
/// its finish committed, whether or not its command had ended) and does not count as a
/// completion. Returns the job's runs.
fn assert_exactly_once_in_order(
    events: &[Event],
    doc: &JobDoc,
    dead: &str,
) -> (Vec<Event>, Vec<Event>) {
    let job = &doc.id;
    let runs: Vec<Event> = events.iter().filter(|e| &e.job == job).cloned().collect();
    let recorded = |e: &Event| {
        doc.steps[e.step]
            .executor
            .as_ref()
            .is_some_and(|x| x.worker == e.worker)
    };
    let (lost, kept): (Vec<Event>, Vec<Event>) = runs
        .iter()
        .cloned()
        .partition(|e| e.node == dead && !recorded(e));
    let completed: Vec<&Event> = kept.iter().filter(|e| e.end.is_some()).collect();
    let order: Vec<usize> = completed.iter().map(|e| e.step).collect();
    assert_eq!(
        order,
        (0..doc.steps.len()).collect::<Vec<_>>(),
        "job {job}: completions {order:?}"
    );
    for (k, done) in completed.iter().enumerate() {
        assert!(
            recorded(done),
            "job {job} step {k}: executor is not the completed run"
        );
        if k > 0 {
            let prev_end = completed[k - 1].end.unwrap();
            for r in runs.iter().filter(|e| e.step == k) {
                assert!(
                    r.start >= prev_end,
                    "job {job}: step {k} started before step {} ended",
                    k - 1
                );
            }
        }
    }
    (runs, lost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_node_mid_job_neither_skips_nor_repeats_steps() {
    deadline(
        90,
        "killing a node mid job neither skips nor repeats steps",
        async {
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            for n in ["a", "b", "c"] {
                c.start_node(n, 2, Arc::new(rec.clone())).await;
            }
            let api = c.api("front");
            let mut ids = Vec::new();
            for _ in 0..6 {
                let steps = (0..4).map(|_| StepSpec::new("any", "sleep 0.8")).collect();
                ids.push(api.submit(JobSpec::new(steps)).await.unwrap());
            }
            // Kill node a while it runs steps.
            let busy_on_a = async {
                loop {
                    if rec
                        .events()
                        .iter()
                        .any(|e| e.node == "a" && e.end.is_none() && e.step > 0)
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            deadline(
                30,
                "killing a node mid job neither skips nor repeats steps",
                busy_on_a,
            )
            .await;
            c.kill_node("a").await;
            let killed_at = tokio::time::Instant::now();
            for id in &ids {
                let v = api
                    .wait_done(id, Duration::from_secs(60))
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(v.state, StepsState::Success, "job {id}");
                assert!(
                    v.doc
                        .steps
                        .iter()
                        .all(|s| s.status == StepStatus::Succeeded)
                );
            }
            let events = rec.events();
            assert!(
                events.iter().all(|e| e.node != "a" || e.start <= killed_at),
                "a dead node ran something"
            );
            // The promise: `runs` counts dispatches (accepts), not command starts. Node a may die
            // between its accept write and the start of the command, so a dispatch can go unseen
            // by the recorder; only a's two workers can lose a dispatch, at most one each.
            let (mut unseen, mut lost_total) = (0, 0);
            for id in &ids {
                let doc = api.get(id).await.unwrap().doc;
                let (runs, lost) = assert_exactly_once_in_order(&events, &doc, "a");
                lost_total += lost.len();
                for (k, s) in doc.steps.iter().enumerate() {
                    let seen = runs.iter().filter(|e| e.step == k).count() as u32;
                    assert!(
                        s.runs == seen || s.runs == seen + 1,
                        "job {id} step {k}: {} dispatches recorded, {seen} runs seen",
                        s.runs
                    );
                    unseen += s.runs - seen;
                    if s.runs > seen {
                        assert_ne!(s.executor.as_ref().unwrap().node, "a");
                    }
                }
                // Every step lost with node a ran again elsewhere, once.
                for l in &lost {
                    let s = &doc.steps[l.step];
                    assert_eq!(s.runs, 2, "job {id} step {}: lost step re-run once", l.step);
                    assert_ne!(s.executor.as_ref().unwrap().node, "a");
                }
            }
            let dead_held = unseen as usize + lost_total;
            assert!(
                (1..=2).contains(&dead_held),
                "node a held {dead_held} steps when killed ({unseen} unseen); it had 2 workers"
            );
            c.stop_all().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_worker_loses_its_step_and_cannot_record_a_late_result() {
    deadline(
        60,
        "a stalled worker loses its step and cannot record a late result",
        async {
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            // Node z never calls update while running (a stalled process).
            let stalled = StepsConfig {
                keepalive_interval: Some(Duration::from_secs(3600)),
                ..test_config()
            };
            c.start_node_with("z", 1, Arc::new(rec.clone()), stalled)
                .await;
            let api = c.api("front");
            let id = api
                .submit(JobSpec::new(vec![
                    StepSpec::new("any", "sleep 3"),
                    StepSpec::new("any", "sleep 0"),
                ]))
                .await
                .unwrap();
            let on_z = async {
                while !rec.events().iter().any(|e| e.node == "z") {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            deadline(
                10,
                "a stalled worker loses its step and cannot record a late result",
                on_z,
            )
            .await;
            // The healthy node takes over once the activity monitor re-enqueues the step.
            c.start_node("b", 1, Arc::new(rec.clone())).await;
            let v = api
                .wait_done(&id, Duration::from_secs(40))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(v.state, StepsState::Success);
            let s0 = &v.doc.steps[0];
            assert_eq!(s0.runs, 2);
            assert_eq!(s0.executor.as_ref().unwrap().node, "b");
            // z's run completed in its process, but its finish was fenced off.
            let wait_z = async {
                loop {
                    let ev = rec.events();
                    let z = ev.iter().find(|e| e.node == "z" && e.step == 0).unwrap();
                    if z.end.is_some() && c.stats.snapshot().halts >= 1 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            deadline(
                20,
                "a stalled worker loses its step and cannot record a late result",
                wait_z,
            )
            .await;
            let after = api.get(&id).await.unwrap();
            assert_eq!(after.doc.steps[0].executor.as_ref().unwrap().node, "b");
            assert_eq!(after.doc.steps[0].runs, 2);
            let ev = rec.events();
            assert_eq!(
                ev.iter().filter(|e| e.step == 1).count(),
                1,
                "step 1 ran once"
            );
            c.stop_all().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_worker_is_restarted_and_its_step_is_run_again() {
    deadline(
        60,
        "a panicking worker is restarted and its step is run again",
        async {
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            c.start_node("a", 1, Arc::new(rec.clone())).await;
            let api = c.api("a");
            let id = api
                .submit(JobSpec::new(vec![
                    StepSpec::new("a", "panic once"),
                    StepSpec::new("a", "sleep 0"),
                ]))
                .await
                .unwrap();
            let v = api
                .wait_done(&id, Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(v.state, StepsState::Success);
            assert_eq!(
                v.doc.steps[0].runs, 2,
                "re-enqueued by the activity monitor after the panic"
            );
            assert_eq!(v.doc.steps[0].target, Target::Node("a".into()));
            let per_step: HashMap<usize, usize> =
                rec.events().iter().fold(HashMap::new(), |mut m, e| {
                    *m.entry(e.step).or_default() += 1;
                    m
                });
            assert_eq!(per_step[&0], 2);
            assert_eq!(per_step[&1], 1);
            c.stop_all().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_longer_than_the_activity_timeout_keep_the_step_on_its_worker() {
    deadline(
        60,
        "retries longer than the activity timeout keep the step on its worker",
        async {
            // 1 s activity timeout; the step's retries take about 2.1 s of sleeps.
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            c.start_node("a", 1, Arc::new(rec.clone())).await;
            c.start_node("b", 1, Arc::new(rec.clone())).await;
            let api = c.api("front");
            let retry = couch_replicator::steps::RetryStrategy {
                max_retries: 3,
                sleep: 0.7,
                sleep_factor: 1.0,
                sleep_max: None,
            };
            let id = api
                .submit(JobSpec::new(vec![
                    StepSpec::new("any", "flaky 3").with_retry(retry),
                ]))
                .await
                .unwrap();
            let v = api
                .wait_done(&id, Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(v.state, StepsState::Success);
            let s = &v.doc.steps[0];
            assert_eq!(
                (s.runs, s.attempts),
                (1, 4),
                "kept alive through the retry sleeps"
            );
            let ev = rec.events();
            assert_eq!(ev.len(), 4);
            assert!(ev.iter().all(|e| e.worker == ev[0].worker), "{ev:?}");
            assert_eq!(
                ev.iter().map(|e| e.attempt).collect::<Vec<_>>(),
                [1, 2, 3, 4]
            );
            for w in ev.windows(2) {
                assert!(w[1].start.duration_since(w[0].start) >= Duration::from_millis(700));
            }
            c.stop_all().await;
        },
    )
    .await;
}
