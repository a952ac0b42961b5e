//! The fair-share plan of one tick: how many of the `max_jobs` slots each group (a
//! `_replicator` database, or the transient jobs) is entitled to, and from that how long each
//! group's trimmed jobs should wait relative to the plain rotation. Pure arithmetic, no actor
//! and no clock, so the job server rebuilds it every tick and the tests drive it directly.
//!
//! The slots are split by weighted water-filling: each group is offered slots in proportion
//! to its shares; a group with fewer jobs than its offer keeps only what it can use and the
//! rest is offered again among the others. A group's jobs then each run a fraction
//! `slots / jobs` of the time, and the node's average is `max_jobs / all jobs`; the ratio of
//! the two is the group's *planned factor*: the multiple of the plain rotation delay after
//! which its trimmed jobs come back. With equal turns that alone gives every group its share
//! and every job of a group the same turns, without feedback. Feedback corrects what the plan
//! cannot see (turns cut short, jobs that crash or never get trimmed): the group's measured
//! usage against its planned part ([`SharePlan::service_ratio`]), which the job server
//! smooths and passes through a dead band ([`super::share::delay_factor`]).
//!
//! Why not the feedback alone: a trimmed job's turn comes tens of cycles later, so a delay
//! driven only by the measured usage acts on a loop with a long lag
//! (docs/decisions/2026-11-26-fair-share-plan.md).

use std::collections::{BTreeMap, HashMap};

use super::share::{ShareKey, ShareParams, delay_factor, stop_rank};

/// The least and the most planned factor: a group that can run all its jobs still waits
/// a quarter of a rotation (its jobs are eligible again almost at once anyway), and one far
/// over-subscribed waits at most four rotations (beyond that the rotation delay is capped).
const FACTOR_RANGE: (f64, f64) = (0.25, 4.0);

/// At most one job in this many may be unknown for a plan to be made ([`SharePlan::new`]).
const UNKNOWN_PART: usize = 16;

/// How a group's trimmed jobs are treated until the next tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupDelay {
    /// The rotation delay's multiple: the plan's factor times the feedback's
    /// ([`SharePlan::factor`], [`delay_factor`]).
    pub factor: f64,
    /// Its running jobs' place in the stop order, from the feedback alone ([`stop_rank`]):
    /// a group the plan gives few slots is not stopped first for that, only one measured
    /// far over its planned part.
    pub rank: u64,
}

impl Default for GroupDelay {
    /// The plain rotation, no rank.
    fn default() -> Self {
        Self {
            factor: 1.0,
            rank: 0,
        }
    }
}

/// One tick's entitlement per group.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SharePlan {
    /// Each group's planned part of the running time (its slots over all slots).
    part: HashMap<ShareKey, f64>,
    /// Each group's planned factor (see the module doc).
    factor: HashMap<ShareKey, f64>,
}

impl SharePlan {
    /// Splits `slots` among the groups of `jobs` (jobs known per group) by their shares,
    /// when nearly all of the node's `all_jobs` (running and waiting) are known: a job's
    /// group is learnt when it first runs, so until the waiting jobs have run once the
    /// counts are those of the jobs that happened to start first, and a plan from them can
    /// be wrong by several times for a whole rotation. Until then: no opinion, the plain
    /// rotation. Up to a sixteenth may be unknown (at least one job): a job that waits for
    /// hours (a failing one in back-off) is forgotten once its priority decays, and must not
    /// turn the plan off for good (docs/decisions/2026-11-26-fair-share-plan.md).
    pub fn new(
        params: &ShareParams,
        jobs: &HashMap<ShareKey, usize>,
        slots: usize,
        all_jobs: usize,
    ) -> Self {
        let total_jobs: usize = jobs.values().sum();
        let unknown = all_jobs.saturating_sub(total_jobs);
        if slots == 0 || total_jobs == 0 || unknown > (all_jobs / UNKNOWN_PART).max(1) {
            return Self::default();
        }
        let given = water_fill(params, jobs, slots as f64);
        let capacity: f64 = given.values().sum();
        let average = capacity / total_jobs as f64;
        let mut plan = Self::default();
        for (g, s) in given {
            let n = jobs.get(&g).copied().unwrap_or(0) as f64;
            let per_job = if n > 0.0 { s / n } else { 1.0 };
            let factor = if per_job > 0.0 {
                (average / per_job).clamp(FACTOR_RANGE.0, FACTOR_RANGE.1)
            } else {
                FACTOR_RANGE.1
            };
            plan.part.insert(g.clone(), s / capacity);
            plan.factor.insert(g, factor);
        }
        plan
    }

