//! The public job API on [`Jobs`]: each call as its own retried transaction, and a `*_tx`
//! form that runs inside the caller's transaction (CouchDB's couch_jobs.erl API).

use serde::de::DeserializeOwned;

use crate::store::{RangeOptions, Tx, Watch};

use super::accept::{AcceptOpts, try_accept, try_accept_claimed, wait_timeout};
use super::error::{JobsError, JobsResult};
use super::fold::{FOLD_PAGE_SIZE, JobInfo, list_jobs_page, list_jobs_page_as};
use super::job_data::{JobData, JobState};
use super::{Job, Jobs, lifecycle as lc};

/// Default `pending_count` limit.
pub const PENDING_COUNT_LIMIT: usize = 1024;

impl Jobs {
    /// Adds a job (pending at `stime`), or resubmits an existing one with the new data and
    /// `stime`. Needs the type's timeout to be set ([`JobsError::NoTypeTimeout`]).
    #[cfg(any(test, feature = "internals"))]
    pub async fn add(&self, ty: &str, id: &str, data: JobData, stime: i64) -> JobsResult<()> {
        self.db()
            .run(|tx| {
                let data = data.clone();
                async move { self.add_tx(&tx, ty, id, data, stime).await }
            })
            .await
    }

    /// [`Jobs::add`] inside the caller's transaction.
    pub async fn add_tx(
        &self,
        tx: &Tx,
        ty: &str,
        id: &str,
        data: JobData,
        stime: i64,
    ) -> JobsResult<()> {
        lc::add(self.keys(), tx, ty, id, data, stime).await
    }

    /// Removes a job in any state ([`JobsError::NotFound`] if missing).
    pub async fn remove(&self, ty: &str, id: &str) -> JobsResult<()> {
        self.db()
            .run(|tx| async move { self.remove_tx(&tx, ty, id).await })
            .await
    }

    /// [`Jobs::remove`] inside the caller's transaction.
    pub async fn remove_tx(&self, tx: &Tx, ty: &str, id: &str) -> JobsResult<()> {
        lc::remove(self.keys(), tx, ty, id).await
    }

    /// Resubmits a job: see [`lc::resubmit`] for the per-state rules. `stime = None` keeps the
    /// current scheduled time; `data = None` keeps the data.
    #[cfg(any(test, feature = "internals"))]
    pub async fn resubmit(
        &self,
        ty: &str,
        id: &str,
        stime: Option<i64>,
        data: Option<JobData>,
    ) -> JobsResult<()> {
        self.db()
            .run(|tx| {
                let data = data.clone();
                async move { self.resubmit_tx(&tx, ty, id, stime, data).await }
            })
            .await
    }

    /// [`Jobs::resubmit`] inside the caller's transaction.
    pub async fn resubmit_tx(
        &self,
        tx: &Tx,
        ty: &str,
        id: &str,
        stime: Option<i64>,
        data: Option<JobData>,
    ) -> JobsResult<()> {
        lc::resubmit(self.keys(), tx, ty, id, stime, data).await
    }

    /// Re-enqueues a running job now, fencing its worker out (see [`lc::requeue_running`]).
    pub async fn requeue_running_tx(&self, tx: &Tx, ty: &str, id: &str) -> JobsResult<bool> {
        lc::requeue_running(self.keys(), tx, ty, id).await
    }

    /// The job's current data, in any state ([`JobsError::NotFound`] if missing).
    pub async fn get_job_data(&self, ty: &str, id: &str) -> JobsResult<JobData> {
        self.db()
            .run(|tx| async move { self.get_job_data_tx(&tx, ty, id).await })
            .await
    }

    /// [`Jobs::get_job_data`] inside the caller's transaction (a conflict-checked read).
    pub async fn get_job_data_tx(&self, tx: &Tx, ty: &str, id: &str) -> JobsResult<JobData> {
        lc::get_job_data(self.keys(), tx, ty, id).await
    }

    /// Whether the job is pending, running or finished ([`JobsError::NotFound`] if missing).
    #[cfg(any(test, feature = "internals"))]
    pub async fn get_job_state(&self, ty: &str, id: &str) -> JobsResult<JobState> {
        self.db()
            .run(|tx| async move { self.get_job_state_tx(&tx, ty, id).await })
            .await
    }

