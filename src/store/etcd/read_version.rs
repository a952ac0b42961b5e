//! Read versions, batched: transactions that begin while a read of the current revision is
//! in flight share the next one (FoundationDB's proxies batch `GetReadVersion` the same way).
//! A request only ever joins a read sent after it arrived, so a transaction still sees every
//! commit that finished before it began.

use std::sync::Arc;

use etcd_client::GetOptions;
use tokio::sync::{mpsc, oneshot};

use super::errors::read_error;
use super::{Clock, Shared};
use crate::store::StoreError;

type Reply = oneshot::Sender<Result<i64, StoreError>>;

/// The handle; the task ends with the last one.
#[derive(Clone)]
pub(crate) struct ReadVersions {
    queue: mpsc::UnboundedSender<Reply>,
}

impl ReadVersions {
    pub(crate) fn start(shared: Arc<Shared>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(shared, rx));
        Self { queue }
    }

    /// The current revision.
    pub(crate) async fn get(&self) -> Result<i64, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue.send(reply).map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Reply>) {
    while let Some(first) = rx.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = rx.try_recv() {
            waiting.push(more);
        }
        let result = read_version(&shared).await;
        for reply in waiting {
            let _ = reply.send(result.clone());
        }
    }
}

/// One linearizable read of the clock key: its revision, and the clock for the committer.
pub(crate) async fn read_version(shared: &Shared) -> Result<i64, StoreError> {
    shared
        .stats
        .read_versions
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let resp = shared
        .kv()
        .get(shared.keys.clock(), None::<GetOptions>)
        .await
        .map_err(read_error)?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let clock = resp
        .kvs()
        .first()
        .map(|kv| Clock::decode(kv.value(), kv.mod_revision()));
    if let Some(clock) = clock {
        shared.tip.saw_clock(clock.counter);
    }
    Ok(revision)
}
