//! The job server's part in a cluster (`super::super::balance`): reading this node's part
//! of the cluster's jobs, retiring acceptors and handing jobs back beyond it, reporting this
//! node's load row, re-reading the picture when it was taken while jobs moved, and watching
//! the queue so a node held below `max_jobs` takes new jobs at once.

use std::time::Duration;

use ractor::ActorRef;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{JobServer, JobServerMsg, JobServerState};
use crate::jobs::JobsError;
use crate::replicator::cluster::membership::Membership;
use crate::replicator::job::view::REP_JOBS;
use crate::replicator::scheduler::balance;
use crate::replicator::scheduler::job_acceptor::Retirement;

/// How long a node must be seen over its part, at two balance reads, before it hands jobs
/// back. The picture is racy while jobs move: a job handed back is counted both as pending
/// and in its old node's load row until that row is rewritten, a job just taken in neither.
/// Acting on one read, nodes handed back jobs that no node then had room for, and took them
/// back a tick later: a target waited 5-7 s in a rolling restart of 30 jobs.
const HAND_BACK_AFTER: Duration = Duration::from_secs(1);

/// Acceptors kept while jobs are due in a cluster. Each takes about one job in 100-400 ms
/// (the accept, the node's stamp and the actor's start are three store transactions), so
/// `max_acceptors` (2) took 2.5 s to take the 15 jobs a stopping node handed over, and a
/// job pending that long is a pause in a rolling restart.
pub(super) const HANDOVER_ACCEPTORS: usize = 8;

/// How soon the balance reads the cluster again when its picture looked taken while jobs
/// moved ([`balance::ClusterLoad::due`], or a job accepted over this node's part). Long
/// enough for a node that just took jobs to report them (a few hundred ms in the drill),
/// short against the interval the next tick would have made them wait: a job handed over
/// by a dead node's neighbour waited 6 s for it, taken by no node whose part had room.
const RECHECK_AFTER: Duration = Duration::from_millis(500);

impl JobServer {
    /// This node's membership handle, for its load row and the cluster's picture.
    fn membership(&self) -> Membership {
        Membership::new(
            self.ctx.jobs().clone(),
            self.ctx.prefix(),
            self.ctx.node(),
            self.ctx.settings().node_timeout(),
        )
        .with_sightings(self.ctx.sightings().clone())
    }

    /// Writes this node's load row now (a blind write) when it runs in a cluster: the other
    /// nodes' balance counts a job it just took as running here, not as gone. Reported only
    /// at this node's own balance before, a node that had just taken its part still showed
    /// none, so a neighbour counted 10 jobs too few and handed back more than the newcomer
    /// had room for; they waited for the next tick (4.8 s in the failover drill).
    pub(super) fn report_load(&self, st: &JobServerState) {
        if st.members < 2 {
            return;
        }
        // Jobs told to leave count here until their actors exit. Not pending yet, they were
        // counted nowhere: with two nodes handing 5 jobs each back to a newcomer, the
        // members saw 21 of 30 jobs, and a handed-back job waited 4.7 s for a node with room.
        let (membership, running) = (self.membership(), st.rot.workers.len());
        tokio::spawn(async move {
            let db = membership.jobs().db().clone();
            let written = db
                .run(|tx| {
                    let m = &membership;
                    async move {
                        m.report_load_tx(&tx, running);
                        Ok::<_, crate::jobs::JobsError>(())
                    }
                })
                .await;
            if let Err(e) = written {
                tracing::debug!(error = %e, "could not report this node's load");
            }
        });
    }

    /// Reads the cluster's picture again after [`RECHECK_AFTER`], unless a re-read is
    /// already on its way.
    pub(super) fn recheck_soon(st: &mut JobServerState) {
        if st.recheck.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let me = st.me.clone();
        st.recheck = Some(tokio::spawn(async move {
            tokio::time::sleep(RECHECK_AFTER).await;
            let _ = me.send_message(JobServerMsg::Rebalance);
        }));
    }

    /// Reads this node's part of the cluster's jobs (`balance`) into `st.limit`,
    /// retires the acceptors beyond it and hands the running jobs beyond it back to the
    /// queue. A job is moved at most once an interval (or `min_run_time`, if shorter), so
    /// views read at slightly different times do not bounce it. Keeps the old limit when
    /// the store cannot be read.
    pub(super) async fn balance(&self, st: &mut JobServerState) {
        let s = self.ctx.settings();
        let membership = self.membership();
        // This node's jobs as its load row counts them (see `report_load`).
        let holding = st.rot.workers.len();
        let load = match balance::read_load(&self.ctx, &membership, holding).await {
            Ok(load) => load,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the cluster's load");
                return;
            }
        };
        st.members = load.running.len().max(1);
        st.limit = balance::node_limit(self.ctx.node().as_str(), holding, &load, s.max_jobs);
        tracing::debug!(
            limit = st.limit,
            running = st.rot.live(),
            total = load.total,
            members = st.members,
            due = load.due,
            "this node's part of the cluster's jobs"
        );
        st.handover = load.due;
        let room = st.limit.saturating_sub(st.rot.live());
        let keep = room.min(Self::acceptors_wanted(st, s));
        let surplus: Vec<u64> = st.acceptors.keys().skip(keep).copied().collect();
        for id in surplus {
            if let Some(a) = st.acceptors.remove(&id) {
                a.retire.send_replace(Retirement::Retired);
                st.retired.push(a.task);
            }
        }
        st.retired.retain(|t| !t.is_finished());
        // While jobs wait and this node's part is below `max_jobs`, the picture is read
        // again soon whether or not this node has room now: a part taken from a stale picture
        // fills, and the jobs still due are room the next read shows (a rolling restart's
        // handed-back job waited 1.7 s for a node's next read with its room full).
        if load.due && st.limit < s.max_jobs {
            Self::recheck_soon(st);
        }
        if st.limit >= s.max_jobs || st.rot.live() <= st.limit {
            st.over_since = None;
            return;
        }
        match st.over_since {
            None => {
                st.over_since = Some(Instant::now());
                let me = st.me.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(HAND_BACK_AFTER).await;
                    let _ = me.send_message(JobServerMsg::Rebalance);
                });
            }
            Some(since) if since.elapsed() >= HAND_BACK_AFTER => {
                st.over_since = None;
                st.churn += st.rot.hand_back(st.limit, s.min_run_time.min(s.interval));
            }
            Some(_) => {}
        }
    }

    /// A task that sends `Rebalance` whenever a job is enqueued, at most every quarter
    /// interval (between 0.2 and 2 s): a node held below `max_jobs` then takes its part of
    /// new jobs at once rather than at its next tick.
    pub(super) fn watch_queue(&self, myself: &ActorRef<JobServerMsg>) -> JoinHandle<()> {
        let (jobs, me) = (self.ctx.jobs().clone(), myself.clone());
        let pause = (self.ctx.settings().interval / 4)
            .clamp(Duration::from_millis(200), Duration::from_secs(2));
        tokio::spawn(async move {
            loop {
                let armed = jobs
                    .db()
                    .run(|tx| {
                        let jobs = jobs.clone();
                        async move { Ok::<_, JobsError>(jobs.watch_pending_tx(&tx, REP_JOBS)) }
                    })
                    .await;
                let fired = match armed {
                    Ok(watch) => watch.await.is_ok(),
                    Err(_) => false,
                };
                if fired && me.send_message(JobServerMsg::Rebalance).is_err() {
                    return;
                }
                tokio::time::sleep(if fired { pause } else { Duration::from_secs(1) }).await;
            }
        })
    }
}