    /// [`Jobs::get_job_state`] inside the caller's transaction (a conflict-checked read).
    pub async fn get_job_state_tx(&self, tx: &Tx, ty: &str, id: &str) -> JobsResult<JobState> {
        lc::get_job_state(self.keys(), tx, ty, id).await
    }

    /// Every type that has an activity timeout.
    pub async fn get_types(&self) -> JobsResult<Vec<String>> {
        self.db()
            .run(|tx| async move { self.get_types_tx(&tx).await })
            .await
    }

    /// [`Jobs::get_types`] inside the caller's transaction.
    pub async fn get_types_tx(&self, tx: &Tx) -> JobsResult<Vec<String>> {
        lc::get_types(self.keys(), tx).await
    }

    /// Ids of the running jobs of a type.
    #[cfg(any(test, feature = "internals"))]
    pub async fn get_active_jobs_ids(&self, ty: &str) -> JobsResult<Vec<String>> {
        self.db()
            .run(|tx| async move { self.get_active_jobs_ids_tx(&tx, ty).await })
            .await
    }

    /// [`Jobs::get_active_jobs_ids`] inside the caller's transaction.
    #[cfg(any(test, feature = "internals"))]
    pub async fn get_active_jobs_ids_tx(&self, tx: &Tx, ty: &str) -> JobsResult<Vec<String>> {
        let jobs = lc::get_active_jobs(self.keys(), tx, ty).await?;
        Ok(jobs.into_iter().map(|(id, _)| id).collect())
    }

    /// Running jobs of a type with their latest data (what `_active_tasks` shows).
    pub async fn get_active_jobs(&self, ty: &str) -> JobsResult<Vec<(String, JobData)>> {
        self.db()
            .run(|tx| async move { lc::get_active_jobs(self.keys(), &tx, ty).await })
            .await
    }

    /// Folds `f` over every job of `ty`, one transaction per page of `FOLD_PAGE_SIZE`.
    pub async fn fold_jobs<A, F>(&self, ty: &str, acc: A, f: F) -> JobsResult<A>
    where
        F: FnMut(A, JobInfo) -> A,
    {
        self.fold_jobs_paged(ty, FOLD_PAGE_SIZE, acc, f).await
    }

    /// [`Jobs::fold_jobs`] with an explicit page size.
    pub async fn fold_jobs_paged<A, F>(
        &self,
        ty: &str,
        page_size: usize,
        acc: A,
        f: F,
    ) -> JobsResult<A>
    where
        F: FnMut(A, JobInfo) -> A,
    {
        self.fold_pages(page_size, acc, f, |tx, after| async move {
            list_jobs_page(self.keys(), &tx, ty, after.as_deref(), page_size).await
        })
        .await
    }

    /// [`Jobs::fold_jobs`] with each job's data decoded as `D` (`None` when it does not
    /// decode): a reader of a few fields of every job skips building the rest.
    pub async fn fold_jobs_as<D, A, F>(&self, ty: &str, acc: A, f: F) -> JobsResult<A>
    where
        D: DeserializeOwned,
        F: FnMut(A, JobInfo<Option<D>>) -> A,
    {
        self.fold_pages(FOLD_PAGE_SIZE, acc, f, |tx, after| async move {
            list_jobs_page_as(self.keys(), &tx, ty, after.as_deref(), FOLD_PAGE_SIZE).await
        })
        .await
    }

    /// One transaction per page of `page_size` (read by `page`, given the last id seen),
    /// each page's jobs folded into `acc` in key order.
    async fn fold_pages<D, A, F, P, Fut>(
        &self,
        page_size: usize,
        mut acc: A,
        mut f: F,
        page: P,
    ) -> JobsResult<A>
    where
        F: FnMut(A, JobInfo<D>) -> A,
        P: Fn(Tx, Option<String>) -> Fut,
        Fut: Future<Output = JobsResult<Vec<JobInfo<D>>>>,
    {
        let mut after: Option<String> = None;
        loop {
            let rows = self.db().run(|tx| page(tx, after.clone())).await?;
            let full = rows.len() >= page_size.max(1);
            self.count_listed(rows.len());
            after = rows.last().map(|j| j.id.clone());
            for job in rows {
                acc = f(acc, job);
            }
            if !full {
                return Ok(acc);
            }
        }
    }

    /// One page of jobs inside the caller's transaction (ids after `after`).
    #[cfg(any(test, feature = "internals"))]
    pub async fn list_jobs_tx(
        &self,
        tx: &Tx,
        ty: &str,
        after: Option<&str>,
        limit: usize,
    ) -> JobsResult<Vec<JobInfo>> {
        list_jobs_page(self.keys(), tx, ty, after, limit).await
    }

