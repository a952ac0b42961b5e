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

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use etcd_client::{GetOptions, GetResponse, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, oneshot};

use super::errors::read_error;
use super::{Clock, MAX_TXN_OPS, Shared};
use crate::store::StoreError;

/// Rows the ranges of one batch may ask for at most (their limits summed), so that a batch's
/// response stays well under the client's 4 MiB message limit; a larger page goes alone.
const MAX_BATCH_ROWS: i64 = 2_000;
/// Reads in one transaction's group at most (later ones wait for the revision).
const MAX_GROUP: usize = 32;

/// A read version: the revision `R`, and the clock's mod revision at `R` (0 when absent):
/// the prefix did not change between the two (every commit writes the clock).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Version {
    pub(crate) revision: i64,
    pub(crate) clock_mod: i64,
}

/// What a first read found: the version it read at, and the response to its `Range`.
type Answer = Result<(Version, Option<GetResponse>), StoreError>;

/// One read: `None` when only the revision is wanted; else the key, its options (no
/// revision) and the most rows it can return.
pub(crate) type Read = Option<Box<(Vec<u8>, GetOptions, i64)>>;

struct Request {
    read: Read,
    reply: oneshot::Sender<Answer>,
}

/// The first reads of one transaction: reads it starts while the first is still queued join
/// it (couch_jobs' `add` reads two keys at once), so all go out in one `Txn`, at one revision.
#[derive(Default)]
pub(crate) struct Group(Mutex<GroupState>);

#[derive(Default)]
struct GroupState {
    /// Taken by the batcher: later reads must wait for the revision.
    sent: bool,
    reads: Vec<Request>,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `read` to the group while it is open (its first read queued, not yet sent) and
    /// not full.
    fn join(&self, read: Read) -> Result<oneshot::Receiver<Answer>, Read> {
        let mut state = self.lock();
        if state.sent || state.reads.is_empty() || state.reads.len() >= MAX_GROUP {
            return Err(read);
        }
        let (reply, answer) = oneshot::channel();
        state.reads.push(Request { read, reply });
        Ok(answer)
    }

    /// The reads, if `fits(operations, rows)` says they fit: the group is sent.
    fn take_if(&self, fits: impl FnOnce(usize, i64) -> bool) -> Option<(Vec<Request>, usize, i64)> {
        let mut state = self.lock();
        let ops = state.reads.iter().filter(|r| r.read.is_some()).count();
        let rows = state
            .reads
            .iter()
            .filter_map(|r| r.read.as_ref())
            .map(|r| r.2);
        let rows = rows.sum();
        if !fits(ops, rows) {
            return None;
        }
        state.sent = true;
        Some((std::mem::take(&mut state.reads), ops, rows))
    }
}

/// The handle; the task ends with the last one.
#[derive(Clone)]
pub(crate) struct ReadVersions {
    queue: mpsc::UnboundedSender<Arc<Group>>,
}

impl ReadVersions {
    pub(crate) fn start(shared: Arc<Shared>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(shared, rx));
        Self { queue }
    }

    /// Opens `group` with `read` and queues it (before any await, so that a cancelled
    /// opener cannot strand the reads that joined). The reads the transaction starts before
    /// the batcher takes the group join it ([`ReadVersions::join`]).
    async fn open(&self, group: &Arc<Group>, read: Read) -> Answer {
        let (reply, answer) = oneshot::channel();
        group.lock().reads.push(Request { read, reply });
        self.queue
            .send(group.clone())
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Adds `read` to `group` if it is still queued: the revision and the response (none
    /// when `read` is `None`); `Err(read)` when the group is not open.
    pub(crate) async fn join(&self, group: &Group, read: Read) -> Result<Answer, Read> {
        let answer = group.join(read)?;
        Ok(answer.await.map_err(|_| StoreError::Closed).and_then(|a| a))
    }

    /// The current version, as the first read of `group`.
    pub(crate) async fn get(&self, group: &Arc<Group>) -> Result<Version, StoreError> {
        Ok(self.open(group, None).await?.0)
    }

    /// Reads `key` (with `options`, which carry no revision) at the current revision, as the
    /// first read of `group`: that revision and the response. `rows` is the most rows it can
    /// return.
    pub(crate) async fn first_read(
        &self,
        group: &Arc<Group>,
        key: Vec<u8>,
        options: GetOptions,
        rows: i64,
    ) -> Result<(Version, GetResponse), StoreError> {
        let answer = self
            .open(group, Some(Box::new((key, options, rows.max(1)))))
            .await;
        with_response(answer?)
    }
}

pub(crate) fn with_response(
    (revision, resp): (Version, Option<GetResponse>),
) -> Result<(Version, GetResponse), StoreError> {
    let resp = resp.ok_or_else(|| StoreError::Engine("etcd: a read got no answer".into()))?;
    Ok((revision, resp))
}

async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Arc<Group>>) {
    let mut held: Option<Arc<Group>> = None;
    let slots = Arc::new(tokio::sync::Semaphore::new(shared.read_pipeline.max(1)));
    loop {
        let first = match held.take() {
            Some(g) => g,
            None => match rx.recv().await {
                Some(g) => {
                    // Lets the opener's task start the reads it started together with the
                    // first (`join!`), so that they join its group.
                    tokio::task::yield_now().await;
                    g
                }
                None => return,
            },
        };
        // Wait for a free slot before forming the batch: groups that arrive meanwhile join.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // One operation is the clock read; the rest are the members' reads.
        let Some((mut batch, mut ops, mut rows)) = first.take_if(|_, _| true) else {
            continue;
        };
        ops += 1;
        while ops < MAX_TXN_OPS {
            let Ok(more) = rx.try_recv() else { break };
            let fits = |o, r| ops + o <= MAX_TXN_OPS && (r == 0 || rows + r <= MAX_BATCH_ROWS);
            let Some((reads, o, r)) = more.take_if(fits) else {
                held = Some(more);
                break;
            };
            (ops, rows) = (ops + o, rows + r);
            batch.extend(reads);
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            send(&shared, batch).await;
            drop(slot);
        });
    }
}

/// One `Txn` for the batch: the clock key (for the committer's prediction), then each read.
async fn send(shared: &Shared, batch: Vec<Request>) {
    shared.stats.read_versions.fetch_add(1, Ordering::Relaxed);
    let mut ops = vec![TxnOp::get(shared.keys.clock().to_vec(), None)];
    let mut replies = Vec::with_capacity(batch.len());
    for request in batch {
        let index = request.read.map(|read| {
            let (key, options, _) = *read;
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
    shared.saw(resp.header());
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut gets: Vec<Option<GetResponse>> = resp
        .op_responses()
        .into_iter()
        .map(|r| match r {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect();
    let mut clock_mod = 0;
    if let Some(clock) = gets.first().and_then(|g| g.as_ref()?.kvs().first()) {
        clock_mod = clock.mod_revision();
        shared.tip.saw_clock(Clock::decode(clock.value()));
    }
    let version = Version {
        revision,
        clock_mod,
    };
    for (index, reply) in replies {
        let read = index.and_then(|i| gets.get_mut(i).and_then(Option::take));
        let _ = reply.send(Ok((version, read)));
    }
}

/// One linearizable read of the clock key, to check at connect time that the cluster answers.
pub(crate) async fn read_version(shared: &Shared) -> Result<i64, StoreError> {
    let resp = shared
        .kv()
        .get(shared.keys.clock(), None::<GetOptions>)
        .await
        .map_err(read_error)?;
    shared.saw(resp.header());
    Ok(resp.header().map_or(0, |h| h.revision()))
}
