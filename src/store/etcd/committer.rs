//! The process's one committer: a task that sends commits as etcd `Txn`s, batching the
//! commits that queued up while the earlier `Txn`s were in flight into one `Txn` when their
//! read and write sets are disjoint (any order of them is then serializable, so etcd
//! checking all their compares against the state before the batch is sound).
//!
//! A batch is one all-or-nothing `Txn`: every member's read compares, then the members'
//! writes folded in batch order (so two members may write one key: the later wins, as if
//! they had committed one after the other; blind atomic adds to one counter sum up). It
//! advances the clock key's counter (the versionstamp) and checks that the keys of atomic
//! adds hold the values the adds were computed from, both by value as `tip.rs` predicts, so
//! up to `pipeline` `Txn`s are in flight at once. Its failure branch reads those back plus
//! one probe per compare, so the committer learns which members really conflict: they get
//! `Conflict`, and the rest is resent at once (as is a batch that failed only because the
//! prediction was wrong), without running any transaction again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use etcd_client::{Compare, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::conflicts::{Check, ReadSet, overlap};
use super::errors::{commit_error, read_error};
use super::plan::{WritePlan, write_spans};
use super::resolve::{self, Resolution};
use super::tip::{self, Basis, Seen};
use super::{Clock, Keys, MAX_REQUEST_BYTES, MAX_TXN_OPS, Shared};
use crate::store::embedded::writes::Mutation;
use crate::store::{CommitStamp, StoreError, commit_stamp};

/// How often a `Txn` is rebuilt because the clock or an added key moved before giving up
/// with a conflict (`Db::run` then runs the transaction again).
const REBUILDS: usize = 16;
/// Commits in one batch at most.
const MAX_BATCH: usize = 64;

/// A commit that landed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Committed {
    pub(crate) stamp: CommitStamp,
    pub(crate) revision: i64,
}

type Reply = oneshot::Sender<Result<Committed, StoreError>>;

/// One transaction's commit, as queued.
pub(crate) struct Member {
    checks: Vec<Check>,
    ops: Vec<Mutation>,
    reply: Reply,
    read_spans: Vec<(Vec<u8>, Vec<u8>)>,
    write_spans: Vec<(Vec<u8>, Vec<u8>)>,
    /// Operations its writes take at most.
    op_estimate: usize,
    bytes: usize,
}

impl Member {
    /// Whether this member may share a `Txn` with `other`: neither reads what the other
    /// writes (both are checked against the state before the batch).
    fn disjoint(&self, other: &Member) -> bool {
        !overlap(&self.read_spans, &other.write_spans)
            && !overlap(&other.read_spans, &self.write_spans)
    }
}

/// The handle transactions send their commits through. Cheap to clone; the task ends with
/// the last handle.
#[derive(Clone)]
pub(crate) struct Committer {
    queue: mpsc::UnboundedSender<Member>,
}

impl Committer {
    pub(crate) fn start(shared: Arc<Shared>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(shared, rx));
        Self { queue }
    }

    /// Commits the writes `ops` of a transaction that read `reads` at `revision`.
    pub(crate) async fn commit(
        &self,
        keys: &Keys,
        revision: i64,
        reads: ReadSet,
        ops: Vec<Mutation>,
    ) -> Result<Committed, StoreError> {
        let (reply, verdict) = oneshot::channel();
        let mut alone = WritePlan::default();
        alone.fold(keys, &ops, 0)?;
        let checks = reads.checks(revision);
        let bytes = alone.byte_estimate() + checks.iter().map(Check::bytes).sum::<usize>();
        let member = Member {
            read_spans: reads.spans(),
            write_spans: write_spans(keys, &ops),
            op_estimate: alone.op_estimate(),
            checks,
            ops,
            reply,
            bytes,
        };
        self.queue.send(member).map_err(|_| StoreError::Closed)?;
        verdict.await.map_err(|_| StoreError::Closed)?
    }
}

async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Member>) {
    let slots = Arc::new(Semaphore::new(shared.pipeline.max(1)));
    let mut queue: VecDeque<Member> = VecDeque::new();
    loop {
        if queue.is_empty() {
            match rx.recv().await {
                Some(member) => queue.push_back(member),
                None => return,
            }
        }
        // Wait for a free slot before forming the batch: commits that arrive meanwhile join.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        while let Ok(member) = rx.try_recv() {
            queue.push_back(member);
        }
        let batch = take_batch(&mut queue);
        let shared = shared.clone();
        tokio::spawn(async move {
            commit_batch(&shared, batch).await;
            drop(slot);
        });
    }
}

