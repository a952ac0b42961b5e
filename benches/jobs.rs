//! couch_jobs benchmark on the embedded store, with its peer measured in the same run:
//!
//! * full job cycles (`add` → `accept` → `update` → `finish`, four transactions) per second
//!   with 8 concurrent workers, and the same over plain redb's one-fsync-per-transaction rate
//!   (the shared baseline of `benches/store.rs`);
//! * how long the activity monitor takes to re-enqueue 10,000 stale jobs once their timeout
//!   has passed (one `check_once` pass after those that record the activity versionstamp),
//!   and that as a rate over plain redb's transaction rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_replicator::jobs::activity_monitor::ActivityMonitor;
use couch_replicator::jobs::{AcceptOpts, JobData, Jobs, JobsError, JobsOptions};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;

#[path = "shared/cycles.rs"]
mod job_cycles;
#[path = "support/plain_redb.rs"]
mod plain_redb;

const WORKERS: usize = 8;
const RUN_FOR: Duration = Duration::from_secs(4);
const STALE_JOBS: usize = 10_000;
const CYCLE_TYPE: &str = "bench_cycle";
const STALE_TYPE: &str = "bench_stale";

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn job_data(worker: usize, n: u64, step: &str) -> JobData {
    let mut d = JobData::new();
    d.insert("worker".into(), worker.into());
    d.insert("n".into(), n.into());
    d.insert("step".into(), step.into());
    d.insert(
        "source".into(),
        "http://127.0.0.1:5984/source".to_string().into(),
    );
    d
}

/// `WORKERS` tasks each looping add → accept → update → finish; returns (cycles, elapsed).
async fn cycles(jobs: &Jobs) -> BenchResult<(u64, Duration)> {
    job_cycles::cycles(jobs, CYCLE_TYPE, WORKERS, RUN_FOR, job_data).await
}

/// Run `f(i)` for `0..count` on 8 concurrent tasks.
async fn spread<F, Fut>(jobs: &Jobs, count: usize, f: F) -> BenchResult<()>
where
    F: Fn(Jobs, usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<(), JobsError>> + Send,
{
    let tasks: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (jobs, f) = (jobs.clone(), f.clone());
            tokio::spawn(async move {
                for i in (w..count).step_by(WORKERS) {
                    f(jobs.clone(), i).await?;
                }
                Ok::<_, JobsError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// 10,000 running jobs whose workers died; returns how long one monitor pass takes to put
/// them all back to pending.
async fn requeue(jobs: &Jobs) -> BenchResult<Duration> {
    jobs.set_type_timeout(STALE_TYPE, 1).await?;
    spread(jobs, STALE_JOBS, |j, i| async move {
        j.add(
            STALE_TYPE,
            &format!("stale-{i:05}"),
            job_data(0, i as u64, "added"),
            0,
        )
        .await
    })
    .await?;
    spread(jobs, STALE_JOBS, |j, _| async move {
        j.accept(STALE_TYPE, AcceptOpts::default().timeout(Duration::ZERO))
            .await
            .map(|_| ())
    })
    .await?;
    let mut monitor = ActivityMonitor::new(
        jobs.db().clone(),
        jobs.keys().clone(),
        STALE_TYPE,
        jobs.config(),
    );
    monitor.schedule().await?;
    // The first `activity_monitor_checks_per_timeout` passes only record the activity
    // versionstamp (no worker updates after them); the next one re-enqueues.
    for pass in 0..jobs.config().activity_monitor_checks_per_timeout.max(1) {
        let early = monitor.check_once().await?;
        if early != 0 {
            return Err(format!("pass {pass} re-enqueued {early} jobs").into());
        }
    }
    let start = Instant::now();
    let requeued = monitor.check_once().await?;
    let took = start.elapsed();
    let pending = jobs
        .pending_count(STALE_TYPE, None, Some(2 * STALE_JOBS))
        .await?;
    if requeued != STALE_JOBS || pending != STALE_JOBS {
        return Err(
            format!("re-enqueued {requeued}, pending {pending}, expected {STALE_JOBS}").into(),
        );
    }
    Ok(took)
}

fn main() -> BenchResult<()> {
    let dir = tempfile::Builder::new()
        .prefix("jobs-bench")
        .tempdir_in(std::env::current_dir()?)?;
    let (plain_n, plain_t) = plain_redb::run(dir.path(), RUN_FOR)?;
    let plain_rate = plain_n as f64 / plain_t.as_secs_f64();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let store = EmbeddedStore::open(dir.path().join("jobs.redb"))?;
    let jobs = Jobs::new(Db::new(Arc::new(store.clone())), JobsOptions::default());
    let (cycles_n, cycles_t) = runtime.block_on(cycles(&jobs))?;
    let requeue_t = runtime.block_on(requeue(&jobs))?;
    runtime.block_on(store.close())?;

    let cycle_rate = cycles_n as f64 / cycles_t.as_secs_f64();
    let requeue_rate = STALE_JOBS as f64 / requeue_t.as_secs_f64();
    println!("{:<52} {:>10} {:>12}", "measurement", "count", "per second");
    println!(
        "{:<52} {:>10} {:>12.0}",
        "plain redb, 1 durable write tx per tx", plain_n, plain_rate
    );
    println!(
        "{:<52} {:>10} {:>12.0}",
        format!("job cycles add/accept/update/finish, {WORKERS} workers"),
        cycles_n,
        cycle_rate
    );
    println!(
        "{:<52} {:>10} {:>12.0}   ({:.3} s)",
        "stale jobs re-enqueued by one monitor pass",
        STALE_JOBS,
        requeue_rate,
        requeue_t.as_secs_f64()
    );
    let floor = f64::MIN_POSITIVE;
    println!(
        "RESULT jobs_cycles_over_single_tx = {:.3}",
        cycle_rate / plain_rate.max(floor)
    );
    println!(
        "RESULT requeue_per_s_over_single_tx = {:.2}",
        requeue_rate / plain_rate.max(floor)
    );
    Ok(())
}
