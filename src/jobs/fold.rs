//! Paged reads over every job of a type (`fold_jobs`, CouchDB's couch_jobs.erl API).
//!
//! CouchDB folds in one transaction with a single full range read, which breaks FDB's 5 s
//! transaction limit for large types. Here each page is its own read ([`list_jobs_page`]),
//! and [`Jobs::fold_jobs`](super::Jobs::fold_jobs) runs one transaction per page, continuing
//! after the last key seen. A fold therefore sees each job once but not one consistent
//! snapshot of the whole type.

use crate::store::{RangeOptions, Tx};

use super::error::JobsResult;
use super::job_data::{JobData, JobRow, JobState};
use super::keys::Keys;

/// Default page size of `fold_jobs`.
pub const FOLD_PAGE_SIZE: usize = 500;

/// One job as seen by a fold.
#[derive(Debug, Clone, PartialEq)]
pub struct JobInfo {
    /// The job's id.
    pub id: String,
    /// Pending, running or finished.
    pub state: JobState,
    /// Scheduled time, UNIX seconds.
    pub stime: i64,
    /// The job's data as last written.
    pub data: JobData,
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
    let (begin, end) = keys.data_range(ty);
    let begin = match after {
        Some(id) => {
            let mut k = keys.data(ty, id);
            k.push(0x00);
            k
        }
        None => begin,
    };
    let rows = tx
        .get_range(&begin, &end, RangeOptions::all().limit(limit.max(1)))
        .await?;
    rows.iter()
        .map(|kv| {
            let id = keys.decode_data_key(&kv.key)?;
            let row = JobRow::decode(&kv.value)?;
            Ok(JobInfo {
                id,
                state: row.state(),
                stime: row.stime,
                data: row.data,
            })
        })
        .collect()
}
