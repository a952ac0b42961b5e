//! Paged reads over every job of a type (`fold_jobs`, CouchDB's couch_jobs.erl API).
//!
//! CouchDB folds in one transaction with a single full range read, which breaks FDB's 5 s
//! transaction limit for large types. Here each page is its own read ([`list_jobs_page`]),
//! and [`Jobs::fold_jobs`](super::Jobs::fold_jobs) runs one transaction per page, continuing
//! after the last key seen. A fold therefore sees each job once but not one consistent
//! snapshot of the whole type.

use serde::de::DeserializeOwned;

use crate::store::{KeyValue, RangeOptions, Tx};

use super::error::JobsResult;
use super::job_data::{JobData, JobRow, JobState, decode_data};
use super::keys::Keys;

/// Default page size of `fold_jobs`.
pub const FOLD_PAGE_SIZE: usize = 500;

/// One job as seen by a fold, its data as couch_jobs' [`JobData`] or, for
/// [`Jobs::fold_jobs_as`](super::Jobs::fold_jobs_as), decoded as the reader's own type.
#[derive(Debug, Clone, PartialEq)]
pub struct JobInfo<D = JobData> {
    /// The job's id.
    pub id: String,
    /// Pending, running or finished.
    pub state: JobState,
    /// Scheduled time, UNIX seconds.
    pub stime: i64,
    /// The job's data as last written.
    pub data: D,
}

/// Up to `limit` jobs of `ty` whose id sorts after `after` (from the start when `None`), in
/// key order.
pub async fn list_jobs_page(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    after: Option<&str>,
    limit: usize,
) -> JobsResult<Vec<JobInfo>> {
    let rows = read_page(keys, tx, ty, after, limit).await?;
    rows.iter()
        .map(|kv| job_info(keys, kv, decode_data))
        .collect()
}

/// [`list_jobs_page`] with each job's data decoded as `D` straight from its stored JSON
/// (fields `D` does not name are skipped, not built); data that does not decode as `D` is
/// `None`.
pub async fn list_jobs_page_as<D: DeserializeOwned>(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    after: Option<&str>,
    limit: usize,
) -> JobsResult<Vec<JobInfo<Option<D>>>> {
    let rows = read_page(keys, tx, ty, after, limit).await?;
    rows.iter()
        .map(|kv| job_info(keys, kv, |json| Ok(serde_json::from_slice(json).ok())))
        .collect()
}

async fn read_page(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    after: Option<&str>,
    limit: usize,
) -> JobsResult<Vec<KeyValue>> {
    let (begin, end) = keys.data_range(ty);
    let begin = match after {
        Some(id) => {
            let mut k = keys.data(ty, id);
            k.push(0x00);
            k
        }
        None => begin,
    };
    Ok(tx
        .get_range(&begin, &end, RangeOptions::all().limit(limit.max(1)))
        .await?)
}

fn job_info<D>(
    keys: &Keys,
    kv: &KeyValue,
    data: impl FnOnce(&[u8]) -> JobsResult<D>,
) -> JobsResult<JobInfo<D>> {
    let id = keys.decode_data_key(&kv.key)?;
    let (row, data) = JobRow::decode_with(&kv.value, data)?;
    Ok(JobInfo {
        id,
        state: row.state(),
        stime: row.stime,
        data,
    })
}
