//! Fair share between `_replicator` databases (CouchDB 3.2+'s `couch_replicator_share`, after
//! Kay and Lauder's "A Fair Share Scheduler"), as a pure policy: no actor, no clock reads —
//! the job server passes the time in, so every step is unit-tested with controlled time.
//!
//! Each group (a `_replicator` database; transient jobs form one group of their own) has
//! shares (`[replicator.shares]`, default 100, clamped to 1..=1000). Running jobs are charged
//! their running time (microseconds) to their group; every cycle a group's usage decays by
//! `usage_coeff` and gains the cycle's charges, every job priority decays by
//! `priority_coeff`, and each running job's priority grows by
//! `usage(group) × jobs(group) / shares(group)²`. A lower priority value runs first: the job
//! server stops the highest values first and lets the lowest come back soonest, so over time a
//! group's running time follows its shares.
//!
//! Unlike CouchDB, which rewrites every priority each cycle, priorities decay lazily: an entry
//! stores its value and the cycle it was written, and is decayed when read. A cycle's work is
//! proportional to the running jobs and the groups, not to the jobs waiting (a full prune of
//! entries that decayed to nothing runs every [`PRUNE_EVERY`] cycles).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
#[cfg(any(test, feature = "internals"))]
use std::time::Duration;

use tokio::time::Instant;

/// The fewest shares a group can have.
pub const MIN_SHARES: u32 = 1;
/// The most shares a group can have.
pub const MAX_SHARES: u32 = 1000;
/// Shares of a group not configured.
pub const DEFAULT_SHARES: u32 = 100;
/// Cycles between full prunes of decayed priorities.
pub const PRUNE_EVERY: u64 = 64;

/// The group a job is charged to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ShareKey {
    /// A `_replicator` database by name.
    Db(String),
    /// Jobs from `POST /_replicate`.
    Transient,
}

/// The fair-share settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShareParams {
    /// Shares per `_replicator` database (others get `DEFAULT_SHARES`).
    pub shares: BTreeMap<String, u32>,
    /// How much of a group's usage survives a cycle (CouchDB: 0.5).
    pub usage_coeff: f64,
    /// How much of a job's priority survives a cycle (CouchDB: 0.98).
    pub priority_coeff: f64,
}

impl Default for ShareParams {
    fn default() -> Self {
        Self {
            shares: BTreeMap::new(),
            usage_coeff: 0.5,
            priority_coeff: 0.98,
        }
    }
}

impl ShareParams {
    /// The shares of `key`, clamped to `MIN_SHARES..=MAX_SHARES`.
    pub fn shares(&self, key: &ShareKey) -> u32 {
        let configured = match key {
            ShareKey::Db(db) => self.shares.get(db).copied(),
            ShareKey::Transient => None,
        };
        configured
            .unwrap_or(DEFAULT_SHARES)
            .clamp(MIN_SHARES, MAX_SHARES)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    key: ShareKey,
    /// Priority as of cycle `at`.
    value: f64,
    at: u64,
    /// Since when it runs, charged up to then.
    running_since: Option<Instant>,
}

/// The fair-share tables of one job server.
#[derive(Debug, Clone)]
pub struct FairShare<J> {
    params: ShareParams,
    cycle: u64,
    jobs: HashMap<J, Entry>,
    num_jobs: HashMap<ShareKey, usize>,
    usage: HashMap<ShareKey, f64>,
    charges: HashMap<ShareKey, f64>,
}

impl<J: Hash + Eq + Clone> FairShare<J> {
    /// Empty tables.
    pub fn new(params: ShareParams) -> Self {
        Self {
            params,
            cycle: 0,
            jobs: HashMap::new(),
            num_jobs: HashMap::new(),
            usage: HashMap::new(),
            charges: HashMap::new(),
        }
    }

    /// The settings.
    pub fn params(&self) -> &ShareParams {
        &self.params
    }

    /// `job` of group `key` starts running at `now` (first seen: counted in its group and
    /// given its group's current increment, so a new job does not jump the queue).
    pub fn started(&mut self, job: J, key: ShareKey, now: Instant) {
        if !self.jobs.contains_key(&job) {
            *self.num_jobs.entry(key.clone()).or_default() += 1;
            let inc = self.increment(&key);
            self.jobs.insert(
                job.clone(),
                Entry {
                    key,
                    value: inc,
                    at: self.cycle,
                    running_since: None,
                },
            );
        }
        if let Some(e) = self.jobs.get_mut(&job) {
            e.running_since = Some(now);
        }
    }

