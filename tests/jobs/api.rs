//! couch_jobs API semantics and return values (CouchDB's couch_jobs.erl API and accept, RFC 007 state diagram), on the
//! serial memory engine with paused time, plus the accept race on the embedded engine.

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::jobs::{
    AcceptOpts, JobData, JobState, Jobs, JobsError, JobsOptions, TokioClock,
};
use couch_replicator::store::embedded::EmbeddedStore;
use couch_replicator::store::memory::MemoryStore;
use couch_replicator::store::{Db, StoreError};
use serde_json::json;

const T: &str = "t1";

fn data(v: serde_json::Value) -> JobData {
    v.as_object().cloned().expect("object")
}

fn memory_jobs() -> (Jobs, MemoryStore) {
    let store = MemoryStore::new();
    let jobs = Jobs::new(
        Db::new(Arc::new(store.clone())),
        JobsOptions {
            clock: Arc::new(TokioClock::new()),
            ..JobsOptions::default()
        },
    );
    (jobs, store)
}

fn now0(j: &Jobs) -> AcceptOpts {
    AcceptOpts::default()
        .timeout(Duration::ZERO)
        .max_sched_time(j.clock().now_secs())
}

#[tokio::test(start_paused = true)]
async fn type_timeouts_gate_add_and_list_types() {
    deadline(30, "type timeouts gate add and list types", async {
        let (j, _) = memory_jobs();
        assert_eq!(
            j.add(T, "a", data(json!({})), 0).await,
            Err(JobsError::NoTypeTimeout)
        );
        assert_eq!(j.get_type_timeout(T).await.unwrap(), None);
        j.set_type_timeout(T, 61).await.unwrap();
        j.set_type_timeout("t2", 5).await.unwrap();
        assert_eq!(j.get_type_timeout(T).await.unwrap(), Some(61));
        assert_eq!(j.get_types().await.unwrap(), vec!["t1", "t2"]);
        j.add(T, "a", data(json!({"x": 1})), 0).await.unwrap();
        j.clear_type_timeout("t2").await.unwrap();
        assert_eq!(j.get_types().await.unwrap(), vec!["t1"]);
        assert_eq!(
            j.add("t2", "b", data(json!({})), 0).await,
            Err(JobsError::NoTypeTimeout)
        );
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn state_diagram_pending_running_finished() {
    deadline(30, "state diagram pending running finished", async {
        let (j, _) = memory_jobs();
        j.set_type_timeout(T, 10).await.unwrap();
        assert_eq!(j.get_job_state(T, "a").await, Err(JobsError::NotFound));
        assert_eq!(j.get_job_data(T, "a").await, Err(JobsError::NotFound));
        j.add(T, "a", data(json!({"n": 1})), 0).await.unwrap();
        assert_eq!(j.get_job_state(T, "a").await.unwrap(), JobState::Pending);
        assert_eq!(j.pending_count(T, None, None).await.unwrap(), 1);

        let (job, d) = j.accept(T, now0(&j)).await.unwrap();
        assert_eq!((job.job_type.as_str(), job.id.as_str()), (T, "a"));
        assert_eq!(job.jlock.len(), 32);
        assert_eq!(d, data(json!({"n": 1})));
        assert_eq!(j.get_job_state(T, "a").await.unwrap(), JobState::Running);
        assert_eq!(j.pending_count(T, None, None).await.unwrap(), 0);
        assert_eq!(j.get_active_jobs_ids(T).await.unwrap(), vec!["a"]);
        // Nothing else to accept.
        assert_eq!(j.accept(T, now0(&j)).await, Err(JobsError::NotFound));

        let job = j.update(&job, Some(data(json!({"n": 2})))).await.unwrap();
        assert!(!job.is_resubmitted());
        assert_eq!(j.get_job_data(T, "a").await.unwrap(), data(json!({"n": 2})));
        let active = j.get_active_jobs(T).await.unwrap();
        assert_eq!(active, vec![("a".to_string(), data(json!({"n": 2})))]);

        j.finish(&job, Some(data(json!({"n": 3})))).await.unwrap();
        assert_eq!(j.get_job_state(T, "a").await.unwrap(), JobState::Finished);
        assert_eq!(j.get_job_data(T, "a").await.unwrap(), data(json!({"n": 3})));
        assert!(j.get_active_jobs_ids(T).await.unwrap().is_empty());
        // The lock is gone: the old worker is fenced.
        assert_eq!(j.update(&job, None).await, Err(JobsError::Halt));
        assert_eq!(j.finish(&job, None).await, Err(JobsError::Halt));

        // add on a finished job → pending again with the new data.
        j.add(T, "a", data(json!({"n": 4})), 7).await.unwrap();
        assert_eq!(j.get_job_state(T, "a").await.unwrap(), JobState::Pending);
        assert_eq!(j.get_job_data(T, "a").await.unwrap(), data(json!({"n": 4})));
        assert_eq!(j.pending_count(T, Some(6), None).await.unwrap(), 0);
        assert_eq!(j.pending_count(T, Some(7), None).await.unwrap(), 1);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn add_on_pending_job_same_stime_is_read_only() {
    deadline(30, "add on pending job same stime is read only", async {
        let (j, _) = memory_jobs();
        j.set_type_timeout(T, 10).await.unwrap();
        j.add(T, "a", data(json!({"v": 1})), 5).await.unwrap();
        let tx = j.db().begin().await.unwrap();
        j.add_tx(&tx, T, "a", data(json!({"v": 2})), 5)
            .await
            .unwrap();
        // No write at all: the commit has no versionstamp.
        assert_eq!(tx.commit().await.unwrap(), None);
        assert_eq!(j.get_job_data(T, "a").await.unwrap(), data(json!({"v": 1})));

        // Different STime → moved and data replaced.
        j.add(T, "a", data(json!({"v": 3})), 9).await.unwrap();
        assert_eq!(j.get_job_data(T, "a").await.unwrap(), data(json!({"v": 3})));
        assert_eq!(j.pending_count(T, Some(5), None).await.unwrap(), 0);
        assert_eq!(j.pending_count(T, Some(9), None).await.unwrap(), 1);
        assert_eq!(j.pending_count(T, None, None).await.unwrap(), 1);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn resubmit_while_running_returns_to_pending_on_finish() {
    deadline(
        30,
        "resubmit while running returns to pending on finish",
        async {
            let (j, _) = memory_jobs();
            j.set_type_timeout(T, 10).await.unwrap();
            j.add(T, "a", data(json!({"v": 1})), 0).await.unwrap();
            let (job, _) = j.accept(T, now0(&j)).await.unwrap();
            // add on a running job: flag + stime only, data unchanged.
            j.add(T, "a", data(json!({"v": 2})), 3).await.unwrap();
            assert_eq!(j.get_job_state(T, "a").await.unwrap(), JobState::Running);
            assert_eq!(j.get_job_data(T, "a").await.unwrap(), data(json!({"v": 1})));
            let job = j.update(&job, None).await.unwrap();
            assert!(job.is_resubmitted());
            assert_eq!(job.stime, Some(3));
            j.finish(&job, Some(data(json!({"v": 9})))).await.unwrap();
            assert_eq!(j.get_job_state(T, "a").await.unwrap(), JobState::Pending);
            assert_eq!(j.get_job_data(T, "a").await.unwrap(), data(json!({"v": 9})));
            assert_eq!(j.pending_count(T, Some(2), None).await.unwrap(), 0);
            let (job2, _) = j.accept(T, now0(&j)).await.unwrap();
            assert_ne!(job2.jlock, job.jlock);
            assert!(!job2.is_resubmitted());
            j.finish(&job2, None).await.unwrap();
            assert_eq!(j.get_job_state(T, "a").await.unwrap(), JobState::Finished);

            // The explicit resubmit call: missing → NotFound; finished → pending, keeping data
            // and stime when not given.
            assert_eq!(
                j.resubmit(T, "zz", None, None).await,
                Err(JobsError::NotFound)
            );
            j.resubmit(T, "a", None, None).await.unwrap();
            assert_eq!(j.get_job_state(T, "a").await.unwrap(), JobState::Pending);
            assert_eq!(j.pending_count(T, Some(3), None).await.unwrap(), 1);
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn remove_in_every_state() {
    deadline(30, "remove in every state", async {
        let (j, _) = memory_jobs();
        j.set_type_timeout(T, 10).await.unwrap();
        assert_eq!(j.remove(T, "nope").await, Err(JobsError::NotFound));
        // pending
        j.add(T, "p", data(json!({})), 0).await.unwrap();
        j.remove(T, "p").await.unwrap();
        assert_eq!(j.get_job_state(T, "p").await, Err(JobsError::NotFound));
        assert_eq!(j.pending_count(T, None, None).await.unwrap(), 0);
        assert_eq!(j.accept(T, now0(&j)).await, Err(JobsError::NotFound));
        // running: the worker learns on its next update/finish
        j.add(T, "r", data(json!({})), 0).await.unwrap();
        let (job, _) = j.accept(T, now0(&j)).await.unwrap();
        j.remove(T, "r").await.unwrap();
        assert!(j.get_active_jobs_ids(T).await.unwrap().is_empty());
        assert_eq!(j.update(&job, None).await, Err(JobsError::Halt));
        assert_eq!(j.finish(&job, None).await, Err(JobsError::Halt));
        // finished
        j.add(T, "f", data(json!({})), 0).await.unwrap();
        let (job, _) = j.accept(T, now0(&j)).await.unwrap();
        j.finish(&job, None).await.unwrap();
        j.remove(T, "f").await.unwrap();
        assert_eq!(j.get_job_data(T, "f").await, Err(JobsError::NotFound));
        assert_eq!(j.fold_jobs(T, 0, |n, _| n + 1).await.unwrap(), 0);
    })
    .await
}

/// `candidates(n)` narrows the random pick to the `n` earliest scheduled eligible jobs: with
/// one, jobs come out in scheduled order (whatever their ids); with two, never a job that
/// has two earlier ones still waiting. The default (1,024) picks among all of them.
#[tokio::test(start_paused = true)]
async fn accept_candidates_narrow_the_pick_to_the_earliest_scheduled() {
    deadline(30, "accept candidates", async {
        let (j, _) = memory_jobs();
        j.set_type_timeout(T, 10).await.unwrap();
        let now = j.clock().now_secs();
        // Ids in the opposite order of their scheduled times.
        let ids: Vec<String> = (0..12).map(|i| format!("job{:02}", 11 - i)).collect();
        for (i, id) in ids.iter().enumerate() {
            j.add(T, id, data(json!({})), now - 100 + i as i64)
                .await
                .unwrap();
        }
        let opts = |n| now0(&j).candidates(n);
        for want in &ids[..4] {
            let (job, _) = j.accept(T, opts(1)).await.unwrap();
            assert_eq!(&job.id, want, "one candidate: the earliest scheduled");
        }
        let mut waiting: Vec<String> = ids[4..].to_vec();
        while !waiting.is_empty() {
            let (job, _) = j.accept(T, opts(2)).await.unwrap();
            let at = waiting.iter().position(|w| *w == job.id).unwrap();
            assert!(at < 2, "{} picked with {at} earlier jobs waiting", job.id);
            waiting.remove(at);
        }
        assert_eq!(j.accept(T, opts(2)).await, Err(JobsError::NotFound));
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn earliest_first_takes_long_waiting_jobs_before_recent_ones() {
    deadline(30, "earliest first", async {
        let (j, _) = memory_jobs();
        j.set_type_timeout(T, 10).await.unwrap();
        let now = j.clock().now_secs();
        // Twenty jobs waiting since long ago, fifty eligible a second ago; ids of the recent
        // ones sort first, so only the scheduled time can put the old ones ahead.
        for i in 0..20 {
            j.add(T, &format!("old{i:02}"), data(json!({})), now - 100)
                .await
                .unwrap();
        }
        for i in 0..50 {
            j.add(T, &format!("new{i:02}"), data(json!({})), now - 1)
                .await
                .unwrap();
        }
        let opts = now0(&j).candidates(64).earliest_first();
        // While at least 8 share the earliest time the pick is among them alone; below that
        // it spreads over the 8 earliest, the old ones always among them.
        let mut taken = Vec::new();
        for _ in 0..13 {
            taken.push(j.accept(T, opts.clone()).await.unwrap().0.id);
        }
        assert!(
            taken.iter().all(|id| id.starts_with("old")),
            "a recent job taken while 8 old ones waited: {taken:?}"
        );
        for _ in 0..57 {
            j.accept(T, opts.clone()).await.unwrap();
        }
        assert_eq!(j.accept(T, opts.clone()).await, Err(JobsError::NotFound));
        assert_eq!(j.accept(T, opts.clone()).await, Err(JobsError::NotFound));
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn accept_respects_max_sched_time_and_waits_for_new_jobs() {
    deadline(
        30,
        "accept respects max sched time and waits for new jobs",
        async {
            let (j, _) = memory_jobs();
            j.set_type_timeout(T, 10).await.unwrap();
            let now = j.clock().now_secs();
            j.add(T, "later", data(json!({})), now + 100).await.unwrap();
            assert_eq!(j.accept(T, now0(&j)).await, Err(JobsError::NotFound));

            // A blocked acceptor wakes up on an enqueue (pending watch).
            let j2 = j.clone();
            let waiter = tokio::spawn(async move {
                j2.accept(
                    T,
                    AcceptOpts::default()
                        .max_sched_time(now + 10)
                        .timeout(Duration::from_secs(30)),
                )
                .await
            });
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(!waiter.is_finished());
            j.add(T, "now", data(json!({"k": 1})), now).await.unwrap();
            let (job, d) = waiter.await.unwrap().unwrap();
            assert_eq!(job.id, "now");
            assert_eq!(d, data(json!({"k": 1})));

            // max_sched_time = now + 2 with no user timeout → NotFound after ~2 s.
            let start = tokio::time::Instant::now();
            let r = j
                .accept(T, AcceptOpts::default().max_sched_time(now + 3))
                .await;
            assert_eq!(r, Err(JobsError::NotFound));
            let waited = start.elapsed();
            assert!(
                waited >= Duration::from_secs(1) && waited <= Duration::from_secs(4),
                "{waited:?}"
            );
            // Far-future max_sched_time with a user timeout.
            let start = tokio::time::Instant::now();
            let r = j
                .accept(
                    T,
                    AcceptOpts::default()
                        .max_sched_time(now + 50)
                        .timeout(Duration::from_secs(2)),
                )
                .await;
            assert_eq!(r, Err(JobsError::NotFound));
            assert!(start.elapsed() >= Duration::from_secs(2));
            // The scheduled job becomes acceptable once its time is reached.
            let (job, _) = j.accept(T, AcceptOpts::default()).await.unwrap();
            assert_eq!(job.id, "later");
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn accept_takes_earliest_jobs_only_up_to_max_sched_time() {
    deadline(
        30,
        "accept takes earliest jobs only up to max sched time",
        async {
            let (j, _) = memory_jobs();
            j.set_type_timeout(T, 10).await.unwrap();
            for i in 0..20 {
                j.add(T, &format!("j{i:02}"), data(json!({})), i)
                    .await
                    .unwrap();
            }
            let mut got = Vec::new();
            while let Ok((job, _)) = j
                .accept(
                    T,
                    AcceptOpts::default()
                        .max_sched_time(9)
                        .timeout(Duration::ZERO),
                )
                .await
            {
                got.push(job.id);
            }
            got.sort();
            let want: Vec<String> = (0..10).map(|i| format!("j{i:02}")).collect();
            assert_eq!(got, want);
            assert_eq!(j.pending_count(T, None, Some(5)).await.unwrap(), 5);
            assert_eq!(j.pending_count(T, None, None).await.unwrap(), 10);
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn no_schedule_accept_probes_randomly() {
    deadline(30, "no schedule accept probes randomly", async {
        let (j, _) = memory_jobs();
        j.set_type_timeout(T, 10).await.unwrap();
        assert_eq!(
            j.accept(T, AcceptOpts::default().no_schedule().max_sched_time(5))
                .await,
            Err(JobsError::NoScheduleRequiresZeroMaxSchedTime)
        );
        for i in 0..30 {
            j.add(
                T,
                &format!("{:032x}", i * 0x0123_4567_89ab_cdefu128),
                data(json!({})),
                0,
            )
            .await
            .unwrap();
        }
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..30 {
            let (job, _) = j
                .accept(
                    T,
                    AcceptOpts::default().no_schedule().timeout(Duration::ZERO),
                )
                .await
                .unwrap();
            assert!(seen.insert(job.id));
        }
        assert_eq!(
            j.accept(
                T,
                AcceptOpts::default().no_schedule().timeout(Duration::ZERO)
            )
            .await,
            Err(JobsError::NotFound)
        );
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn fold_jobs_pages_over_every_job() {
    deadline(30, "fold jobs pages over every job", async {
        let (j, _) = memory_jobs();
        j.set_type_timeout(T, 10).await.unwrap();
        j.set_type_timeout("other", 10).await.unwrap();
        for i in 0..25 {
            j.add(T, &format!("j{i:02}"), data(json!({"i": i})), 0)
                .await
                .unwrap();
        }
        j.add("other", "x", data(json!({})), 0).await.unwrap();
        let (job, _) = j.accept(T, now0(&j)).await.unwrap();
        let seen = j
            .fold_jobs_paged(T, 7, Vec::new(), |mut acc, info| {
                acc.push((info.id, info.state, info.data["i"].as_i64().unwrap()));
                acc
            })
            .await
            .unwrap();
        assert_eq!(seen.len(), 25);
        for (n, (id, state, i)) in seen.iter().enumerate() {
            assert_eq!(id, &format!("j{n:02}"));
            assert_eq!(*i, n as i64);
            let want = if *id == job.id {
                JobState::Running
            } else {
                JobState::Pending
            };
            assert_eq!(*state, want);
        }
        let tx = j.db().begin().await.unwrap();
        let page = j.list_jobs_tx(&tx, T, Some("j20"), 100).await.unwrap();
        tx.commit().await.unwrap();
        let ids: Vec<_> = page.into_iter().map(|p| p.id).collect();
        assert_eq!(ids, vec!["j21", "j22", "j23", "j24"]);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn caller_writes_are_fenced_by_update_in_the_same_transaction() {
    deadline(
        30,
        "caller writes are fenced by update in the same transaction",
        async {
            let (j, _) = memory_jobs();
            j.set_type_timeout(T, 10).await.unwrap();
            j.add(T, "a", data(json!({})), 0).await.unwrap();
            let (job, _) = j.accept(T, now0(&j)).await.unwrap();
            let write = |n: u8| {
                let j = j.clone();
                let job = job.clone();
                async move {
                    j.db()
                        .run(|tx| {
                            let (j, job) = (j.clone(), job.clone());
                            async move {
                                j.update_tx(&tx, &job, None).await?;
                                tx.set(b"my-own-key", &[n]);
                                Ok::<_, JobsError>(())
                            }
                        })
                        .await
                }
            };
            write(1).await.unwrap();
            // Another actor removes the job: the worker's next fenced write must not happen.
            j.remove(T, "a").await.unwrap();
            assert_eq!(write(2).await, Err(JobsError::Halt));
            let tx = j.db().begin().await.unwrap();
            assert_eq!(tx.get(b"my-own-key", false).await.unwrap(), Some(vec![1]));
            tx.commit().await.unwrap();
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn two_jobs_accepted_in_one_transaction_keep_separate_activity() {
    deadline(
        30,
        "two jobs accepted in one transaction keep separate activity",
        async {
            let (j, _) = memory_jobs();
            j.set_type_timeout(T, 10).await.unwrap();
            j.add(T, "a", data(json!({})), 0).await.unwrap();
            j.add(T, "b", data(json!({})), 0).await.unwrap();
            let tx = j.db().begin().await.unwrap();
            let a = j.accept_tx(&tx, T, AcceptOpts::default()).await.unwrap();
            let b = j.accept_tx(&tx, T, AcceptOpts::default()).await.unwrap();
            assert!(a.is_some() && b.is_some());
            assert!(
                j.accept_tx(&tx, T, AcceptOpts::default())
                    .await
                    .unwrap()
                    .is_none()
            );
            tx.commit().await.unwrap();
            let mut ids = j.get_active_jobs_ids(T).await.unwrap();
            ids.sort();
            assert_eq!(ids, vec!["a", "b"]);
        },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn corrupt_bytes_under_job_keys_are_errors_not_panics() {
    deadline(
        30,
        "corrupt bytes under job keys are errors not panics",
        async {
            let (j, _) = memory_jobs();
            j.set_type_timeout(T, 10).await.unwrap();
            let keys = j.keys().clone();
            let tx = j.db().begin().await.unwrap();
            tx.set(&keys.data(T, "bad"), b"\xffgarbage");
            tx.set(&keys.pending(T, 0, "bad"), b"");
            tx.set(&keys.activity_timeout("weird"), b"not a tuple");
            tx.commit().await.unwrap();
            assert!(matches!(
                j.get_job_data(T, "bad").await,
                Err(JobsError::Encoding(_))
            ));
            assert!(matches!(
                j.get_job_state(T, "bad").await,
                Err(JobsError::Encoding(_))
            ));
            assert!(matches!(
                j.add(T, "bad", data(json!({})), 0).await,
                Err(JobsError::Encoding(_))
            ));
            assert!(matches!(
                j.accept(T, now0(&j)).await,
                Err(JobsError::Encoding(_))
            ));
            assert!(matches!(
                j.fold_jobs(T, (), |_, _| ()).await,
                Err(JobsError::Encoding(_))
            ));
            assert!(matches!(
                j.get_type_timeout("weird").await,
                Err(JobsError::Encoding(_))
            ));
            // A key with a foreign layout under the pending range.
            let tx = j.db().begin().await.unwrap();
            tx.clear(&keys.pending(T, 0, "bad"));
            let mut foreign = keys.pending_range(T, 0).0;
            foreign.extend_from_slice(b"\x02zz\x00");
            tx.set(&foreign, b"");
            tx.commit().await.unwrap();
            assert!(matches!(
                j.accept(T, now0(&j)).await,
                Err(JobsError::Encoding(_))
            ));
        },
    )
    .await
}

/// Two workers race to accept one job on the embedded engine (real optimistic conflicts):
/// exactly one gets it, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_racing_accept_exactly_one_wins_on_embedded() {
    deadline(
        30,
        "two workers racing accept exactly one wins on embedded",
        async {
            let dir = tempfile::tempdir().unwrap();
            let store = EmbeddedStore::open(dir.path().join("db.redb")).unwrap();
            let jobs = Jobs::new(Db::new(Arc::new(store)), JobsOptions::default());
            jobs.set_type_timeout(T, 10).await.unwrap();
            for round in 0..20 {
                let id = format!("job{round}");
                jobs.add(T, &id, data(json!({"r": round})), 0)
                    .await
                    .unwrap();
                let barrier = Arc::new(tokio::sync::Barrier::new(2));
                let racers: Vec<_> = (0..2)
                    .map(|_| {
                        let (j, b) = (jobs.clone(), barrier.clone());
                        tokio::spawn(async move {
                            b.wait().await;
                            j.accept(T, AcceptOpts::default().timeout(Duration::from_millis(300)))
                                .await
                        })
                    })
                    .collect();
                let mut winners = Vec::new();
                for r in racers {
                    match r.await.unwrap() {
                        Ok((job, _)) => winners.push(job),
                        Err(JobsError::NotFound) => {}
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
                assert_eq!(winners.len(), 1, "round {round}");
                assert_eq!(winners[0].id, id);
                jobs.finish(&winners[0], None).await.unwrap();
            }
        },
    )
    .await
}

#[test]
fn store_errors_keep_their_retryability() {
    use couch_replicator::store::RetryableError;
    assert!(JobsError::Store(StoreError::Conflict).is_retryable());
    assert!(!JobsError::Halt.is_retryable());
    assert!(!JobsError::Store(StoreError::Closed).is_retryable());
}