/// The first queued commit and every later one that is disjoint from the batch and fits
/// (compares, and the probes of the failure branch, each one per check; operations).
fn take_batch(queue: &mut VecDeque<Member>) -> Vec<Member> {
    let Some(first) = queue.pop_front() else {
        return Vec::new();
    };
    // One compare and one probe per check, plus the clock and the atomic adds.
    let reserve = 16;
    let (mut checks, mut ops, mut bytes) = (first.checks.len(), first.op_estimate, first.bytes);
    let mut batch = vec![first];
    let mut i = 0;
    while i < queue.len() && batch.len() < MAX_BATCH {
        let m = &queue[i];
        let fits = checks + m.checks.len() + reserve <= MAX_TXN_OPS
            && ops + m.op_estimate + reserve <= MAX_TXN_OPS
            && bytes + m.bytes < MAX_REQUEST_BYTES;
        if fits && batch.iter().all(|b| b.disjoint(m)) {
            checks += m.checks.len();
            ops += m.op_estimate;
            bytes += m.bytes;
            if let Some(m) = queue.remove(i) {
                batch.push(m);
            }
        } else {
            i += 1;
        }
    }
    batch
}

/// Commits a batch, dropping the members whose checks failed (they get `Conflict`) and
/// resending the rest, until it commits or nothing is left.
async fn commit_batch(shared: &Shared, batch: Vec<Member>) {
    let mut batch = batch;
    for _ in 0..REBUILDS {
        if batch.is_empty() {
            return;
        }
        match commit_members(shared, &batch).await {
            Ok(Outcome::Committed(committed)) => {
                for (i, member) in batch.into_iter().enumerate() {
                    let _ = member.reply.send(Ok(committed[i]));
                }
                return;
            }
            Ok(Outcome::Failed(failed)) => {
                let (conflicted, rest): (Vec<_>, Vec<_>) = batch
                    .into_iter()
                    .enumerate()
                    .partition(|(i, _)| failed.contains(i));
                for (_, member) in conflicted {
                    let _ = member.reply.send(Err(StoreError::Conflict));
                }
                batch = rest.into_iter().map(|(_, m)| m).collect();
            }
            Err(e) => {
                for member in batch {
                    let _ = member.reply.send(Err(e.clone()));
                }
                return;
            }
        }
    }
    for member in batch {
        let _ = member.reply.send(Err(StoreError::Conflict));
    }
}

fn get_ops(shared: &Shared, adds: &[Vec<u8>]) -> Vec<TxnOp> {
    std::iter::once(shared.keys.clock().to_vec())
        .chain(adds.iter().cloned())
        .map(|k| TxnOp::get(k, None))
        .collect()
}

/// Reads the clock and added keys back from the responses of [`get_ops`].
fn seen_from(responses: Vec<TxnOpResponse>, adds: &[Vec<u8>]) -> Seen {
    let mut seen = Seen::default();
    for (i, response) in responses.into_iter().enumerate() {
        let TxnOpResponse::Get(get) = response else {
            continue;
        };
        let kv = get.kvs().first();
        if i == 0 {
            seen.clock = kv.map_or_else(Clock::default, |kv| Clock::decode(kv.value()));
        } else if let Some(key) = adds.get(i - 1) {
            seen.adds
                .insert(key.clone(), kv.map(|kv| kv.value().to_vec()));
        }
    }
    seen
}

/// Reads the clock and the added keys (when the tip does not know them).
async fn read_seen(shared: &Shared, adds: &[Vec<u8>]) -> Result<Seen, StoreError> {
    shared.stats.reads.fetch_add(1, Ordering::Relaxed);
    let txn = Txn::new().and_then(get_ops(shared, adds));
    let resp = shared.kv().txn(txn).await.map_err(read_error)?;
    shared.saw(resp.header());
    Ok(seen_from(resp.op_responses(), adds))
}

/// What one `Txn` of a batch did.
enum Outcome {
    /// Every member committed: their stamps and the revision.
    Committed(Vec<Committed>),
    /// Nothing committed; these members' checks failed (the others may be resent).
    Failed(Vec<usize>),
}

/// The basis of the next `Txn`: the tip's prediction, read first when it has none.
async fn reserve(shared: &Shared, plan: &WritePlan, adds: &[Vec<u8>]) -> Result<Basis, StoreError> {
    for _ in 0..REBUILDS {
        if let Some(basis) = shared.tip.reserve(plan, adds) {
            return Ok(basis);
        }
        shared.tip.learn(read_seen(shared, adds).await?);
    }
    Err(StoreError::Conflict)
}