    /// Estimate of the jobs pending with `STime <= max_sched_time` (default 2^36), counting
    /// at most `limit` (default 1024).
    pub async fn pending_count(
        &self,
        ty: &str,
        max_sched_time: Option<i64>,
        limit: Option<usize>,
    ) -> JobsResult<usize> {
        self.db()
            .run(|tx| async move { self.pending_count_tx(&tx, ty, max_sched_time, limit).await })
            .await
    }

    /// [`Jobs::pending_count`] inside the caller's transaction.
    pub async fn pending_count_tx(
        &self,
        tx: &Tx,
        ty: &str,
        max_sched_time: Option<i64>,
        limit: Option<usize>,
    ) -> JobsResult<usize> {
        lc::pending_count(
            self.keys(),
            tx,
            ty,
            max_sched_time.unwrap_or(super::accept::MAX_SCHED_TIME),
            limit.unwrap_or(PENDING_COUNT_LIMIT),
        )
        .await
    }

    /// The most urgent pending job of `ty` (smallest scheduled time): `(stime, id)`. A
    /// snapshot read, so peeking adds no conflict with concurrent enqueues; a caller that
    /// then accepts (e.g. [`Jobs::accept_tx`] with that `max_sched_time`) gets the conflict on
    /// the key it takes. Lets a worker serving several types pick the most urgent one.
    pub async fn pending_head_tx(&self, tx: &Tx, ty: &str) -> JobsResult<Option<(i64, String)>> {
        let (begin, end) = self.keys().pending_range(ty, super::accept::MAX_SCHED_TIME);
        let head = tx
            .get_range(&begin, &end, RangeOptions::all().snapshot().limit(1))
            .await?;
        head.first()
            .map(|kv| self.keys().decode_pending_key(&kv.key))
            .transpose()
    }

    /// A watch that fires once a job of `ty` is enqueued (added, resubmitted or
    /// re-enqueued by the activity monitor) after this transaction's read version.
    pub fn watch_pending_tx(&self, tx: &Tx, ty: &str) -> Watch {
        tx.watch(&self.keys().watches_pending(ty))
    }

    /// Dequeues and locks a job; waits for one as CouchDB's couch_jobs_fdb/couch_jobs_pending accept says. `NotFound` when the wait
    /// times out.
    pub async fn accept(&self, ty: &str, opts: AcceptOpts) -> JobsResult<(Job, JobData)> {
        self.accept_until(ty, opts, std::future::pending()).await
    }

