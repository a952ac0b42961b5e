//! The job server's rotation arithmetic (CouchDB 4.x's couch_replicator_job_server.erl), kept free of actors and clocks so every
//! edge is unit-tested: how many idle acceptors to keep, which running jobs to trim, how
//! many running jobs to stop for the jobs due, and how long a stopped job waits.
//!
//! A node runs at most `max_jobs` jobs: while jobs are due, each cycle stops up to
//! `max_churn` continuous jobs (the highest fair-share rank first, then the longest running)
//! and starts due jobs in the slots they free. One-shot jobs are never
//! trimmed (they would lose their snapshot semantics), nor jobs younger than `min_run_time`.

use std::time::Duration;

/// One running job as the job server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob<Id> {
    /// The job's id.
    pub id: Id,
    /// Whether the replication is continuous; only continuous jobs are ever trimmed.
    pub continuous: bool,
    /// How long it has been running.
    pub ran_for: Duration,
    /// Its fair-share rank, higher stopped first (the job server puts its database's
    /// `share::stop_rank` there, so a database far over its share goes first).
    pub priority: u64,
}

/// Idle acceptors to add so that up to `max_acceptors` wait while there is room below
/// `max_jobs`.
pub fn acceptors_to_add(
    acceptors: usize,
    workers: usize,
    max_jobs: usize,
    max_acceptors: usize,
) -> usize {
    let room = max_jobs.saturating_sub(acceptors + workers);
    max_acceptors.saturating_sub(acceptors).min(room)
}

/// The jobs to stop this cycle: the continuous jobs that ran at least `min_run_time` with the
/// highest fair-share rank, the longest-running first among equals (CouchDB 3.2+), at most
/// `workers - max_jobs` of them. Returns the victims; the caller adds
/// the excess (not the victim count) to its churn, as CouchDB does.
pub fn trim_victims<Id: Clone>(
    running: &[RunningJob<Id>],
    max_jobs: usize,
    min_run_time: Duration,
) -> Vec<Id> {
    let excess = running.len().saturating_sub(max_jobs);
    if excess == 0 {
        return Vec::new();
    }
    let mut candidates: Vec<&RunningJob<Id>> = running
        .iter()
        .filter(|j| j.continuous && j.ran_for >= min_run_time)
        .collect();
    let order = |j: &&RunningJob<Id>| std::cmp::Reverse((j.priority, j.ran_for));
    // Usually one victim among hundreds (each start trims one): select, then sort the few.
    if excess < candidates.len() {
        candidates.select_nth_unstable_by_key(excess, order);
        candidates.truncate(excess);
    }
    candidates.sort_by_key(order);
    candidates.into_iter().map(|j| j.id.clone()).collect()
}

/// How many running jobs to stop this cycle so that jobs due now start in their slots:
/// the due jobs beyond the `free` slots (`max_jobs` less the running jobs, stopping ones
/// included), at most the churn left this cycle and the `rotatable` jobs (those
/// [`trim_victims`] may stop). The job server stops them first and starts their successors
/// as the stops end, as CouchDB 3.x does, so a node never runs more than `max_jobs`.
///
/// Before, extra acceptors started jobs over `max_jobs` and each start trimmed one: 70 ran
/// with `max_jobs` 50 and `max_churn` 20 (issue 44) while the trimmed jobs checkpointed.
pub fn rotation_stops(
    free: usize,
    due: usize,
    max_churn: usize,
    churn: usize,
    rotatable: usize,
) -> usize {
    max_churn
        .saturating_sub(churn)
        .min(rotatable)
        .min(due.saturating_sub(free))
}

/// The jobs the cluster starts per cycle at most: the queue is shared, and each of its
/// `members` replication nodes starts up to `max_churn` of it (1 member when alone).
pub fn cluster_churn(max_churn: usize, members: usize) -> usize {
    max_churn.saturating_mul(members.max(1))
}

/// When a job trimmed now is due to run again, with `pending` jobs waiting and `max_churn`
/// started per cycle of `cycle` (the measured time between ticks): `pending / max_churn`
/// cycles on, at least one and at most `max_cycles`. Not rounded to whole cycles: the
/// number waiting moves by a few jobs from tick to tick, and rounding would leave some
/// ticks with almost nothing to start (docs/decisions/2026-11-26-rotation-turn-timing.md).
pub fn turn_due(pending: usize, max_churn: usize, cycle: Duration, max_cycles: usize) -> Duration {
    let cycles = pending as f64 / max_churn.max(1) as f64;
    cycle.mul_f64(cycles.clamp(1.0, max_cycles.max(1) as f64))
}

/// How much earlier than its turn a trimmed job becomes eligible, as a part of the turn's
/// delay (at least one cycle; see [`eligible_after`]).
pub const EARLY_PART: f64 = 0.125;

