//! Which transient jobs each user holds, so that `[replicator] max_jobs_per_user` is checked
//! without reading every job: `(prefix, 57, user, job_id) -> ""`, written in the transaction
//! that adds a user's transient job. Rows are never removed when a job ends; counting a
//! user's unfinished jobs reads that user's rows only, and clears those whose job finished or
//! is gone. A user's rows therefore stay few: past the limit nothing more is added.

use crate::jobs::JobsError;
use crate::replicator::node::context::{NodeCtx, USER_JOBS};
use crate::store::tuple::{self, Bytes};
use crate::store::{RangeOptions, Tx};

use super::id::JobId;
use super::view::{JobView, REP_JOBS};

fn user_range(ctx: &NodeCtx, user: &str) -> (Vec<u8>, Vec<u8>) {
    let mut begin = ctx.prefix().to_vec();
    tuple::pack_into(&(USER_JOBS, Bytes::from(user.as_bytes())), &mut begin);
    let mut end = begin.clone();
    end.push(0xFF);
    (begin, end)
}

/// Records, in the transaction adding it, that `user` holds the transient job `job_id`.
pub(crate) fn record_tx(ctx: &NodeCtx, tx: &Tx, user: &str, job_id: &JobId) {
    let (mut key, _) = user_range(ctx, user);
    tuple::pack_into(&(Bytes::from(job_id.as_str().as_bytes()),), &mut key);
    tx.set(&key, b"");
}

/// How many unfinished transient jobs `user` holds; clears the rows of the others.
pub(crate) async fn unfinished_of(ctx: &NodeCtx, user: &str) -> Result<usize, JobsError> {
    let jobs = ctx.jobs();
    let (begin, end) = user_range(ctx, user);
    jobs.db()
        .run(|tx| {
            let (begin, end) = (begin.clone(), end.clone());
            async move {
                let rows = tx.get_range(&begin, &end, RangeOptions::all()).await?;
                let mut held = 0;
                for kv in rows {
                    let Some(id) = kv
                        .key
                        .strip_prefix(begin.as_slice())
                        .and_then(|rest| tuple::unpack::<(Bytes,)>(rest).ok())
                        .and_then(|(id,)| String::from_utf8(id.into_owned()).ok())
                    else {
                        tx.clear(&kv.key);
                        continue;
                    };
                    let job_id = JobId::from(id);
                    let unfinished =
                        match jobs.get_job_data_tx(&tx, REP_JOBS, job_id.as_str()).await {
                            Ok(data) => JobView::from_data(&job_id, &data).is_ok_and(|v| {
                                v.user.as_deref() == Some(user) && !v.state.is_terminal()
                            }),
                            Err(JobsError::NotFound) => false,
                            Err(e) => return Err(e),
                        };
                    if unfinished {
                        held += 1;
                    } else {
                        tx.clear(&kv.key);
                    }
                }
                Ok(held)
            }
        })
        .await
}
