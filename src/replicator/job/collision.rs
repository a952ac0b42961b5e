//! The collision index (CouchDB 4.x's couch_replicator_jobs.erl): `(LayerPrefix, 54, RepId) -> JobId` records which job
//! owns a replication id, so the same replication never runs twice in a cluster.
//!
//! [`claim_tx`] runs inside the job's own start transaction and applies CouchDB's
//! `check_ownership`: the other owner pending/running and transient → this job is
//! rescheduled `crashing`; pending/running and persistent → this job `failed`; the other
//! owner in any other state (or gone) → usurp the mapping. One divergence, asked for by the
//! issue: a *transient* job whose id is owned by a persistent one goes `crashing` too (the
//! archived code fails it), see `job/actor.rs`.

use crate::jobs::{JobsError, JobsResult};
use crate::replication::RepId;
use crate::store::Tx;
use crate::store::tuple::Bytes;

use super::id::JobId;
use super::record::RepJobRecord;
use super::view::REP_JOBS;
use crate::replicator::node::context::{NodeCtx, REP_IDS};

/// The outcome of [`claim_tx`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This job owns the replication id now.
    Owned,
    /// A pending/running transient job owns it: this job goes `crashing`.
    DuplicateTransient(JobId),
    /// A pending/running persistent job owns it: this job goes `failed`.
    DuplicatePersistent {
        /// The owner's job id.
        job_id: JobId,
        /// Its `_replicator` database.
        db_name: String,
        /// Its document id.
        doc_id: String,
    },
}

fn key(ctx: &NodeCtx, rep_id: &RepId) -> Vec<u8> {
    ctx.key(&(REP_IDS, Bytes::from(rep_id.full().into_bytes())))
}

/// The job owning `rep_id`, if any.
pub async fn owner(ctx: &NodeCtx, rep_id: &RepId) -> JobsResult<Option<JobId>> {
    let k = key(ctx, rep_id);
    ctx.jobs()
        .db()
        .run(|tx| {
            let k = k.clone();
            async move { owner_tx(&tx, &k).await }
        })
        .await
}

async fn owner_tx(tx: &Tx, k: &[u8]) -> JobsResult<Option<JobId>> {
    match tx.get(k, false).await? {
        None => Ok(None),
        Some(v) => String::from_utf8(v)
            .map(|s| Some(JobId::from(s)))
            .map_err(|_| JobsError::Encoding("collision index value is not UTF-8".into())),
    }
}

/// Claims `rep_id` for `job_id` inside `tx` (see the module docs for the rules).
pub async fn claim_tx(ctx: &NodeCtx, tx: &Tx, rep_id: &RepId, job_id: &JobId) -> JobsResult<Claim> {
    let k = key(ctx, rep_id);
    if let Some(other) = owner_tx(tx, &k).await?.filter(|o| o != job_id) {
        match ctx
            .jobs()
            .get_job_data_tx(tx, REP_JOBS, other.as_str())
            .await
        {
            Ok(d) => {
                let r = RepJobRecord::from_data(&d)?;
                if r.state.is_active() {
                    return Ok(match (r.origin.db_name, r.origin.doc_id) {
                        (Some(db_name), Some(doc_id)) => Claim::DuplicatePersistent {
                            job_id: other,
                            db_name,
                            doc_id,
                        },
                        _ => Claim::DuplicateTransient(other),
                    });
                }
            }
            // An orphan mapping: take it over.
            Err(JobsError::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    tx.set(&k, job_id.as_str().as_bytes());
    Ok(Claim::Owned)
}

/// Clears the mapping of `rep_id` if it points to `job_id`.
pub(crate) async fn release_tx(
    ctx: &NodeCtx,
    tx: &Tx,
    rep_id: &RepId,
    job_id: &JobId,
) -> JobsResult<()> {
    let k = key(ctx, rep_id);
    if owner_tx(tx, &k).await?.as_ref() == Some(job_id) {
        tx.clear(&k);
    }
    Ok(())
}
