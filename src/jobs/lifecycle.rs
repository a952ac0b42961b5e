//! Job lifecycle operations inside a caller's transaction (CouchDB's couch_jobs.erl API): add, resubmit,
//! remove, update, finish, reads of one job, type timeouts, and the small type-wide reads.
//!
//! Every function takes the key layout and a [`Tx`]; the [`Jobs`](super::Jobs) handle wraps
//! them in [`Db::run`](crate::store::Db::run). Callers fence their own writes by calling
//! `update`/`finish` in the same transaction.

use crate::store::tuple::Versionstamp;
use crate::store::{RangeOptions, Tx};

use super::Job;
use super::error::{JobsError, JobsResult};
use super::job_data::{JobData, JobRow, JobState, Seq, decode_activity, encode_activity};
use super::keys::{Keys, next_user_version};

/// Reads and decodes a DATA row.
pub async fn get_row(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    id: &str,
    snapshot: bool,
) -> JobsResult<Option<JobRow>> {
    match tx.get(&keys.data(ty, id), snapshot).await? {
        Some(bytes) => Ok(Some(JobRow::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// Writes a DATA row (versionstamped when its `Seq` is incomplete).
pub(crate) fn write_row(keys: &Keys, tx: &Tx, ty: &str, id: &str, row: &JobRow) {
    let (value, stamped) = row.encode();
    if stamped {
        tx.set_versionstamped_value(&keys.data(ty, id), &value);
    } else {
        tx.set(&keys.data(ty, id), &value);
    }
}

/// Wakes acceptors waiting on the type's pending watch (blind atomic add).
pub(crate) fn bump_pending_watch(keys: &Keys, tx: &Tx, ty: &str) {
    tx.atomic_add(&keys.watches_pending(ty), 1);
}

/// Tells notifiers and activity monitors that the type's activity changed (blind
/// versionstamped write).
pub(crate) fn bump_activity_watch(keys: &Keys, tx: &Tx, ty: &str) {
    tx.set_versionstamped_value(&keys.watches_activity(ty), &keys.watches_activity_value());
}

/// Puts `row` into the pending queue at `row.stime` (clearing the lock).
pub fn enqueue(keys: &Keys, tx: &Tx, ty: &str, id: &str, row: &mut JobRow) {
    row.seq = Seq::Pending;
    row.jlock = None;
    row.resubmit = false;
    tx.set(&keys.pending(ty, row.stime, id), b"");
    write_row(keys, tx, ty, id, row);
    bump_pending_watch(keys, tx, ty);
}

/// Gives a running row a fresh `Seq` and ACTIVITY key (replacing the old one), and bumps the
/// activity watch.
pub(crate) fn stamp_running(keys: &Keys, tx: &Tx, ty: &str, id: &str, row: &mut JobRow) {
    if let Some(old) = row.running_vs() {
        tx.clear(&keys.activity(ty, old));
    }
    let user_version = next_user_version();
    row.seq = Seq::Running(Versionstamp::incomplete(user_version));
    write_row(keys, tx, ty, id, row);
    tx.set_versionstamped_key(
        &keys.activity_incomplete(ty, user_version),
        &encode_activity(id, &row.data),
    );
    bump_activity_watch(keys, tx, ty);
}

/// The type's activity timeout in seconds, if set.
pub async fn get_type_timeout(keys: &Keys, tx: &Tx, ty: &str) -> JobsResult<Option<i64>> {
    match tx.get(&keys.activity_timeout(ty), false).await? {
        Some(v) => Ok(Some(Keys::decode_timeout(&v)?)),
        None => Ok(None),
    }
}

/// Writes the type's activity timeout (seconds); a type with a timeout is a known type.
pub fn set_type_timeout(keys: &Keys, tx: &Tx, ty: &str, secs: i64) {
    tx.set(&keys.activity_timeout(ty), &Keys::encode_timeout(secs));
}

/// Removes the type's activity timeout, so the type server stops its monitors.
#[cfg(any(test, feature = "internals"))]
pub fn clear_type_timeout(keys: &Keys, tx: &Tx, ty: &str) {
    tx.clear(&keys.activity_timeout(ty));
}

/// `add`: a new job becomes pending at `stime`; an existing one is resubmitted with the new
/// data and `stime` (see [`resubmit`]).
pub async fn add(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    id: &str,
    data: JobData,
    stime: i64,
) -> JobsResult<()> {
    // Snapshot: a concurrent timeout change must not make every add conflict. Both reads at
    // once: an engine may serve them in one request (etcd's first reads are batched).
    let timeout_key = keys.activity_timeout(ty);
    let (timeout, row) =
        futures::join!(tx.get(&timeout_key, true), get_row(keys, tx, ty, id, false));
    if timeout?.is_none() {
        return Err(JobsError::NoTypeTimeout);
    }
    match row? {
        None => {
            let mut row = JobRow {
                seq: Seq::Pending,
                jlock: None,
                stime,
                resubmit: false,
                data,
            };
            enqueue(keys, tx, ty, id, &mut row);
            Ok(())
        }
        Some(row) => resubmit_row(keys, tx, ty, id, row, Some(stime), Some(data)),
    }
}

/// `resubmit`: finished → pending (new data and `stime` if given); pending with the same
/// `stime` → no write at all; pending with another `stime` → moved, data replaced if given;
/// running → only the resubmit flag and `stime` are set, the job re-enters pending when its
/// worker calls `finish`. `stime = None` keeps the job's current scheduled time. Does not
/// check any lock.
pub async fn resubmit(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    id: &str,
    stime: Option<i64>,
    data: Option<JobData>,
) -> JobsResult<()> {
    let row = get_row(keys, tx, ty, id, false)
        .await?
        .ok_or(JobsError::NotFound)?;
    resubmit_row(keys, tx, ty, id, row, stime, data)
}

fn resubmit_row(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    id: &str,
    mut row: JobRow,
    stime: Option<i64>,
    data: Option<JobData>,
) -> JobsResult<()> {
    let stime = stime.unwrap_or(row.stime);
    match row.state() {
        JobState::Finished => {
            row.stime = stime;
            if let Some(data) = data {
                row.data = data;
            }
            enqueue(keys, tx, ty, id, &mut row);
        }
        JobState::Pending if row.stime == stime => {
            // Read-only on purpose (commit 17ce741c7): many nodes may re-add the same job.
        }
        JobState::Pending => {
            tx.clear(&keys.pending(ty, row.stime, id));
            row.stime = stime;
            if let Some(data) = data {
                row.data = data;
            }
            enqueue(keys, tx, ty, id, &mut row);
        }
        JobState::Running => {
            row.resubmit = true;
            row.stime = stime;
            write_row(keys, tx, ty, id, &row);
        }
    }
    Ok(())
}

/// `remove`: clears the pending key, activity key and DATA row; bumps the activity watch so
/// subscribers see `not_found`. A running worker gets `Halt` on its next update/finish.
pub async fn remove(keys: &Keys, tx: &Tx, ty: &str, id: &str) -> JobsResult<()> {
    let row = get_row(keys, tx, ty, id, false)
        .await?
        .ok_or(JobsError::NotFound)?;
    if row.state() == JobState::Pending {
        tx.clear(&keys.pending(ty, row.stime, id));
    }
    if let Some(vs) = row.running_vs() {
        tx.clear(&keys.activity(ty, vs));
    }
    tx.clear(&keys.data(ty, id));
    bump_activity_watch(keys, tx, ty);
    Ok(())
}

/// Puts a running job back into the pending queue at once, as the activity monitor does
/// after a whole timeout without an update: its lock is cleared, so the old worker gets
/// `Halt` on its next update/finish. For callers that know the worker is gone (the couch_workers RFC draft's
/// neighbour rule: a node found dead by its neighbour). `false` when the job is not running.
pub async fn requeue_running(keys: &Keys, tx: &Tx, ty: &str, id: &str) -> JobsResult<bool> {
    let Some(mut row) = get_row(keys, tx, ty, id, false).await? else {
        return Ok(false);
    };
    if row.state() != JobState::Running {
        return Ok(false);
    }
    if let Some(vs) = row.running_vs() {
        tx.clear(&keys.activity(ty, vs));
    }
    enqueue(keys, tx, ty, id, &mut row);
    bump_activity_watch(keys, tx, ty);
    Ok(true)
}

/// The job's data (`NotFound` if the job does not exist).
pub async fn get_job_data(keys: &Keys, tx: &Tx, ty: &str, id: &str) -> JobsResult<JobData> {
    get_row(keys, tx, ty, id, false)
        .await?
        .map(|row| row.data)
        .ok_or(JobsError::NotFound)
}

/// The job's state derived from its DATA row (`NotFound` if the job does not exist).
pub async fn get_job_state(keys: &Keys, tx: &Tx, ty: &str, id: &str) -> JobsResult<JobState> {
    get_row(keys, tx, ty, id, false)
        .await?
        .map(|row| row.state())
        .ok_or(JobsError::NotFound)
}

/// Types that have an activity timeout.
pub async fn get_types(keys: &Keys, tx: &Tx) -> JobsResult<Vec<String>> {
    let (begin, end) = keys.activity_timeout_range();
    tx.get_range(&begin, &end, RangeOptions::all())
        .await?
        .iter()
        .map(|kv| keys.decode_activity_timeout_key(&kv.key))
        .collect()
}

/// Ids of the running jobs of a type (the ACTIVITY range), with their data.
pub async fn get_active_jobs(keys: &Keys, tx: &Tx, ty: &str) -> JobsResult<Vec<(String, JobData)>> {
    let (begin, end) = keys.activity_range(ty);
    tx.get_range(&begin, &end, RangeOptions::all())
        .await?
        .iter()
        .map(|kv| decode_activity(&kv.value))
        .collect()
}

/// How many jobs are pending with `STime <= max_sched_time`, counting at most `limit`
/// (a snapshot estimate).
pub async fn pending_count(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    max_sched_time: i64,
    limit: usize,
) -> JobsResult<usize> {
    let (begin, end) = keys.pending_range(ty, max_sched_time);
    let rows = tx
        .get_range(&begin, &end, RangeOptions::all().snapshot().limit(limit))
        .await?;
    Ok(rows.len())
}

/// Reads the row for `job` and checks the caller still holds its lock.
/// The job's row if `job` still holds its lock; its data is decoded only when the caller
/// keeps it (`data` is `None`): a running job's every update replaces its data, and decoding
/// what is about to be replaced was most of an update's CPU.
async fn locked_row(keys: &Keys, tx: &Tx, job: &Job, data: Option<JobData>) -> JobsResult<JobRow> {
    let bytes = tx.get(&keys.data(&job.job_type, &job.id), false).await?;
    let row = match (bytes, data) {
        (None, _) => return Err(JobsError::Halt),
        (Some(bytes), None) => JobRow::decode(&bytes)?,
        (Some(bytes), Some(data)) => {
            let (mut row, ()) = JobRow::decode_with(&bytes, |_| Ok(()))?;
            row.data = data;
            row
        }
    };
    if row.jlock.as_deref() != Some(job.jlock.as_str()) {
        return Err(JobsError::Halt);
    }
    Ok(row)
}

/// `update`: fenced by the job lock (`Halt` if lost); replaces the data if given, writes a
/// fresh `Seq` and ACTIVITY key and bumps the activity watch. The returned job carries the
/// resubmit flag and scheduled time.
pub async fn update(keys: &Keys, tx: &Tx, job: &Job, data: Option<JobData>) -> JobsResult<Job> {
    let mut row = locked_row(keys, tx, job, data).await?;
    stamp_running(keys, tx, &job.job_type, &job.id, &mut row);
    Ok(Job {
        resubmit: row.resubmit,
        stime: Some(row.stime),
        ..job.clone()
    })
}

/// `finish`: fenced by the job lock; a job with the resubmit flag goes back to pending at its
/// stored `STime`, any other becomes finished. Clears the activity key, bumps the watch.
pub async fn finish(keys: &Keys, tx: &Tx, job: &Job, data: Option<JobData>) -> JobsResult<()> {
    let mut row = locked_row(keys, tx, job, data).await?;
    let (ty, id) = (job.job_type.as_str(), job.id.as_str());
    if let Some(vs) = row.running_vs() {
        tx.clear(&keys.activity(ty, vs));
    }
    if row.resubmit {
        enqueue(keys, tx, ty, id, &mut row);
    } else {
        row.seq = Seq::Finished;
        row.jlock = None;
        write_row(keys, tx, ty, id, &row);
    }
    bump_activity_watch(keys, tx, ty);
    Ok(())
}