/// How long a job trimmed now waits before it is eligible again: its turn, `due` scaled by
/// its database's fair-share `factor`, less a margin, and at least half a cycle. The
/// acceptors take the earliest scheduled first, so a job eligible early does not jump the
/// jobs ahead of it: it is only there in time. The margin is the same for every job (the
/// order of the turns is kept) and covers how far the rotation's real length strays from
/// the estimate (`due` counts cycles of the measured average, and the real ones vary by
/// the interval's jitter): one cycle, or an eighth of the delay when that is longer. A job
/// eligible too late leaves its tick short of jobs to start, and the running jobs that then
/// stay on run a double turn (docs/decisions/2026-11-26-rotation-turn-timing.md).
pub fn eligible_after(due: Duration, cycle: Duration, factor: f64) -> Duration {
    let factor = if factor.is_finite() {
        factor.max(0.0)
    } else {
        1.0
    };
    let margin = cycle.max(due.mul_f64(EARLY_PART));
    due.mul_f64(factor).saturating_sub(margin).max(cycle / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u32, continuous: bool, secs: u64) -> RunningJob<u32> {
        RunningJob {
            id,
            continuous,
            ran_for: Duration::from_secs(secs),
            priority: 0,
        }
    }

    #[test]
    fn acceptors_fill_up_to_the_maximum_while_there_is_room() {
        assert_eq!(acceptors_to_add(0, 0, 500, 2), 2);
        assert_eq!(acceptors_to_add(1, 10, 500, 2), 1);
        assert_eq!(acceptors_to_add(2, 10, 500, 2), 0);
        assert_eq!(acceptors_to_add(0, 499, 500, 2), 1, "only one slot left");
        assert_eq!(acceptors_to_add(0, 500, 500, 2), 0);
        assert_eq!(acceptors_to_add(0, 520, 500, 2), 0, "over max_jobs");
    }

    #[test]
    fn trim_takes_the_oldest_continuous_jobs_only() {
        let running = vec![
            job(1, true, 300),
            job(2, false, 900), // one-shot: never trimmed
            job(3, true, 30),   // too young
            job(4, true, 600),
            job(5, true, 120),
        ];
        assert_eq!(
            trim_victims(&running, 2, Duration::from_secs(60)),
            vec![4, 1, 5]
        );
        assert_eq!(trim_victims(&running, 4, Duration::from_secs(60)), vec![4]);
        assert!(trim_victims(&running, 5, Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn trim_takes_the_highest_priority_first() {
        let mut running = vec![job(1, true, 600), job(2, true, 100), job(3, true, 300)];
        running[1].priority = 50;
        running[2].priority = 50;
        assert_eq!(
            trim_victims(&running, 1, Duration::from_secs(60)),
            vec![3, 2],
            "the over-served database first, the longest running among equals"
        );
    }

    #[test]
    fn trim_may_stop_fewer_than_the_excess() {
        let running = vec![job(1, false, 900), job(2, true, 10), job(3, false, 5)];
        assert!(trim_victims(&running, 0, Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn a_trimmed_job_is_eligible_a_margin_before_its_turn() {
        let c = Duration::from_secs(6);
        // 9,500 waiting, 500 started per cycle: due 19 cycles on, eligible an eighth
        // earlier (2.375 cycles).
        assert_eq!(turn_due(9_500, 500, c, 40), c * 19);
        assert_eq!(eligible_after(c * 19, c, 1.0), c.mul_f64(16.625));
        // One job more moves the turn by a five-hundredth of a cycle, not a whole cycle.
        assert_eq!(turn_due(9_501, 500, c, 40), c.mul_f64(19.002));
        // 1,500 waiting: due at the third tick, eligible a cycle early.
        assert_eq!(turn_due(1_500, 500, c, 40), c * 3);
        assert_eq!(eligible_after(c * 3, c, 1.0), c * 2);
        // Due at the next tick (or nothing waits): half a cycle, never back at once.
        assert_eq!(turn_due(0, 500, c, 40), c);
        assert_eq!(turn_due(200, 500, c, 40), c);
        assert_eq!(eligible_after(c, c, 1.0), c / 2);
        // A huge queue is capped; a zero churn counts as one.
        assert_eq!(turn_due(1_000_000, 500, c, 40), c * 40);
        assert_eq!(turn_due(3, 0, c, 40), c * 3);
    }

    #[test]
    fn in_a_cluster_the_turn_comes_at_the_clusters_pace() {
        let c = Duration::from_secs(5);
        // 1,500 waiting, 100 started per cycle by each node: alone 15 cycles, three
        // members start 300 per cycle, so 5.
        assert_eq!(turn_due(1_500, cluster_churn(100, 1), c, 40), c * 15);
        assert_eq!(turn_due(1_500, cluster_churn(100, 3), c, 40), c * 5);
        assert_eq!(cluster_churn(100, 0), 100);
        // The fair-share factor scales the turn; the margin is the plain turn's, so the
        // order of the turns is kept.
        assert_eq!(eligible_after(c * 3, c, 2.0), c * 5);
        assert_eq!(eligible_after(c * 3, c, 0.25), c / 2);
        assert_eq!(eligible_after(c * 3, c, f64::NAN), c * 2);
        assert_eq!(
            eligible_after(c * 19, c, 2.0) - eligible_after(c * 19, c, 1.0),
            c * 19,
            "a database at twice the delay waits one rotation more"
        );
    }

    #[test]
    fn rotation_stops_are_bounded_by_churn_due_jobs_and_what_can_be_trimmed() {
        // 100 running of max 100, 50 due, churn 20 unused, all rotatable: 20 stops.
        assert_eq!(rotation_stops(0, 50, 20, 0, 100), 20);
        // Already churned 15 this cycle: 5 left.
        assert_eq!(rotation_stops(0, 50, 20, 15, 100), 5);
        // 3 due: 3 stops; 3 due and 2 free slots: 1.
        assert_eq!(rotation_stops(0, 3, 20, 0, 100), 3);
        assert_eq!(rotation_stops(2, 3, 20, 0, 100), 1);
        // Every running job younger than min_run_time: nothing to stop.
        assert_eq!(rotation_stops(0, 50, 20, 0, 0), 0);
        // Nothing due, or as many free slots as due jobs: nothing to stop.
        assert_eq!(rotation_stops(0, 0, 20, 0, 100), 0);
        assert_eq!(rotation_stops(10, 10, 20, 0, 100), 0);
    }
}
