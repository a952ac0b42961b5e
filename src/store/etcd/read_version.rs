//! Read versions, fetched lazily and batched with the first reads that need them.
//!
//! A transaction has no revision until it first reads: that read goes here, and every first
//! read queued while the previous batch was in flight goes out with it as one read-only
//! `Txn` of `Range`s without a revision (linearizable: etcd serves it after a read-index
//! round, at its current revision). The `Txn`'s header revision becomes the read version of
//! every transaction in the batch, so the batch costs one request where it used to cost a
//! read-version request plus one read per transaction (FoundationDB's proxies batch
//! `GetReadVersion` the same way; its clients also take the read version at the first read).
//! A request only ever joins a `Txn` sent after it arrived, so a transaction still sees
//! every commit that finished before it began. The `Txn` never holds a `Range` with an
//! explicit revision (etcd issue 18667 makes members diverge on 3.4.23).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use etcd_client::{GetOptions, GetResponse, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, oneshot};

use super::errors::read_error;
use super::{Clock, MAX_TXN_OPS, Shared};
use crate::store::StoreError;

/// Rows the ranges of one batch may ask for at most (their limits summed), so that a batch's
/// response stays well under the client's 4 MiB message limit; a larger page goes alone.
const MAX_BATCH_ROWS: i64 = 2_000;

/// What a first read found: the revision it read at, and the response to its `Range`.
type Answer = Result<(i64, Option<GetResponse>), StoreError>;

struct Request {
    /// `None`: only the revision is wanted.
    read: Option<(Vec<u8>, GetOptions, i64)>,
    reply: oneshot::Sender<Answer>,
}

/// The handle; the task ends with the last one.
#[derive(Clone)]
pub(crate) struct ReadVersions {
    queue: mpsc::UnboundedSender<Request>,
}

impl ReadVersions {
    pub(crate) fn start(shared: Arc<Shared>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(shared, rx));
        Self { queue }
    }

    async fn ask(&self, read: Option<(Vec<u8>, GetOptions, i64)>) -> Answer {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Request { read, reply })
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// The current revision.
    pub(crate) async fn get(&self) -> Result<i64, StoreError> {
        Ok(self.ask(None).await?.0)
    }

    /// Reads `key` (with `options`, which carry no revision) at the current revision: that
    /// revision and the response. `rows` is the most rows it can return.
    pub(crate) async fn first_read(
        &self,
        key: Vec<u8>,
        options: GetOptions,
        rows: i64,
    ) -> Result<(i64, GetResponse), StoreError> {
        let (revision, resp) = self.ask(Some((key, options, rows.max(1)))).await?;
        let resp = resp.ok_or_else(|| StoreError::Engine("etcd: a read got no answer".into()))?;
        Ok((revision, resp))
    }
}

async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Request>) {
    let mut held: Option<Request> = None;
    loop {
        let first = match held.take() {
            Some(r) => r,
            None => match rx.recv().await {
                Some(r) => r,
                None => return,
            },
        };
        let mut rows = first.read.as_ref().map_or(0, |r| r.2);
        let mut batch = vec![first];
        // One operation is the clock read; the rest are the members' reads.
        let mut ops = 1 + batch.iter().filter(|r| r.read.is_some()).count();
        while ops < MAX_TXN_OPS {
            let Ok(more) = rx.try_recv() else { break };
            let more_rows = more.read.as_ref().map_or(0, |r| r.2);
            if more_rows > 0 && rows + more_rows > MAX_BATCH_ROWS {
                held = Some(more);
                break;
            }
            rows += more_rows;
            ops += usize::from(more.read.is_some());
            batch.push(more);
        }
        send(&shared, batch).await;
    }
}

/// One `Txn` for the batch: the clock key (for the committer's prediction), then each read.
async fn send(shared: &Shared, batch: Vec<Request>) {
    shared.stats.read_versions.fetch_add(1, Ordering::Relaxed);
    let mut ops = vec![TxnOp::get(shared.keys.clock().to_vec(), None)];
    let mut replies = Vec::with_capacity(batch.len());
    for request in batch {
        let index = request.read.map(|(key, options, _)| {
            ops.push(TxnOp::get(key, Some(options)));
            ops.len() - 1
        });
        replies.push((index, request.reply));
    }
    let answer = shared.kv().txn(Txn::new().and_then(ops)).await;
    let resp = match answer {
        Ok(resp) => resp,
        Err(e) => {
            let e = read_error(e);
            for (_, reply) in replies {
                let _ = reply.send(Err(e.clone()));
            }
            return;
        }
    };
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut gets: Vec<Option<GetResponse>> = resp
        .op_responses()
        .into_iter()
        .map(|r| match r {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect();
    if let Some(clock) = gets.first().and_then(|g| g.as_ref()?.kvs().first()) {
        shared
            .tip
            .saw_clock(Clock::decode(clock.value(), clock.mod_revision()).counter);
    }
    for (index, reply) in replies {
        let read = index.and_then(|i| gets.get_mut(i).and_then(Option::take));
        let _ = reply.send(Ok((revision, read)));
    }
}

/// One linearizable read of the clock key, to check at connect time that the cluster answers.
pub(crate) async fn read_version(shared: &Shared) -> Result<i64, StoreError> {
    let resp = shared
        .kv()
        .get(shared.keys.clock(), None::<GetOptions>)
        .await
        .map_err(read_error)?;
    Ok(resp.header().map_or(0, |h| h.revision()))
}
