//! The job server's periodic cycle (`Tick`): fair-share accounting, the trim back to
//! `max_jobs`, this node's part of the cluster's jobs, the rotation's stops for the jobs due
//! (stopped before their successors start, so `max_jobs` holds), the cleanup of finished
//! transient jobs and the gauges.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::ActorRef;
use rand::Rng;
use tokio::time::Instant;

use super::{JobServer, JobServerMsg, JobServerState};
use crate::jobs::{JobState, JobsError};
use crate::replicator::job::record::RepJobRecord;
use crate::replicator::job::view::REP_JOBS;
use crate::replicator::node::settings::ReplicatorSettings;
use crate::replicator::scheduler::rotation_policy::{cluster_churn, rotation_stops};

/// Pending jobs counted for the rotation delay.
const ROTATION_COUNT_LIMIT: usize = 100_000;

impl JobServer {
    pub(super) fn schedule_tick(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState) {
        let interval = self.ctx.settings().interval;
        let jitter_ms = (interval.as_millis() as u64 / 3).max(1);
        let wait = interval + Duration::from_millis(rand::rng().random_range(0..jitter_ms));
        let me = myself.clone();
        st.timer = Some(tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = me.send_message(JobServerMsg::Tick);
        }));
    }

    pub(super) async fn tick(&self, myself: &ActorRef<JobServerMsg>, st: &mut JobServerState) {
        // The next tick is timed from this one's start, not its end: the tick's own work
        // (store scans, the stops it sends) would otherwise lengthen every cycle and, at
        // 10,000 jobs, every rotation by a third.
        self.schedule_tick(myself, st);
        let s = self.ctx.settings();
        // A job that ended before its Accepted arrived leaves a stale entry.
        let now = Instant::now();
        let share = &mut st.share;
        st.rot.workers.retain(|_, w| {
            let alive = w.actor.get_status() < ractor::ActorStatus::Stopping;
            if !alive {
                share.stopped(&w.job_id, now);
            }
            alive
        });
        // The churn of this cycle: what this tick starts or stops. Jobs accepted since the
        // last tick, and the trims they caused, belong to the last one.
        st.churn = 0;
        // 1. fair-share accounting, then trim what is still over `max_jobs`
        st.share.update(now);
        // The queue is the cluster's: a trimmed job's turn comes at the cluster's pace.
        // Counting this node's churn alone held jobs back `members` times too long.
        let pending = self.pending_all().await;
        let churn = cluster_churn(s.max_churn, st.members);
        st.rot.tick(now, s.interval, pending, churn);
        // The jobs surely there: a leaving job may already be counted as pending.
        let all_jobs = pending + st.rot.live();
        st.rot.refresh(&st.share, s.max_jobs, all_jobs);
        st.churn += st.rot.trim(s.max_jobs, s.min_run_time);
        self.balance(st).await;
        self.stop_for_due_jobs(st).await;
        // 3. transient cleanup: a scan of every job, so not at every tick (see
        // `cleanup_period`).
        if st
            .last_cleanup
            .is_none_or(|t| t.elapsed() >= cleanup_period(s))
        {
            st.last_cleanup = Some(Instant::now());
            if let Err(e) = self.cleanup_transient().await {
                tracing::warn!(error = %e, "transient job cleanup failed");
            }
        }
        // 4. gauges
        let m = self.ctx.metrics();
        m.jobs_accepting
            .store(st.acceptors.len() as u64, Ordering::Relaxed);
        m.jobs_running
            .store(st.rot.workers.len() as u64, Ordering::Relaxed);
        m.reschedules.fetch_add(1, Ordering::Relaxed);
        self.refill(myself, st);
    }

    /// Step 2 of the tick: while jobs are due and no slot is free, stops up to `max_churn`
    /// rotatable jobs. Their slots are refilled as their actors exit (`WorkerExited`), so
    /// `max_jobs` is never exceeded. Nothing stops while this node is held below
    /// `max_jobs`: some member has room for every pending job, nothing needs to rotate.
    async fn stop_for_due_jobs(&self, st: &mut JobServerState) {
        let s = self.ctx.settings();
        let free = s.max_jobs.saturating_sub(st.rot.workers.len());
        let most = rotation_stops(
            free,
            usize::MAX,
            s.max_churn,
            st.churn,
            st.rot.rotatable(s.min_run_time),
        ) * usize::from(st.limit >= s.max_jobs);
        if most > 0 {
            let now = self.ctx.now_secs();
            match self
                .ctx
                .jobs()
                .pending_count(REP_JOBS, Some(now), Some(free + most))
                .await
            {
                Ok(due) => {
                    let n = rotation_stops(
                        free,
                        due,
                        s.max_churn,
                        st.churn,
                        st.rot.rotatable(s.min_run_time),
                    );
                    let live = st.rot.live();
                    st.churn += st.rot.trim(live.saturating_sub(n), s.min_run_time);
                }
                Err(e) => tracing::warn!(error = %e, "pending_count failed"),
            }
        }
    }

    /// Every waiting job, eligible or not (up to [`ROTATION_COUNT_LIMIT`]): the queue a job
    /// trimmed now waits behind ([`super::rotation_policy::turn_due`], counted in measured cycles: the interval and
    /// its jitter, not intervals). At the end of a rotation most of them are the ones just
    /// rotated out, and the few that never ran must come first. CouchDB 4.x lets a rotated
    /// job back after one interval, which with couch_jobs' random pick among 1,024 leaves a
    /// long tail of jobs that wait many rotations.
    async fn pending_all(&self) -> usize {
        self.ctx
            .jobs()
            .pending_count(REP_JOBS, None, Some(ROTATION_COUNT_LIMIT))
            .await
            .unwrap_or(0)
    }

    async fn cleanup_transient(&self) -> Result<(), JobsError> {
        let max_age = self.ctx.settings().transient_job_max_age.as_secs() as i64;
        let limit = self.ctx.now_secs() - max_age;
        let old: Vec<String> = self
            .ctx
            .jobs()
            .fold_jobs(REP_JOBS, Vec::new(), |mut acc, j| {
                // The state first: decoding every record is the expensive part.
                let old_transient = || {
                    RepJobRecord::from_data(&j.data)
                        .is_ok_and(|r| r.is_transient() && r.last_updated <= limit)
                };
                if j.state == JobState::Finished && old_transient() {
                    acc.push(j.id);
                }
                acc
            })
            .await?;
        for id in old {
            match self.ctx.jobs().remove(REP_JOBS, &id).await {
                Ok(()) | Err(JobsError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// How often finished transient jobs are looked for: a tenth of their maximum age, at least
/// one `interval` and at most five minutes. The scan reads every job in the store, so doing
/// it at every tick would make an idle node's cost grow with the number of jobs; a finished
/// transient job may outlive `transient_job_max_age` by this much.
fn cleanup_period(s: &ReplicatorSettings) -> Duration {
    let tenth = s.transient_job_max_age / 10;
    tenth.clamp(s.interval, Duration::from_secs(300).max(s.interval))
}
