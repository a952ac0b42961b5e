//! Subscriptions to job state changes (CouchDB's couch_jobs.erl and couch_jobs_notifier.erl), caller side.
//!
//! [`Jobs::subscribe`] reads the job's state, and unless it is already finished registers
//! with the type's notifier, which then sends [`JobEvent`]s: `pending`, `running` (again for
//! every `update` with a newer `Seq`), `finished`, `not_found` (removed). The subscription
//! ends by itself after `finished`/`not_found`; dropping a [`Subscription`] unsubscribes,
//! and a subscriber that went away without that is cleaned up by the notifier.

use std::time::Duration;

use ractor::ActorRef;
use tokio::sync::mpsc;

use crate::store::tuple::Versionstamp;

use super::Jobs;
use super::error::{JobsError, JobsResult};
use super::event::JobEvent;
use super::job_data::{JobData, JobRow, JobState};
use super::lifecycle::get_row;
use super::notifier::NotifierMsg;

/// What `subscribe` found.
#[derive(Debug)]
pub enum Subscribed {
    /// The job is pending or running; events follow on `sub`.
    Active {
        /// Receives the job's later state changes.
        sub: Subscription,
        /// The job's state when the subscription was made (only the crate's tests ask).
        #[cfg(any(test, feature = "internals"))]
        state: JobState,
        /// The job's data when the subscription was made.
        data: JobData,
    },
    /// The job had already finished: no subscription was created.
    Finished(JobData),
}

/// A live subscription. Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    sub_id: u64,
    events: mpsc::UnboundedReceiver<JobEvent>,
    notifier: ActorRef<NotifierMsg>,
}

impl Subscription {
    /// The next event, or `None` on timeout or when the subscription has ended (after
    /// `finished`/`not_found`, or its notifier stopped).
    pub async fn wait(&mut self, timeout: Duration) -> Option<JobEvent> {
        tokio::time::timeout(timeout, self.events.recv())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The notifier may already be gone; then there is nothing to clean up.
        let _ = self.notifier.cast(NotifierMsg::Unsubscribe(self.sub_id));
    }
}

/// The first event from any of `subs`, with the index of its subscription; `None` on
/// timeout or when all have ended.
#[cfg(any(test, feature = "internals"))]
pub async fn wait_any(subs: &mut [Subscription], timeout: Duration) -> Option<(usize, JobEvent)> {
    use futures::FutureExt;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut open: Vec<usize> = (0..subs.len()).collect();
    loop {
        if open.is_empty() {
            return None;
        }
        let futs = subs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| open.contains(i))
            .map(|(i, s)| async move { (i, s.events.recv().await) }.boxed());
        let ((i, ev), _, _) = tokio::time::timeout_at(deadline, futures::future::select_all(futs))
            .await
            .ok()?;
        match ev {
            Some(ev) => return Some((i, ev)),
            None => open.retain(|&j| j != i),
        }
    }
}

impl Jobs {
    /// Subscribes to a job's state changes. `Finished(data)` (no subscription) if it already
    /// finished; [`JobsError::NotFound`] if it does not exist. Needs this node's background
    /// processes ([`Jobs::start_background`]).
    pub async fn subscribe(&self, ty: &str, id: &str) -> JobsResult<Subscribed> {
        let row = self
            .db()
            .run(|tx| async move { get_row(self.keys(), &tx, ty, id, false).await })
            .await?;
        self.register(ty, id, row).await
    }

    async fn register(&self, ty: &str, id: &str, row: Option<JobRow>) -> JobsResult<Subscribed> {
        let row = row.ok_or(JobsError::NotFound)?;
        let state = row.state();
        if state == JobState::Finished {
            return Ok(Subscribed::Finished(row.data));
        }
        let notifier = self.registry().notifier(ty).await?;
        let (send, events) = mpsc::unbounded_channel();
        let seq: Option<Versionstamp> = row.running_vs().cloned();
        let sub_id = ractor::call!(notifier, |reply| NotifierMsg::Subscribe {
            id: id.to_string(),
            state: state.into(),
            seq,
            events: send,
            reply,
        })
        .map_err(|e| JobsError::Unavailable(e.to_string()))?;
        Ok(Subscribed::Active {
            sub: Subscription {
                sub_id,
                events,
                notifier,
            },
            #[cfg(any(test, feature = "internals"))]
            state,
            data: row.data,
        })
    }
}
