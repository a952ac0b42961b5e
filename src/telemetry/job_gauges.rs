//! Per-job numbers without per-job series. At 10,000 jobs a `job_id` label would mean 10,000
//! series per metric, re-created whenever the scheduler rotates jobs (a cardinality and churn
//! problem for Prometheus, and a scrape of megabytes). Instead, over this node's running jobs:
//! a cumulative distribution with fixed `le` buckets (how many jobs are at most N changes
//! behind), the sum and the maximum, and the top [`TOP_K`] jobs by name, so the one stuck job
//! is still named. Series count stays constant whatever the number of jobs; per-job detail
//! is in `_scheduler/jobs` and the status page.

use super::exposition::Exposition;

/// How many jobs the top lists name.
pub const TOP_K: usize = 5;

/// Bucket bounds for changes (pending, not yet checkpointed).
const CHANGE_BOUNDS: [u64; 6] = [0, 10, 100, 1_000, 10_000, 100_000];

/// Bucket bounds for seconds behind the source.
const LAG_BOUNDS: [u64; 6] = [0, 10, 60, 300, 1_800, 3_600];

/// One running job's numbers. `Id` is the caller's job id type (the replicator's `JobId`);
/// this leaf only needs its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSample<Id = String> {
    /// The couch_jobs id.
    pub job_id: Id,
    /// Changes on the source not yet processed (`None`: opaque sequences).
    pub changes_pending: Option<u64>,
    /// Changes processed but not yet checkpointed (lost work if the job crashed now).
    pub checkpoint_lag: Option<u64>,
    /// Seconds since the job fell behind its source feed (0 while caught up).
    pub lag_seconds: Option<u64>,
    /// Documents written by the current run.
    pub docs_written: u64,
}

/// Writes the distribution, sum, max and top-K families of both measures.
pub fn render<Id: AsRef<str>>(e: &mut Exposition, jobs: &[JobSample<Id>]) {
    family(
        e,
        "couch_replicator_job_changes_pending",
        "changes not yet processed, over this node's running jobs",
        &CHANGE_BOUNDS,
        jobs.iter().map(|j| (j.job_id.as_ref(), j.changes_pending)),
    );
    family(
        e,
        "couch_replicator_job_lag_seconds",
        "seconds behind the source (0 when caught up), over this node's running jobs",
        &LAG_BOUNDS,
        jobs.iter().map(|j| (j.job_id.as_ref(), j.lag_seconds)),
    );
    family(
        e,
        "couch_replicator_job_checkpoint_lag",
        "changes processed but not yet checkpointed, over this node's running jobs",
        &CHANGE_BOUNDS,
        jobs.iter().map(|j| (j.job_id.as_ref(), j.checkpoint_lag)),
    );
    let written: Vec<(&str, Option<u64>)> = jobs
        .iter()
        .map(|j| (j.job_id.as_ref(), Some(j.docs_written)))
        .collect();
    top(
        e,
        "couch_replicator_job_docs_written_top",
        "documents written by the current run, the busiest running jobs",
        &written,
    );
}

fn family<'a>(
    e: &mut Exposition,
    base: &str,
    help: &str,
    bounds: &[u64],
    values: impl Iterator<Item = (&'a str, Option<u64>)>,
) {
    let values: Vec<(&str, Option<u64>)> = values.collect();
    let known: Vec<u64> = values.iter().filter_map(|(_, v)| *v).collect();
    let jobs = format!("{base}_jobs");
    e.family(
        &jobs,
        "gauge",
        &format!("running jobs with at most `le` {help}"),
    );
    for &b in bounds {
        let n = known.iter().filter(|v| **v <= b).count();
        e.sample(&jobs, &[("le", &b.to_string())], n as f64);
    }
    e.sample(&jobs, &[("le", "+Inf")], known.len() as f64);
    let sum: u64 = known.iter().sum();
    e.single(
        &format!("{base}_sum"),
        "gauge",
        &format!("sum of {help}"),
        sum as f64,
    );
    let max = known.iter().copied().max().unwrap_or(0);
    e.single(
        &format!("{base}_max"),
        "gauge",
        &format!("maximum of {help}"),
        max as f64,
    );
    top(e, &format!("{base}_top"), help, &values);
}

fn top(e: &mut Exposition, name: &str, help: &str, values: &[(&str, Option<u64>)]) {
    let mut known: Vec<(&str, u64)> = values
        .iter()
        .filter_map(|(id, v)| v.map(|v| (*id, v)))
        .collect();
    known.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    e.family(name, "gauge", &format!("{help}: the top {TOP_K} jobs"));
    for (rank, (id, v)) in known.iter().take(TOP_K).enumerate() {
        e.sample(
            name,
            &[("rank", &(rank + 1).to_string()), ("job_id", id)],
            *v as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, pending: u64) -> JobSample {
        JobSample {
            job_id: id.into(),
            changes_pending: Some(pending),
            checkpoint_lag: None,
            lag_seconds: Some(pending % 4_000),
            docs_written: pending,
        }
    }

    #[test]
    fn series_count_does_not_grow_with_jobs() {
        let count = |n: u64| {
            let jobs: Vec<JobSample> = (0..n).map(|i| job(&format!("j{i}"), i)).collect();
            let mut e = Exposition::default();
            render(&mut e, &jobs);
            let text = e.finish();
            (text.lines().filter(|l| !l.starts_with('#')).count(), text)
        };
        let (small, _) = count(20);
        let (large, text) = count(10_000);
        assert_eq!(small, large);
        assert!(text.contains("couch_replicator_job_changes_pending_jobs{le=\"100\"} 101\n"));
        assert!(text.contains("couch_replicator_job_changes_pending_max 9999\n"));
        // Seconds have their own buckets (the values: 0..=3999 twice, then 0..=1999).
        assert!(text.contains("couch_replicator_job_lag_seconds_jobs{le=\"3600\"} 9202\n"));
        assert!(text.contains("couch_replicator_job_lag_seconds_max 3999\n"));
        assert!(text.contains(
            "couch_replicator_job_changes_pending_top{rank=\"1\",job_id=\"j9999\"} 9999\n"
        ));
    }
}