    /// `group`'s planned factor: 1 for a group the plan does not know (its first job only
    /// just started).
    pub fn factor(&self, group: &ShareKey) -> f64 {
        self.factor.get(group).copied().unwrap_or(1.0)
    }

    /// `group`'s delay from the plan and its smoothed service `ratio` (see
    /// [`Self::service_ratio`]).
    pub fn delay(&self, group: &ShareKey, ratio: f64) -> GroupDelay {
        let feedback = delay_factor(ratio);
        GroupDelay {
            factor: self.factor(group) * feedback,
            rank: stop_rank(feedback),
        }
    }

    /// How `group`'s decayed `usage` compares with its planned part: 1 exactly its part,
    /// above 1 over-served, 0 nothing ran lately; 1 while nothing ran or the group is not
    /// planned.
    pub fn service_ratio(&self, group: &ShareKey, usage: &BTreeMap<ShareKey, u64>) -> f64 {
        let total: f64 = usage.values().map(|u| *u as f64).sum();
        match self.part.get(group) {
            Some(part) if total > 0.0 && *part > 0.0 => {
                let used = usage.get(group).map_or(0.0, |u| *u as f64) / total;
                used / part
            }
            _ => 1.0,
        }
    }
}

/// Weighted water-filling of `slots` over the groups of `jobs`: slots per group, at most its
/// number of jobs, the rest in proportion to shares. Sums to `min(slots, all jobs)`.
fn water_fill(
    params: &ShareParams,
    jobs: &HashMap<ShareKey, usize>,
    slots: f64,
) -> HashMap<ShareKey, f64> {
    let mut given: HashMap<ShareKey, f64> = HashMap::new();
    let mut open: Vec<(&ShareKey, f64)> = jobs
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(g, n)| (g, *n as f64))
        .collect();
    let mut left = slots;
    // Each round either settles every open group or caps at least one: at most one round
    // per group.
    while !open.is_empty() && left > 0.0 {
        let weights: f64 = open.iter().map(|(g, _)| f64::from(params.shares(g))).sum();
        let offer = |g: &ShareKey| left * f64::from(params.shares(g)) / weights;
        let (capped, uncapped): (Vec<_>, Vec<_>) =
            open.into_iter().partition(|(g, n)| offer(g) >= *n);
        if capped.is_empty() {
            for (g, _) in &uncapped {
                given.insert((*g).clone(), offer(g));
            }
            return given;
        }
        for (g, n) in capped {
            given.insert(g.clone(), n);
            left -= n;
        }
        open = uncapped;
    }
    given
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicator::scheduler::share::tests::{db, params};

    fn jobs(n: &[(&str, usize)]) -> HashMap<ShareKey, usize> {
        n.iter().map(|(k, v)| (db(k), *v)).collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn jobs_in_proportion_to_shares_rotate_alike() {
        let p = params(&[("a", 100), ("b", 900)]);
        let plan = SharePlan::new(&p, &jobs(&[("a", 1000), ("b", 9000)]), 500, 0);
        assert!(close(plan.factor(&db("a")), 1.0));
        assert!(close(plan.factor(&db("b")), 1.0));
    }

    #[test]
    fn a_group_with_more_jobs_than_shares_waits_longer() {
        // Equal jobs, shares 1:9: a gets 0.2 of 2 slots for its 4 jobs, b 1.8.
        let p = params(&[("a", 100), ("b", 900)]);
        let plan = SharePlan::new(&p, &jobs(&[("a", 4), ("b", 4)]), 2, 0);
        assert!(close(plan.factor(&db("a")), 4.0), "5 clamped to 4");
        assert!(close(plan.factor(&db("b")), 0.25 / 0.45));
        assert_eq!(plan.factor(&db("c")), 1.0, "not planned");
    }

    #[test]
    fn a_small_group_keeps_what_it_can_use_and_the_rest_goes_to_the_others() {
        // Equal shares; x has 10 jobs, y 10,000, 500 slots: x runs all 10, y 490.
        let plan = SharePlan::new(&params(&[]), &jobs(&[("x", 10), ("y", 10_000)]), 500, 0);
        assert_eq!(plan.factor(&db("x")), 0.25, "all its jobs run: the least");
        let average = 500.0 / 10_010.0;
        assert!(close(plan.factor(&db("y")), average / (490.0 / 10_000.0)));
        let usage = BTreeMap::from([(db("x"), 10), (db("y"), 490)]);
        assert!(close(plan.service_ratio(&db("x"), &usage), 1.0));
        assert!(close(plan.service_ratio(&db("y"), &usage), 1.0));
    }

    #[test]
    fn the_service_ratio_compares_usage_with_the_planned_part() {
        let p = params(&[("a", 100), ("b", 900)]);
        let plan = SharePlan::new(&p, &jobs(&[("a", 100), ("b", 900)]), 100, 0);
        assert_eq!(plan.service_ratio(&db("a"), &BTreeMap::new()), 1.0, "idle");
        let usage = BTreeMap::from([(db("a"), 50), (db("b"), 50)]);
        assert!(close(plan.service_ratio(&db("a"), &usage), 5.0));
        assert!(close(plan.service_ratio(&db("b"), &usage), 5.0 / 9.0));
        assert_eq!(plan.service_ratio(&db("c"), &usage), 1.0, "not planned");
    }

    #[test]
    fn nothing_to_plan_gives_no_opinion() {
        let plan = SharePlan::new(&params(&[]), &HashMap::new(), 500, 0);
        assert_eq!(plan.factor(&db("a")), 1.0);
        let plan = SharePlan::new(&params(&[]), &jobs(&[("a", 3)]), 0, 0);
        assert_eq!(plan.factor(&db("a")), 1.0);
    }

    #[test]
    fn no_plan_until_nearly_every_job_has_been_seen() {
        // 1,000 of a's jobs started first; 2,000 of b's 9,000 so far: a looks over-subscribed.
        let p = params(&[("a", 100), ("b", 900)]);
        let early = SharePlan::new(&p, &jobs(&[("a", 1000), ("b", 2000)]), 500, 10_000);
        assert_eq!(early.factor(&db("a")), 1.0, "7,000 jobs not seen yet");
        let usage = BTreeMap::from([(db("a"), 9)]);
        assert_eq!(early.service_ratio(&db("a"), &usage), 1.0);
        let late = SharePlan::new(&p, &jobs(&[("a", 1000), ("b", 8375)]), 500, 10_000);
        let expected = (500.0 / 9375.0) / 0.05;
        assert!(close(late.factor(&db("a")), expected), "a sixteenth unseen");
        let all = SharePlan::new(&p, &jobs(&[("a", 1000), ("b", 9000)]), 500, 10_000);
        assert!(close(all.factor(&db("a")), 1.0));
        let usage = BTreeMap::from([(db("a"), 20), (db("b"), 80)]);
        assert!(
            close(all.service_ratio(&db("a"), &usage), 2.0),
            "planned once all seen"
        );
        // A node of three jobs may miss one (forgotten while it waited), not two.
        let small = jobs(&[("a", 1), ("b", 1)]);
        assert!(close(
            SharePlan::new(&p, &small, 1, 3).factor(&db("a")),
            4.0
        ));
        assert_eq!(SharePlan::new(&p, &small, 1, 4).factor(&db("a")), 1.0);
    }
}
