//! rotation: the job server's running jobs and when each one rotates out and comes back.
//!
//! Owns the job server's table of running job actors ([`Worker`]) and the state of the
//! rotation: the measured cycle (the time between ticks), when a job trimmed in this cycle
//! is due to run again ([`turn_due`]), the tick's fair-share plan ([`SharePlan`]) and each
//! database's smoothed service ratio and delay ([`GroupDelay`]). It takes no messages: the job server calls [`Rotation::tick`] and
//! [`Rotation::refresh`] at every tick and [`Rotation::trim`] after every start and tick.
//! The arithmetic is in [`super::rotation_policy`], [`super::share`] and [`super::share_plan`].

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ractor::{ActorId, ActorRef};
use tokio::time::Instant;

use super::rotation_policy::{RunningJob, eligible_after, trim_victims, turn_due};
use super::share::{FairShare, ShareKey, ratio_weight, smooth_ratio};
use super::share_plan::{GroupDelay, SharePlan};
use crate::replicator::job::actor::JobMsg;
use crate::replicator::job::id::JobId;

/// At most this many cycles between a job's rotation and its turn.
const MAX_ROTATION_INTERVALS: usize = 40;

/// One running job actor.
pub(crate) struct Worker {
    pub(crate) actor: ActorRef<JobMsg>,
    pub(crate) job_id: JobId,
    pub(crate) continuous: bool,
    pub(crate) group: ShareKey,
    pub(crate) started: Instant,
    /// Told to rotate out: it no longer counts against `max_jobs` nor is trimmed again.
    pub(crate) leaving: bool,
    /// Its database's fair-share delay as of the last tick: usage changes only at a tick,
    /// so the trims after each start need not recompute it.
    pub(crate) delay: GroupDelay,
}

/// The running jobs and the rotation's timing.
pub(crate) struct Rotation {
    /// Running job actors.
    pub(crate) workers: HashMap<ActorId, Worker>,
    /// Each database's delay as of the last tick (see [`Worker::delay`]).
    delays: HashMap<ShareKey, GroupDelay>,
    /// The tick's split of the slots among the databases.
    plan: SharePlan,
    /// Each planned database's smoothed service ratio ([`smooth_ratio`]), which its factor
    /// is taken from.
    ratios: HashMap<ShareKey, f64>,
    /// When a job trimmed in this cycle is due to run again, and the cycle it was counted
    /// in (both set every tick; see [`turn_due`]).
    turn_due: Duration,
    turn_cycle: Duration,
    /// The last tick, and the time between ticks as measured (a moving average): the
    /// interval, its jitter and the tick's own work.
    last_tick: Option<Instant>,
    cycle: Duration,
}

