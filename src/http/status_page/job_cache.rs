//! One job listing shared by every status-page viewer: listing 10,000 jobs takes ~0.3 s, and
//! each open page polls every second, so requests within [`MAX_AGE`] of a listing reuse it
//! (and concurrent ones wait for the same listing instead of starting their own).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::replicator::{JobView, Replicator, ReplicatorError};

/// How old a listing may be when it is served again.
pub const MAX_AGE: Duration = Duration::from_millis(500);

/// The latest listing and when it was taken.
#[derive(Debug, Default)]
pub struct JobCache {
    latest: Mutex<Option<(Instant, Arc<Vec<JobView>>)>>,
}

impl JobCache {
    /// Every job, at most [`MAX_AGE`] old.
    pub async fn jobs(&self, rep: &Replicator) -> Result<Arc<Vec<JobView>>, ReplicatorError> {
        let mut latest = self.latest.lock().await;
        if let Some((at, jobs)) = latest.as_ref()
            && at.elapsed() < MAX_AGE
        {
            return Ok(jobs.clone());
        }
        let jobs = Arc::new(rep.list().await?);
        *latest = Some((Instant::now(), jobs.clone()));
        Ok(jobs)
    }
}
