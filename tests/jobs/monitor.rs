//! The activity monitor (CouchDB's couch_jobs_activity_monitor.erl): direct `check_once` tests (CouchDB's one check per
//! timeout, and our default of two), and the supervised background (type server → per-type
//! monitor) re-enqueueing a dead worker's job, with paused time on the memory engine.

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::jobs::activity_monitor::ActivityMonitor;
use couch_replicator::jobs::{
    AcceptOpts, JobData, JobState, Jobs, JobsConfig, JobsError, JobsOptions, TokioClock,
};
use couch_replicator::store::Db;
use couch_replicator::store::memory::MemoryStore;
use serde_json::json;

const T: &str = "mon";

fn data(v: serde_json::Value) -> JobData {
    v.as_object().cloned().expect("object")
}

fn jobs_with(config: JobsConfig) -> Jobs {
    Jobs::new(
        Db::new(Arc::new(MemoryStore::new())),
        JobsOptions {
            clock: Arc::new(TokioClock::new()),
            config,
            ..JobsOptions::default()
        },
    )
}

/// CouchDB's monitor: one check per type timeout.
fn couchdb_config() -> JobsConfig {
    JobsConfig {
        activity_monitor_checks_per_timeout: 1,
        ..JobsConfig::default()
    }
}

fn monitor(j: &Jobs) -> ActivityMonitor {
    ActivityMonitor::new(j.db().clone(), j.keys().clone(), T, j.config())
}

/// The monitor's next check comes after more than `lo` and at most `hi` seconds.
async fn assert_next_check_in(m: &mut ActivityMonitor, lo: u64, hi: u64) {
    let delay = m.schedule().await.unwrap();
    assert!(
        delay > Duration::from_secs(lo) && delay <= Duration::from_secs(hi),
        "{delay:?}"
    );
}

fn now_opts() -> AcceptOpts {
    AcceptOpts::default().timeout(Duration::ZERO)
}

#[tokio::test(start_paused = true)]
async fn check_once_requeues_only_jobs_idle_for_a_whole_period() {
    deadline(
        300,
        "check once requeues only jobs idle for a whole period",
        async {
            let j = jobs_with(couchdb_config());
            j.set_type_timeout(T, 2).await.unwrap();
            for id in ["idle", "busy"] {
                j.add(T, id, data(json!({"id": id})), 0).await.unwrap();
            }
            let (a, _) = j.accept(T, now_opts()).await.unwrap();
            let (b, _) = j.accept(T, now_opts()).await.unwrap();
            let (idle, busy) = if a.id == "idle" { (a, b) } else { (b, a) };
            let idle = j
                .update(&idle, Some(data(json!({"progress": 5}))))
                .await
                .unwrap();

            let mut m = monitor(&j);
            assert_next_check_in(&mut m, 2, 3).await;
            // The first check only remembers the activity versionstamp.
            assert_eq!(m.check_once().await.unwrap(), 0);
            assert_eq!(j.get_job_state(T, "idle").await.unwrap(), JobState::Running);
            // One period later: the busy worker updated, the idle one did not.
            let busy = j.update(&busy, None).await.unwrap();
            assert_eq!(m.check_once().await.unwrap(), 1);
            assert_eq!(j.get_job_state(T, "idle").await.unwrap(), JobState::Pending);
            assert_eq!(j.get_job_state(T, "busy").await.unwrap(), JobState::Running);
            // Data is kept, the old worker is fenced.
            assert_eq!(
                j.get_job_data(T, "idle").await.unwrap(),
                data(json!({"progress": 5}))
            );
            assert_eq!(j.update(&idle, None).await, Err(JobsError::Halt));
            assert_eq!(j.finish(&idle, None).await, Err(JobsError::Halt));
            assert_eq!(j.get_active_jobs_ids(T).await.unwrap(), vec!["busy"]);
            // Busy stops too: it goes on the next check.
            assert_eq!(m.check_once().await.unwrap(), 1);
            assert_eq!(j.update(&busy, None).await, Err(JobsError::Halt));
            assert_eq!(j.pending_count(T, None, None).await.unwrap(), 2);
            // Re-accepting works and the new lock holder is not disturbed by an idle check.
            let (again, d) = j.accept(T, now_opts()).await.unwrap();
            assert!(d.contains_key("id") || d.contains_key("progress"));
            j.update(&again, None).await.unwrap();
            assert_eq!(m.check_once().await.unwrap(), 0);
        },
    )
    .await
}