impl Rotation {
    /// An empty rotation whose cycle is first taken as `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            workers: HashMap::new(),
            delays: HashMap::new(),
            plan: SharePlan::default(),
            ratios: HashMap::new(),
            turn_due: interval,
            turn_cycle: interval,
            last_tick: None,
            cycle: interval,
        }
    }

    /// Running jobs not told to leave.
    pub(crate) fn live(&self) -> usize {
        self.workers.values().filter(|w| !w.leaving).count()
    }

    /// Running jobs a trim may stop: continuous, not leaving, run for `min_run_time`.
    pub(crate) fn rotatable(&self, min_run_time: Duration) -> usize {
        self.workers
            .values()
            .filter(|w| !w.leaving && w.continuous && w.started.elapsed() >= min_run_time)
            .count()
    }

    /// A tick at `now`: measures the cycle and sets when a job trimmed in it is due, with
    /// `pending` jobs waiting and `max_churn` started per cycle.
    pub(crate) fn tick(&mut self, now: Instant, interval: Duration, pending: usize, churn: usize) {
        if let Some(last) = self.last_tick.replace(now) {
            self.cycle = (self.cycle * 3 + now.saturating_duration_since(last)) / 4;
        }
        self.turn_cycle = self.cycle.max(interval);
        self.turn_due = turn_due(pending, churn, self.turn_cycle, MAX_ROTATION_INTERVALS);
    }

    /// Rebuilds the tick's plan ([`SharePlan`]) over `slots` for the node's `all_jobs`, and
    /// each database's delay after the tick's fair-share update of `share`, for the table
    /// and every running job. The service ratios are averaged over about a rotation (the
    /// tick's `turn_due`, see [`ratio_weight`]) and kept for every planned database, also
    /// while none of its jobs runs: a database whose jobs sit together in the rotation has
    /// ticks with nothing running, and restarting its average then (from a ratio near 0)
    /// sent its next jobs back after a quarter of a rotation, together again. A new
    /// database starts at 1.
    pub(crate) fn refresh(&mut self, share: &FairShare<JobId>, slots: usize, all_jobs: usize) {
        self.plan = SharePlan::new(share.params(), share.group_jobs(), slots, all_jobs);
        let usage = share.usage();
        let weight = ratio_weight(self.turn_due.as_secs_f64() / self.turn_cycle.as_secs_f64());
        self.delays.clear();
        let groups: HashSet<&ShareKey> = share.group_jobs().keys().collect();
        self.ratios.retain(|k, _| groups.contains(k));
        for g in groups {
            let measured = self.plan.service_ratio(g, &usage);
            let prev = self.ratios.get(g).copied().unwrap_or(1.0);
            let ratio = smooth_ratio(prev, measured, weight);
            self.ratios.insert(g.clone(), ratio);
            self.delays.insert(g.clone(), self.plan.delay(g, ratio));
        }
        for w in self.workers.values_mut() {
            w.delay = self.delays.get(&w.group).copied().unwrap_or_default();
        }
    }

    /// `group`'s delay from the tick's table, computed and kept there when missing (a
    /// database whose first job just started: from its ratio now).
    pub(crate) fn delay_of(&mut self, share: &FairShare<JobId>, group: &ShareKey) -> GroupDelay {
        if let Some(d) = self.delays.get(group) {
            return *d;
        }
        let ratio = self.plan.service_ratio(group, &share.usage());
        let d = self.plan.delay(group, ratio);
        self.delays.insert(group.clone(), d);
        d
    }

    /// Tells the jobs over `max_jobs` to rotate out: the continuous ones that ran at least
    /// `min_run_time`, the longest running first, those of a database far over its part
    /// before any other (see [`trim_victims`], [`GroupDelay::rank`]). A job waits until a
    /// margin before its turn ([`eligible_after`]), the turn scaled by its database's
    /// [`GroupDelay::factor`]. Returns how many were told.
    pub(crate) fn trim(&mut self, max_jobs: usize, min_run_time: Duration) -> usize {
        self.stop_over(max_jobs, min_run_time, None)
    }

    /// Tells the jobs over `limit` (this node's part of the cluster's jobs, see
    /// [`super::balance`]) to go back to the queue now, chosen as [`Rotation::trim`] does:
    /// another node under its part takes them at once. Returns how many were told.
    pub(crate) fn hand_back(&mut self, limit: usize, min_run_time: Duration) -> usize {
        self.stop_over(limit, min_run_time, Some(Duration::ZERO))
    }

    /// The victims over `max_jobs` rotate out, each eligible again after `wait`, or by its
    /// turn when `None`.
    fn stop_over(
        &mut self,
        max_jobs: usize,
        min_run_time: Duration,
        wait: Option<Duration>,
    ) -> usize {
        if self.live() <= max_jobs {
            return 0;
        }
        // Ranked and delayed by how the database is served, not by the job's own priority:
        // two jobs of one database that ran alike must come back alike, and a job's
        // priority also carries the timing of its last turns, so ranking by it stops some
        // jobs just after their start and others a cycle late (uneven turns; see
        // docs/decisions/2026-11-23-trim-order.md). Only a database far over its share ranks
        // first (`stop_rank`); otherwise the oldest turn ends first.
        let running: Vec<RunningJob<ActorId>> = self
            .workers
            .iter()
            .filter(|(_, w)| !w.leaving)
            .map(|(id, w)| RunningJob {
                id: *id,
                continuous: w.continuous,
                ran_for: w.started.elapsed(),
                priority: w.delay.rank,
            })
            .collect();
        let victims = trim_victims(&running, max_jobs, min_run_time);
        for v in &victims {
            let Some(w) = self.workers.get_mut(v) else {
                continue;
            };
            let wait = wait
                .unwrap_or_else(|| eligible_after(self.turn_due, self.turn_cycle, w.delay.factor));
            let _ = w.actor.send_message(JobMsg::Rotate(wait));
            w.leaving = true;
        }
        victims.len()
    }
}