    /// [`Jobs::accept`] that also stops waiting (`NotFound`) once `until` completes. It is
    /// polled only while no job is found, never during a transaction: a take cut short
    /// could commit with nobody to run the job.
    #[tracing::instrument(name = "couch_jobs.accept", level = "debug", skip_all,
        fields(job_type = %ty, job_id = tracing::field::Empty))]
    pub async fn accept_until(
        &self,
        ty: &str,
        opts: AcceptOpts,
        until: impl Future<Output = ()>,
    ) -> JobsResult<(Job, JobData)> {
        let mut until = std::pin::pin!(until);
        let max_sched_time = opts.effective_max_sched_time()?;
        let deadline = opts.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut wakes = 0u32;
        loop {
            // The claim on the key taken lives until `run` returns: it committed or failed.
            let opts = &opts;
            let began = tokio::time::Instant::now();
            let (found, watch) = self
                .db()
                .run(|tx| async move {
                    let (keys, rng) = (self.keys(), self.rng());
                    let found = try_accept_claimed(keys, &tx, ty, opts, rng, self.claims());
                    let found = found.await?;
                    let watch = match found {
                        Some(_) => None,
                        None => Some(tx.watch(&self.keys().watches_pending(ty))),
                    };
                    Ok::<_, JobsError>((found, watch))
                })
                .await?;
            if let Some((job, data, _claim)) = found {
                // How long the take's transaction took, retries included, and how many
                // enqueues woke this waiter before it (hand-overs are judged by both).
                let txn_ms = began.elapsed().as_millis() as u64;
                tracing::Span::current().record("job_id", job.id.as_str());
                tracing::debug!(txn_ms, wakes, "took a job");
                return Ok((job, data));
            }
            wakes += 1;
            let remaining =
                deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            let wait = wait_timeout(
                opts.no_schedule,
                max_sched_time,
                self.clock().now_ms(),
                remaining,
            );
            let Some(watch) = watch else {
                return Err(JobsError::NotFound);
            };
            let limit = match wait {
                Some(t) if t.is_zero() => return Err(JobsError::NotFound),
                Some(t) => t,
                None => std::time::Duration::MAX,
            };
            let woken = tokio::select! {
                woken = tokio::time::timeout(limit, watch) => woken,
                () = &mut until => return Err(JobsError::NotFound),
            };
            match woken {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_retryable() && wait.is_some() => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => return Err(JobsError::NotFound),
            }
        }
    }

    /// One non-blocking accept attempt inside the caller's transaction.
    #[tracing::instrument(name = "couch_jobs.accept", level = "debug", skip_all,
        fields(job_type = %ty))]
    pub async fn accept_tx(
        &self,
        tx: &Tx,
        ty: &str,
        opts: AcceptOpts,
    ) -> JobsResult<Option<(Job, JobData)>> {
        try_accept(self.keys(), tx, ty, &opts, self.rng()).await
    }

    /// Keep-alive and progress: fenced by the job lock ([`JobsError::Halt`] when lost).
    pub async fn update(&self, job: &Job, data: Option<JobData>) -> JobsResult<Job> {
        self.db()
            .run(|tx| {
                let data = data.clone();
                async move { self.update_tx(&tx, job, data).await }
            })
            .await
    }

    /// [`Jobs::update`] inside the caller's transaction, so a worker's own writes in that
    /// transaction commit only while it still holds the job's lock.
    #[tracing::instrument(name = "couch_jobs.update", level = "debug", skip_all,
        fields(job_type = %job.job_type, job_id = %job.id))]
    pub async fn update_tx(&self, tx: &Tx, job: &Job, data: Option<JobData>) -> JobsResult<Job> {
        lc::update(self.keys(), tx, job, data).await
    }

    /// Ends the job's run: finished, or pending again if it was resubmitted meanwhile.
    pub async fn finish(&self, job: &Job, data: Option<JobData>) -> JobsResult<()> {
        self.db()
            .run(|tx| {
                let data = data.clone();
                async move { self.finish_tx(&tx, job, data).await }
            })
            .await
    }

    /// [`Jobs::finish`] inside the caller's transaction, fenced by the job's lock like
    /// [`Jobs::update_tx`].
    #[tracing::instrument(name = "couch_jobs.finish", level = "debug", skip_all,
        fields(job_type = %job.job_type, job_id = %job.id))]
    pub async fn finish_tx(&self, tx: &Tx, job: &Job, data: Option<JobData>) -> JobsResult<()> {
        lc::finish(self.keys(), tx, job, data).await
    }

    /// Sets the type's activity timeout (seconds) and makes the type server start its
    /// monitors now.
    pub async fn set_type_timeout(&self, ty: &str, secs: i64) -> JobsResult<()> {
        self.db()
            .run(|tx| async move {
                self.set_type_timeout_tx(&tx, ty, secs);
                Ok::<_, JobsError>(())
            })
            .await?;
        self.registry().request_type_check().await;
        Ok(())
    }

    /// Writes the type's activity timeout (seconds) in the caller's transaction. Unlike
    /// [`Jobs::set_type_timeout`] it does not wake the type server: monitors start at its next
    /// periodic check.
    pub fn set_type_timeout_tx(&self, tx: &Tx, ty: &str, secs: i64) {
        lc::set_type_timeout(self.keys(), tx, ty, secs)
    }

    /// The type's activity timeout in seconds, or `None` if the type has none.
    pub async fn get_type_timeout(&self, ty: &str) -> JobsResult<Option<i64>> {
        self.db()
            .run(|tx| async move { lc::get_type_timeout(self.keys(), &tx, ty).await })
            .await
    }

    /// Removes the type's activity timeout and makes the type server stop its monitors now.
    /// Existing jobs stay; [`Jobs::add`] then fails with [`JobsError::NoTypeTimeout`].
    #[cfg(any(test, feature = "internals"))]
    pub async fn clear_type_timeout(&self, ty: &str) -> JobsResult<()> {
        self.db()
            .run(|tx| async move {
                lc::clear_type_timeout(self.keys(), &tx, ty);
                Ok::<_, JobsError>(())
            })
            .await?;
        self.registry().request_type_check().await;
        Ok(())
    }
}
