//! balance: how many jobs this node may run so that the cluster's jobs spread evenly over
//! the nodes that run replications, whichever node they were submitted to.
//!
//! couch_jobs lets any node's acceptor take any pending job, so left alone the node whose
//! acceptors happen to wait first takes most of them (3 nodes once ran 2/0/4). Every node
//! reads the same picture in one snapshot ([`read_load`]): the live replication members
//! (membership rows), the jobs each of them runs (as it last reported them in its load row,
//! one row per node: counting the node each running job's data names read every running
//! job's row at every tick on every node) and the pending jobs; [`node_limit`] then gives
//! each member `total / members` jobs, the
//! remainder going to the members that run the most already (so a balanced cluster moves
//! nothing), never more than `max_jobs`. The job server keeps acceptors only up to that
//! limit and hands jobs over it back to the queue once two reads a second apart agree it is
//! over (one racy read made nodes hand back jobs nobody had room for), where a node under
//! its limit takes them. Each node rewrites its load row whenever it starts or ends a job. The picture is read at every tick and, on a node held below `max_jobs` by
//! it, when a job is enqueued; views taken at slightly different times may disagree for a
//! tick, after which they agree again. With one replication member, or more jobs than all
//! members' `max_jobs`, the limit is `max_jobs` and nothing changes (the rotation then
//! shares the slots over time).

use std::collections::BTreeMap;

use crate::jobs::JobsError;

use crate::replicator::cluster::membership::Membership;
use crate::replicator::job::view::REP_JOBS;
use crate::replicator::node::context::NodeCtx;
use crate::replicator::node::name::NodeName;

/// Pending jobs counted for the picture.
const PENDING_LIMIT: usize = 100_000;

/// The cluster as one snapshot shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterLoad {
    /// Live replication members and the jobs each runs, by name.
    pub running: BTreeMap<NodeName, usize>,
    /// Every job that is pending or running (on any node, or not yet stamped with one),
    /// those a node that left still runs included.
    pub total: usize,
    /// Some pending job is due now (scheduled no later than this node's clock). With every
    /// member at its part, such a job shows a picture taken while jobs moved (a job just
    /// taken is counted neither as pending nor in its node's load row until that node
    /// reports it), so the job server reads it again shortly.
    pub due: bool,
}

/// Reads the picture at snapshot isolation (it conflicts with nothing). With fewer than
/// two replication members only the members are read: a single node needs no more. With
/// more, this node's load row is set to `my_running` when it says otherwise (a blind write
/// in the same transaction).
pub(crate) async fn read_load(
    ctx: &NodeCtx,
    membership: &Membership,
    my_running: usize,
) -> Result<ClusterLoad, JobsError> {
    let jobs = ctx.jobs();
    jobs.db()
        .run(|tx| async move {
            let members = membership.workers_tx(&tx).await?;
            let mut load = ClusterLoad {
                running: members.into_iter().map(|m| (m, 0)).collect(),
                total: 0,
                due: false,
            };
            if load.running.len() < 2 {
                return Ok(load);
            }
            let pending = jobs
                .pending_count_tx(&tx, REP_JOBS, None, Some(PENDING_LIMIT))
                .await?;
            // The pending keys are ordered by scheduled time: one key read says whether
            // any is due.
            load.due = pending > 0
                && jobs
                    .pending_count_tx(&tx, REP_JOBS, Some(ctx.now_secs()), Some(1))
                    .await?
                    > 0;
            let loads = membership.loads_tx(&tx).await?;
            if loads.get(ctx.node()) != Some(&my_running) {
                membership.report_load_tx(&tx, my_running);
            }
            for (node, running) in load.running.iter_mut() {
                *running = if node == ctx.node() {
                    my_running
                } else {
                    loads.get(node).copied().unwrap_or(0)
                };
            }
            // A node that left but still hands its jobs back keeps its load row, rewritten
            // as each of its jobs is handed back (its job server reports every job end while
            // job_sup stops them): the row counts the jobs it still runs, the pending count
            // those it handed back. Their sum, then. The larger of the two, when the row
            // stayed at its first count, undercounted by up to half once it was rewritten:
            // the members saw 25-28 of 30 jobs, left jobs pending that none had room for,
            // and a target waited 8.6 s in a rolling restart until the stopped node was back
            // to take them. A job is counted twice only between its hand-back and its
            // node's next report, milliseconds.
            let leaving: usize = loads
                .iter()
                .filter(|(node, _)| !load.running.contains_key(*node))
                .map(|(_, n)| n)
                .sum();
            load.total = pending + leaving + load.running.values().sum::<usize>();
            Ok(load)
        })
        .await
}

