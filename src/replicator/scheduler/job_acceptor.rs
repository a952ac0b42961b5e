//! The job server's acceptor tasks: each waits in couch_jobs' `accept` for a pending job
//! scheduled no later than now, asks job_sup to start a job actor for it and tells the job
//! server ([`JobServerMsg::Accepted`]), or ends when told to retire (this node's part of
//! the cluster's jobs shrank, see [`super::balance`]) between two waits.

use std::time::Duration;

use ractor::ActorRef;
use rand::Rng;

use crate::jobs::{AcceptOpts, JobsError};

use super::job_server::JobServerMsg;
use super::job_sup::JobSupRef;
use super::share::ShareKey;
use crate::replicator::job::REP_JOBS;
use crate::replicator::job::actor::JobArgs;
use crate::replicator::job::id::JobId;
use crate::replicator::job::record::RepJobRecord;
use crate::replicator::node::context::NodeCtx;

/// How long one accept call waits before the acceptor sleeps its jitter.
const ACCEPT_WAIT: Duration = Duration::from_secs(5);
/// The earliest eligible jobs an acceptor picks among: few enough that a job eligible early
/// does not jump the jobs scheduled before it, enough (about a second of trims at 10,000
/// jobs) that one database's jobs do not start in id order together
/// (docs/decisions/2026-11-26-accept-candidates.md); and of those, the ones scheduled
/// earliest, so a job that never ran is not diluted among trimmed jobs made eligible early
/// (docs/decisions/2026-11-27-accept-earliest-first.md).
const ACCEPT_CANDIDATES: usize = 64;
/// How long an acceptor keeps trying to hand an accepted job to a restarting job_sup.
const HANDOFF_ATTEMPTS: u32 = 50;
/// The most an acceptor pauses after a wait that found nothing, before it waits again. Up
/// to `startup_jitter` (5 s) before: a job handed over by a node stopping (a rolling
/// restart) could find every acceptor of the other nodes in that pause and wait 5 s.
const REWAIT_JITTER: Duration = Duration::from_millis(200);

/// What the job server asks of an acceptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retirement {
    /// Take a job.
    Working,
    /// End: this node's part shrank. A job whose take was in flight still runs here.
    Retired,
    /// End: the node is stopping. A job whose take was in flight goes back to the queue.
    Stopping,
}

/// One acceptor: waits for a pending job scheduled no later than now, hands it to job_sup.
pub(super) async fn acceptor(
    ctx: NodeCtx,
    job_sup: JobSupRef,
    server: ActorRef<JobServerMsg>,
    id: u64,
    retire: tokio::sync::watch::Receiver<Retirement>,
) {
    let jitter = (ctx.settings().startup_jitter.min(REWAIT_JITTER).as_millis() as u64).max(1);
    loop {
        // Retired, or the job server is gone (the flag's sender dropped unsent).
        if *retire.borrow() != Retirement::Working || retire.has_changed().is_err() {
            let _ = server.send_message(JobServerMsg::AcceptorEnded(id));
            return;
        }
        let opts = AcceptOpts::default()
            .max_sched_time(ctx.now_secs())
            .timeout(ACCEPT_WAIT)
            .candidates(ACCEPT_CANDIDATES)
            .earliest_first()
            // The node is stamped by the take itself: were this node to die before the
            // job actor claims the replication (endpoint requests come first), the
            // neighbour that removes it re-enqueues this job too. Before the first stamp,
            // it stayed locked until its activity timeout (the failover drill saw it
            // pending for over 90 s); before it joined the take, it cost a second
            // transaction per start.
            .set_field("node", ctx.node().as_str().into());
        // A retirement ends the wait at once: an acceptor that waited on took the next job
        // enqueued only to hand it back, and in a rolling restart a job bounced so twice
        // before a node with room took it (3.1 s pending).
        let mut retired = retire.clone();
        let until = async move {
            let _ = retired.wait_for(|r| *r != Retirement::Working).await;
        };
        // Retired while its take was in flight: the job runs here all the same (one over
        // this node's part at most, which the balance confirms before handing anything
        // back). Handed straight back, it bounced between nodes reading stale pictures.
        match ctx.jobs().accept_until(REP_JOBS, opts, until).await {
            Ok((job, _)) if *retire.borrow() == Retirement::Stopping => {
                // The node is stopping: the job goes back to the queue now, for a node
                // that stays.
                let (jobs, job_id) = (ctx.jobs(), job.id.as_str());
                let requeued = jobs
                    .db()
                    .run(|tx| async move { jobs.requeue_running_tx(&tx, REP_JOBS, job_id).await })
                    .await;
                if let Err(e) = requeued {
                    tracing::warn!(error = %e, "could not hand back a job a retired acceptor took");
                }
                let _ = server.send_message(JobServerMsg::AcceptorEnded(id));
                return;
            }
            Ok((job, data)) => {
                tracing::debug!(job = %job.id, acceptor = id, "accepted");
                let record = match RepJobRecord::from_data(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        // Unreadable data cannot be run: finish it so it does not come back.
                        tracing::warn!(job = %job.id, error = %e, "unreadable job data");
                        let _ = ctx.jobs().finish(&job, None).await;
                        continue;
                    }
                };
                let continuous = record.continuous;
                let group = match &record.origin.db_name {
                    Some(db) => ShareKey::Db(db.clone()),
                    None => ShareKey::Transient,
                };
                for _ in 0..HANDOFF_ATTEMPTS {
                    let args = JobArgs {
                        ctx: ctx.clone(),
                        job: job.clone(),
                        record: record.clone(),
                    };
                    if let Ok(actor) = job_sup.start_child(job.id.clone(), args).await {
                        tracing::debug!(job = %job.id, acceptor = id, "accepted and started");
                        let _ = server.send_message(JobServerMsg::Accepted {
                            acceptor: id,
                            actor,
                            job_id: JobId::from(&job.id),
                            continuous,
                            group: group.clone(),
                        });
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // The lock stays with nobody: the activity monitor re-enqueues the job.
                tracing::warn!(job = %job.id, "no job_sup to start an accepted job");
                let _ = server.send_message(JobServerMsg::AcceptorEnded(id));
                return;
            }
            Err(JobsError::NotFound) => {
                let ms = rand::rng().random_range(1..=jitter);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