/// Sends `members` as one all-or-nothing `Txn`, rebuilt while only the clock or the keys of
/// atomic adds were not what the tip predicted.
async fn commit_members(shared: &Shared, members: &[Member]) -> Result<Outcome, StoreError> {
    let mut plan = WritePlan::default();
    for (i, member) in members.iter().enumerate() {
        plan.fold(&shared.keys, &member.ops, i as u16)?;
    }
    let adds = plan.add_keys();
    let checks: Vec<&Check> = members.iter().flat_map(|m| &m.checks).collect();
    for _ in 0..REBUILDS {
        let basis = reserve(shared, &plan, &adds).await?;
        let counter = basis.next.counter;
        let txn = match build(shared, &plan, &checks, &adds, &basis) {
            Ok(txn) => txn,
            Err(e) => {
                // Reserved but never sent: the prediction past it is wrong.
                shared.tip.forget();
                return Err(e);
            }
        };
        shared.stats.txns.fetch_add(1, Ordering::Relaxed);
        let after = shared.latest();
        let resp: TxnResponse = match shared.kv().txn(txn).await {
            Ok(resp) => resp,
            Err(e) => {
                shared.tip.forget();
                return match commit_error(e) {
                    StoreError::CommitUnknown => lost(shared, members, &basis, after).await,
                    e => Err(e),
                };
            }
        };
        shared.saw(resp.header());
        if resp.succeeded() {
            let revision = resp.header().map_or(0, |h| h.revision());
            return Ok(landed(shared, members.len(), counter, revision));
        }
        let mut responses = resp.op_responses();
        let probes = responses.split_off((1 + adds.len()).min(responses.len()));
        shared.tip.missed(basis.epoch, seen_from(responses, &adds));
        let failed = failed_members(members, &probes);
        if !failed.is_empty() {
            shared
                .stats
                .conflicts
                .fetch_add(failed.len() as u64, Ordering::Relaxed);
            return Ok(Outcome::Failed(failed));
        }
        shared.stats.rebuilds.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Outcome::Failed((0..members.len()).collect()))
}

/// A batch of `n` members that committed at `revision` with the clock's `counter`.
fn landed(shared: &Shared, n: usize, counter: u64, revision: i64) -> Outcome {
    let committed = &shared.stats.committed;
    committed.fetch_add(n as u64, Ordering::Relaxed);
    let committed = (0..n)
        .map(|i| Committed {
            stamp: commit_stamp(counter, i as u16),
            revision,
        })
        .collect();
    Outcome::Committed(committed)
}

/// The `Txn` built on `basis` got no answer: asks etcd what became of it (`resolve.rs`).
async fn lost(
    shared: &Shared,
    members: &[Member],
    basis: &Basis,
    after: i64,
) -> Result<Outcome, StoreError> {
    shared.stats.lost.fetch_add(1, Ordering::Relaxed);
    match resolve::outcome(shared, basis.next, after).await {
        Resolution::Committed(revision) => {
            Ok(landed(shared, members.len(), basis.next.counter, revision))
        }
        Resolution::NotCommitted => Err(StoreError::Unavailable(
            "etcd did not answer a commit, which did not land".into(),
        )),
        // Not `CommitUnknown`: `Db::run` writes no transaction id on this engine, so a retry
        // could apply the transaction twice.
        Resolution::Unknown => Err(StoreError::TimedOut),
    }
}

/// The members with a check that the probes show failed.
fn failed_members(members: &[Member], probes: &[TxnOpResponse]) -> Vec<usize> {
    let mut probes = probes.iter();
    let mut failed = Vec::new();
    for (i, member) in members.iter().enumerate() {
        let mut ok = true;
        for check in &member.checks {
            // A missing probe (should not happen) counts as a failed check.
            ok &= probes.next().is_some_and(|p| check.holds(p));
        }
        if !ok {
            failed.push(i);
        }
    }
    failed
}

fn too_many(what: &str, n: usize) -> Result<(), StoreError> {
    if n > MAX_TXN_OPS {
        return Err(StoreError::TooLarge(format!(
            "{n} etcd {what} in one commit (etcd allows {MAX_TXN_OPS})"
        )));
    }
    Ok(())
}

/// The batch's `Txn`: every check, the clock and the keys of atomic adds as `basis`
/// predicts; then the writes and the clock advanced to `counter`; else read back the clock,
/// the added keys and a probe per check.
fn build(
    shared: &Shared,
    plan: &WritePlan,
    checks: &[&Check],
    adds: &[Vec<u8>],
    basis: &Basis,
) -> Result<Txn, StoreError> {
    let mut compares: Vec<Compare> = checks.iter().map(|c| c.compare()).collect();
    compares.extend(adds.iter().map(|key| {
        let base = basis.bases.get(key).cloned().flatten();
        tip::holds(key.clone(), &base)
    }));
    let clock = shared.keys.clock().to_vec();
    compares.push(tip::clock_holds(clock.clone(), basis.clock));
    let mut ops = plan.ops(basis.next.counter, &basis.bases)?;
    let next = basis.next.encode().unwrap_or_default();
    ops.push(TxnOp::put(clock, next, None));
    let mut failure = get_ops(shared, adds);
    failure.extend(checks.iter().map(|c| c.probe()));
    too_many("compares", compares.len())?;
    too_many("operations", ops.len())?;
    too_many("failure reads", failure.len())?;
    let bytes = plan.byte_estimate() + checks.iter().map(|c| c.bytes()).sum::<usize>() * 2;
    if bytes > MAX_REQUEST_BYTES {
        return Err(StoreError::TooLarge(format!(
            "{bytes} bytes in one commit (etcd allows about {MAX_REQUEST_BYTES})"
        )));
    }
    let stats = &shared.stats;
    stats.writes.fetch_add(ops.len() as u64, Ordering::Relaxed);
    stats
        .compares
        .fetch_add(compares.len() as u64, Ordering::Relaxed);
    Ok(Txn::new().when(compares).and_then(ops).or_else(failure))
}