/// Our default, two checks per timeout: checks every half timeout, and a job is re-enqueued
/// by the check two checks after the last one that saw it active (a whole timeout later).
#[tokio::test(start_paused = true)]
async fn two_checks_per_timeout_requeue_after_one_idle_timeout_not_before() {
    deadline(
        300,
        "two checks per timeout requeue after one idle timeout not before",
        async {
            let j = jobs_with(JobsConfig::default());
            assert_eq!(j.config().activity_monitor_checks_per_timeout, 2);
            j.set_type_timeout(T, 4).await.unwrap();
            j.add(T, "idle", data(json!({})), 0).await.unwrap();
            j.accept(T, now_opts()).await.unwrap();
            let mut m = monitor(&j);
            // 4 s / 2 + jitter of at most a quarter timeout.
            assert_next_check_in(&mut m, 2, 3).await;
            // The first two checks only remember; the third re-enqueues what the first saw.
            assert_eq!(m.check_once().await.unwrap(), 0);
            assert_eq!(m.check_once().await.unwrap(), 0);
            assert_eq!(j.get_job_state(T, "idle").await.unwrap(), JobState::Running);
            assert_eq!(m.check_once().await.unwrap(), 1);
            assert_eq!(j.get_job_state(T, "idle").await.unwrap(), JobState::Pending);
            // A worker that updated after the check two checks ago keeps its job.
            let (again, _) = j.accept(T, now_opts()).await.unwrap();
            assert_eq!(m.check_once().await.unwrap(), 0);
            let again = j.update(&again, None).await.unwrap();
            assert_eq!(m.check_once().await.unwrap(), 0);
            assert_eq!(m.check_once().await.unwrap(), 0);
            assert_eq!(j.get_job_state(T, "idle").await.unwrap(), JobState::Running);
            // Idle since: gone two checks after the first one that saw its update.
            assert_eq!(m.check_once().await.unwrap(), 1);
            assert_eq!(j.update(&again, None).await, Err(JobsError::Halt));
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn changed_timeout_forgets_the_remembered_versionstamp() {
    deadline(
        300,
        "changed timeout forgets the remembered versionstamp",
        async {
            let j = jobs_with(couchdb_config());
            j.set_type_timeout(T, 2).await.unwrap();
            j.add(T, "a", data(json!({})), 0).await.unwrap();
            j.accept(T, now_opts()).await.unwrap();
            let mut m = monitor(&j);
            m.schedule().await.unwrap();
            m.check_once().await.unwrap();
            j.set_type_timeout(T, 4).await.unwrap();
            let delay = m.schedule().await.unwrap();
            assert!(delay > Duration::from_secs(4) && delay <= Duration::from_secs(6));
            // Remembered versionstamp forgotten → this check only records again.
            assert_eq!(m.check_once().await.unwrap(), 0);
            assert_eq!(m.check_once().await.unwrap(), 1);
            j.clear_type_timeout(T).await.unwrap();
            assert_eq!(m.schedule().await.unwrap(), Duration::from_secs(5));
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn aimd_batches_requeue_everything_and_grow() {
    deadline(300, "aimd batches requeue everything and grow", async {
        let j = jobs_with(JobsConfig {
            activity_monitor_init_batch_size: 4,
            activity_monitor_batch_increment: 3,
            ..couchdb_config()
        });
        j.set_type_timeout(T, 1).await.unwrap();
        for i in 0..40 {
            j.add(T, &format!("j{i}"), data(json!({"i": i})), 0)
                .await
                .unwrap();
        }
        for _ in 0..40 {
            j.accept(T, now_opts()).await.unwrap();
        }
        let mut m = monitor(&j);
        m.schedule().await.unwrap();
        m.check_once().await.unwrap();
        assert_eq!(m.check_once().await.unwrap(), 40);
        // 4, 7, 10, 13 (full) then 16 (partial): grew four times.
        assert_eq!(m.batch_size(), 16);
        assert_eq!(j.pending_count(T, None, None).await.unwrap(), 40);
        assert!(j.get_active_jobs_ids(T).await.unwrap().is_empty());
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn stale_and_corrupt_activity_entries_are_cleared() {
    deadline(
        300,
        "stale and corrupt activity entries are cleared",
        async {
            let j = jobs_with(couchdb_config());
            j.set_type_timeout(T, 1).await.unwrap();
            j.add(T, "a", data(json!({})), 0).await.unwrap();
            let (job, _) = j.accept(T, now_opts()).await.unwrap();
            let mut m = monitor(&j);
            m.schedule().await.unwrap();
            m.check_once().await.unwrap();
            // Garbage under the ACTIVITY range (written before the next watch read).
            let keys = j.keys().clone();
            let tx = j.db().begin().await.unwrap();
            let vs = couch_replicator::store::tuple::Versionstamp::complete([0; 10], 1);
            tx.set(&keys.activity(T, &vs), b"\xff\xfe");
            tx.commit().await.unwrap();
            assert_eq!(m.check_once().await.unwrap(), 1);
            assert_eq!(j.update(&job, None).await, Err(JobsError::Halt));
            let (b, e) = keys.activity_range(T);
            let tx = j.db().begin().await.unwrap();
            let left = tx
                .get_range(&b, &e, couch_replicator::store::RangeOptions::all())
                .await
                .unwrap();
            tx.commit().await.unwrap();
            assert!(left.is_empty());
        },
    )
    .await
}

/// With the background running, a worker that stops calling `update` loses its job after one
/// to one and a half timeouts (+ three jitters: checks every half timeout); one that keeps
/// updating never does.
#[tokio::test(start_paused = true)]
async fn background_monitor_requeues_a_dead_workers_job() {
    deadline(
        300,
        "background monitor requeues a dead workers job",
        async {
            let j = jobs_with(JobsConfig {
                activity_monitor_max_jitter: Duration::from_millis(500),
                ..JobsConfig::default()
            });
            let bg = j.start_background().await.unwrap();
            let types = bg.type_server().expect("the type server");
            assert!(supervisors::observe(&types).await.unwrap().types.is_empty());
            j.set_type_timeout(T, 2).await.unwrap();
            // Setting a timeout makes the type known at once, with its monitor.
            assert_eq!(supervisors::observe(&types).await.unwrap().types, [T]);
            let monitor = bg.monitor(T).expect("the type's activity monitor");
            j.add(T, "dead", data(json!({})), 0).await.unwrap();
            j.add(T, "alive", data(json!({})), 0).await.unwrap();
            let (a, _) = j.accept(T, now_opts()).await.unwrap();
            let (b, _) = j.accept(T, now_opts()).await.unwrap();
            let (dead, alive) = if a.id == "dead" { (a, b) } else { (b, a) };

            // The live worker updates every second.
            let j2 = j.clone();
            let keeper = tokio::spawn(async move {
                let mut job = alive;
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    job = match j2.update(&job, None).await {
                        Ok(job) => job,
                        Err(e) => return e,
                    };
                }
            });

            let last_update = tokio::time::Instant::now();
            let dead = j.update(&dead, None).await.unwrap();
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if j.get_job_state(T, "dead").await.unwrap() == JobState::Pending {
                    break;
                }
                assert!(
                    last_update.elapsed() < Duration::from_millis(3 * (1000 + 500) + 200),
                    "not re-enqueued in time"
                );
            }
            let took = last_update.elapsed();
            assert!(
                took >= Duration::from_secs(2),
                "re-enqueued too early: {took:?}"
            );
            assert_eq!(j.update(&dead, None).await, Err(JobsError::Halt));
            let seen = supervisors::observe(&monitor).await.unwrap();
            assert_eq!(seen.job_type, T);
            assert_eq!((seen.timeout_secs, seen.requeued), (Some(2), 1));
            assert!(seen.checks >= 2, "{seen:?}");

            // Ten more periods: the live worker keeps its job.
            tokio::time::sleep(Duration::from_secs(25)).await;
            assert!(!keeper.is_finished());
            assert_eq!(
                j.get_job_state(T, "alive").await.unwrap(),
                JobState::Running
            );
            keeper.abort();
            bg.stop().await;
        },
    )
    .await
}