    /// `job` stopped at `now`: its running time since the last cycle is charged now. It is
    /// remembered (and counted in its group) until its priority decays to nothing.
    pub fn stopped(&mut self, job: &J, now: Instant) {
        let Some(e) = self.jobs.get_mut(job) else {
            return;
        };
        if let Some(since) = e.running_since.take() {
            let us = now.saturating_duration_since(since).as_micros() as f64;
            *self.charges.entry(e.key.clone()).or_default() += us;
        }
    }

    /// Forgets `job` (deleted, finished).
    pub fn removed(&mut self, job: &J) {
        if let Some(e) = self.jobs.remove(job) {
            self.uncount(&e.key);
        }
    }

    /// One scheduler cycle at `now`: charge running jobs, decay usage and add the charges,
    /// decay every priority (lazily), raise running jobs' priorities.
    pub fn update(&mut self, now: Instant) {
        for e in self.jobs.values_mut() {
            if let Some(since) = e.running_since.as_mut() {
                let us = now.saturating_duration_since(*since).as_micros() as f64;
                *self.charges.entry(e.key.clone()).or_default() += us;
                *since = now;
            }
        }
        let coeff = self.params.usage_coeff.clamp(0.0, 1.0);
        for u in self.usage.values_mut() {
            *u *= coeff;
        }
        for (k, c) in self.charges.drain() {
            *self.usage.entry(k).or_default() += c;
        }
        self.usage.retain(|_, u| *u >= 1.0);
        self.cycle += 1;
        let running: Vec<J> = self
            .jobs
            .iter()
            .filter(|(_, e)| e.running_since.is_some())
            .map(|(j, _)| j.clone())
            .collect();
        for j in running {
            let Some(key) = self.jobs.get(&j).map(|e| e.key.clone()) else {
                continue;
            };
            let inc = self.increment(&key);
            let now_value = self.priority_f(&j);
            if let Some(e) = self.jobs.get_mut(&j) {
                e.value = now_value + inc;
                e.at = self.cycle;
            }
        }
        if self.cycle.is_multiple_of(PRUNE_EVERY) {
            self.prune();
        }
    }

    /// The current priority of `job` (0 when unknown): lower runs first.
    pub fn priority(&self, job: &J) -> u64 {
        self.priority_f(job) as u64
    }

    /// Jobs remembered (running or waiting with a priority left).
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Jobs remembered per group (running, or waiting with a priority left): the demand the
    /// slots are split over (`super::share_plan::SharePlan`).
    pub fn group_jobs(&self) -> &HashMap<ShareKey, usize> {
        &self.num_jobs
    }

    /// Decayed usage per group (microseconds of running time).
    pub fn usage(&self) -> BTreeMap<ShareKey, u64> {
        self.usage
            .iter()
            .map(|(k, u)| (k.clone(), *u as u64))
            .collect()
    }

    fn priority_f(&self, job: &J) -> f64 {
        self.jobs.get(job).map_or(0.0, |e| {
            let cycles = self.cycle.saturating_sub(e.at).min(i32::MAX as u64) as i32;
            e.value * self.params.priority_coeff.clamp(0.0, 1.0).powi(cycles)
        })
    }

    fn increment(&self, key: &ShareKey) -> f64 {
        let shares = f64::from(self.params.shares(key));
        let usage = self.usage.get(key).copied().unwrap_or(0.0);
        let jobs = self.num_jobs.get(key).copied().unwrap_or(0) as f64;
        usage * jobs / (shares * shares)
    }

    fn uncount(&mut self, key: &ShareKey) {
        if let Some(n) = self.num_jobs.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.num_jobs.remove(key);
            }
        }
    }

    /// Forgets waiting jobs whose priority decayed below 1.
    fn prune(&mut self) {
        let gone: Vec<J> = self
            .jobs
            .iter()
            .filter(|(j, e)| e.running_since.is_none() && self.priority_f(j) < 1.0)
            .map(|(j, _)| j.clone())
            .collect();
        for j in gone {
            self.removed(&j);
        }
    }
}

/// How far a group's `super::share_plan::SharePlan::service_ratio` may stray from 1,
/// either way, before it changes a delay at all. The plan already sets each group's delay
/// from its shares, so the feedback is left only what the plan cannot see (turns cut short,
/// jobs never trimmed). Usage decays by half each cycle, so the ratio follows the mix of the
/// last cycle or two and swings widely while a database gets exactly its share; a trimmed
/// job's turn comes many cycles later, so acting on that swing feeds it back. Only a real
/// imbalance passes this band (docs/decisions/2026-11-26-fair-share-feedback.md).
pub const DELAY_DEAD_BAND: f64 = 2.0;

