//! The couch_jobs cycle the job benchmarks time (`jobs` on the embedded store, `cluster` on
//! etcd): `workers` tasks each looping add → accept → update → finish on one job type for
//! `run_for`. Accept picks among pending jobs at random, so a worker may take another's job.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use couch_replicator::jobs::{AcceptOpts, JobData, Jobs, JobsError};

/// Runs the loop; returns (cycles completed, elapsed). `data(worker, n, step)` is the job
/// data each step writes.
pub async fn cycles(
    jobs: &Jobs,
    job_type: &'static str,
    workers: usize,
    run_for: Duration,
    data: fn(usize, u64, &str) -> JobData,
) -> Result<(u64, Duration), Box<dyn std::error::Error + Send + Sync>> {
    jobs.set_type_timeout(job_type, 60).await?;
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (jobs, done, stop) = (jobs.clone(), done.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = format!("w{w}-{n}");
                    jobs.add(job_type, &id, data(w, n, "added"), 0).await?;
                    let (job, _) = match jobs
                        .accept(job_type, AcceptOpts::default().timeout(Duration::ZERO))
                        .await
                    {
                        Ok(found) => found,
                        Err(JobsError::NotFound) => continue,
                        Err(e) => return Err(e),
                    };
                    let job = jobs.update(&job, Some(data(w, n, "running"))).await?;
                    jobs.finish(&job, Some(data(w, n, "done"))).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, JobsError>(())
            })
        })
        .collect();
    stop_after(tasks, &stop, &done, start, run_for).await
}

/// Lets `tasks` run for `run_for`, stops them through `stop` and waits for them; returns
/// what `done` counted and the time since `start`.
pub async fn stop_after<E>(
    tasks: Vec<tokio::task::JoinHandle<Result<(), E>>>,
    stop: &AtomicBool,
    done: &AtomicU64,
    start: Instant,
    run_for: Duration,
) -> Result<(u64, Duration), Box<dyn std::error::Error + Send + Sync>>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?.map_err(Into::into)?;
    }
    Ok((done.load(Ordering::Relaxed), start.elapsed()))
}