/// The most jobs `me` may run: its even part of `load.total` over the members (`me`
/// counted with `my_running`, its own exact count, whether or not the snapshot listed it),
/// one more for the `total % members` members that run the most (then by name), at most
/// `max_jobs`; `max_jobs` when `me` is the only member.
pub fn node_limit(me: &str, my_running: usize, load: &ClusterLoad, max_jobs: usize) -> usize {
    let mut members: Vec<(&str, usize)> = load
        .running
        .iter()
        .filter(|(n, _)| n.as_str() != me)
        .map(|(n, r)| (n.as_str(), *r))
        .collect();
    members.push((me, my_running));
    let m = members.len();
    if m < 2 {
        return max_jobs;
    }
    let (base, extra) = (load.total / m, load.total % m);
    members.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let place = members.iter().position(|(n, _)| *n == me).unwrap_or(m);
    (base + usize::from(place < extra)).min(max_jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(running: &[(&str, usize)], total: usize) -> ClusterLoad {
        ClusterLoad {
            running: running
                .iter()
                .map(|(n, r)| (NodeName::from(*n), *r))
                .collect(),
            total,
            due: false,
        }
    }

    fn limits(running: &[(&str, usize)], total: usize, max_jobs: usize) -> Vec<usize> {
        let l = load(running, total);
        running
            .iter()
            .map(|(n, r)| node_limit(n, *r, &l, max_jobs))
            .collect()
    }

    #[test]
    fn a_single_node_keeps_max_jobs() {
        assert_eq!(limits(&[("a", 3)], 10, 500), vec![500]);
        assert_eq!(node_limit("a", 0, &ClusterLoad::default(), 7), 7);
    }

    #[test]
    fn parts_add_up_to_the_total_and_differ_by_one_at_most() {
        for total in 0..40 {
            let l = limits(&[("a", 0), ("b", 5), ("c", 1)], total, 500);
            assert_eq!(l.iter().sum::<usize>(), total, "{total}: {l:?}");
            assert!(l.iter().max().unwrap() - l.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn the_remainder_goes_to_the_busiest_so_nothing_moves_when_balanced() {
        // 3/3/4 of 10 stays as it is.
        assert_eq!(
            limits(&[("a", 3), ("b", 4), ("c", 3)], 10, 500),
            vec![3, 4, 3]
        );
        // A node joins 2/2/2: the first by name keeps 2, the others give one each.
        assert_eq!(
            limits(&[("a", 2), ("b", 2), ("c", 2), ("d", 0)], 6, 500),
            vec![2, 2, 1, 1]
        );
    }

    #[test]
    fn more_jobs_than_slots_gives_max_jobs_everywhere() {
        assert_eq!(
            limits(&[("a", 500), ("b", 500), ("c", 0)], 3000, 500),
            vec![500, 500, 500]
        );
    }

    #[test]
    fn a_node_missing_from_the_snapshot_counts_itself() {
        let l = load(&[("a", 4), ("b", 4)], 8);
        // c just joined and is not listed yet: 8 over 3.
        assert_eq!(node_limit("c", 0, &l, 500), 2);
    }
}