/// The most weight a tick's service ratio gets in the smoothed ratio the delay factor is
/// taken from ([`smooth_ratio`]): a quarter, so one cycle's mix moves it little (the last
/// cycle's burst of starts decides the ratio's noise), while a real imbalance, there at
/// every tick, passes the dead band within a few.
pub const RATIO_SMOOTHING: f64 = 0.25;

/// The weight of one tick in the smoothed ratio when a rotation (every waiting job run
/// once) takes `rotation_cycles` cycles: one rotation's worth, at most
/// [`RATIO_SMOOTHING`]. Usage decays within a cycle or two, so a database whose jobs sit
/// together in the rotation swings from far under its part to far over it and back once
/// per rotation while getting exactly its share; averaged over less than a rotation that
/// swing passes the dead band. A real imbalance lasts longer than a rotation, and a trimmed
/// job's delay acts only a rotation later anyway
/// (docs/decisions/2026-11-26-fair-share-feedback.md).
pub fn ratio_weight(rotation_cycles: f64) -> f64 {
    if rotation_cycles.is_finite() && rotation_cycles > 1.0 {
        (1.0 / rotation_cycles).min(RATIO_SMOOTHING)
    } else {
        RATIO_SMOOTHING
    }
}

/// A group's smoothed service ratio after a tick that measured `now` with `weight` (see
/// [`ratio_weight`]), from `prev` (the job server starts a new group at 1); `now` itself
/// when either is not a number.
pub fn smooth_ratio(prev: f64, now: f64, weight: f64) -> f64 {
    if prev.is_finite() && now.is_finite() {
        prev + weight * (now - prev)
    } else {
        now
    }
}

/// The feedback part of a stopped job's delay, given its group's smoothed
/// `super::share_plan::SharePlan::service_ratio`: 1 within [`DELAY_DEAD_BAND`] of 1,
/// beyond it the ratio less the band (so the factor moves continuously), from 1/4 (a
/// starved group's job comes back soon) to 4 (an over-served group's job waits).
pub fn delay_factor(service_ratio: f64) -> f64 {
    if !service_ratio.is_finite() {
        return 1.0;
    }
    let banded = if service_ratio > DELAY_DEAD_BAND {
        service_ratio / DELAY_DEAD_BAND
    } else if service_ratio * DELAY_DEAD_BAND < 1.0 {
        service_ratio * DELAY_DEAD_BAND
    } else {
        1.0
    };
    banded.clamp(0.25, 4.0)
}

/// The delay factor from which a group's running jobs are stopped before any other's: its
/// service ratio is then at least 4 (twice the band past its edge), a real imbalance. Below it
/// every group ranks alike and the oldest turn ends first; ranking by smaller differences
/// stops a whole database's jobs in one burst whenever its ratio crosses the band
/// (docs/decisions/2026-11-23-trim-order.md).
pub const STOP_FIRST_FACTOR: f64 = 2.0;

/// Where a running job of a group with delay `factor` ([`delay_factor`]) stands in the
/// stop order: 1 (stopped first) for a group at [`STOP_FIRST_FACTOR`] or over, else 0.
pub fn stop_rank(factor: f64) -> u64 {
    u64::from(factor >= STOP_FIRST_FACTOR)
}

/// Running-time fraction per group vs the fraction its shares ask for: half the sum of the
/// absolute differences (0 = exact, 1 = all time to the wrong group). Groups are weighted
/// by their shares alone, as when every group has more jobs than it can run.
#[cfg(any(test, feature = "internals"))]
pub fn share_error(params: &ShareParams, ran: &BTreeMap<ShareKey, Duration>) -> f64 {
    let total: f64 = ran.values().map(Duration::as_secs_f64).sum();
    let weights: f64 = ran.keys().map(|k| f64::from(params.shares(k))).sum();
    if total <= 0.0 || weights <= 0.0 {
        return 0.0;
    }
    ran.iter()
        .map(|(k, d)| (d.as_secs_f64() / total - f64::from(params.shares(k)) / weights).abs())
        .sum::<f64>()
        / 2.0
}

#[cfg(test)]
#[path = "share_tests.rs"]
pub(crate) mod tests;
