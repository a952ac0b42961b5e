//! What became of a commit `Txn` whose answer was lost (a timeout, a connection cut, a member
//! killed while it was in flight): the engine learns it from etcd itself, so `Db::run` needs
//! no transaction-id key in every commit (two writes per transaction saved, put and clear).
//!
//! Every commit `Txn` moves the clock from the value it predicted to the next counter with a
//! nonce of its own, under a compare on the exact old value, so exactly one `Txn` ever writes
//! each counter. Ours landed iff the value with our counter carries our nonce:
//! - the clock holds our value: landed, at its mod revision;
//! - it is past our counter: reads of the clock at past revisions (a binary search from the
//!   revision we knew before sending) find who wrote our counter (unknown only if those
//!   revisions were compacted meanwhile);
//! - it is still before our counter: ours may yet apply, so we take the next counter
//!   ourselves with a fence `Txn` (a fresh nonce, no data). Once the fence lands no `Txn`
//!   chained on the values we predicted can match its compare any more: not landed.
//!
//! Takes no messages; [`outcome`] is called by the committer.

use std::time::Duration;

use etcd_client::{GetOptions, Txn, TxnOp};

use super::errors::read_error;
use super::tip::clock_holds;
use super::{Clock, Shared};
use crate::store::StoreError;

/// How long the engine keeps asking before it gives up (the caller's own timeout, such as
/// `RetryPolicy::timeout`, usually ends it sooner).
const GIVE_UP: Duration = Duration::from_secs(120);
/// Pause after a request that failed.
const PAUSE: Duration = Duration::from_millis(200);

/// A lost commit's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// It landed, at this revision.
    Committed(i64),
    /// It did not, and never will.
    NotCommitted,
    /// etcd could not tell (unreachable until [`GIVE_UP`], or the history was compacted).
    Unknown,
}

/// The fate of the `Txn` that wrote `ours` to the clock, sent when `after` was the newest
/// revision this process knew.
pub(crate) async fn outcome(shared: &Shared, ours: Clock, after: i64) -> Resolution {
    let deadline = tokio::time::Instant::now() + GIVE_UP;
    while tokio::time::Instant::now() < deadline {
        match step(shared, ours, after).await {
            Ok(Some(resolution)) => return resolution,
            // The fence lost a race with another commit: look again.
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "etcd: resolving a lost commit, retrying");
                tokio::time::sleep(PAUSE).await;
            }
        }
    }
    Resolution::Unknown
}

async fn step(shared: &Shared, ours: Clock, after: i64) -> Result<Option<Resolution>, StoreError> {
    let key = shared.keys.clock().to_vec();
    let resp = shared
        .kv()
        .get(key.clone(), None)
        .await
        .map_err(read_error)?;
    shared.saw(resp.header());
    let (now, revision) = resp.kvs().first().map_or((Clock::default(), 0), |kv| {
        (Clock::decode(kv.value()), kv.mod_revision())
    });
    if now == ours {
        return Ok(Some(Resolution::Committed(revision)));
    }
    if now.counter >= ours.counter {
        let upto = resp.header().map_or(revision, |h| h.revision());
        return match history(shared, ours, after, upto).await {
            Ok(resolution) => Ok(Some(resolution)),
            Err(StoreError::TooOld) => {
                tracing::warn!(
                    "etcd: a lost commit's history was compacted; its outcome is unknown"
                );
                Ok(Some(Resolution::Unknown))
            }
            // Retried like a failed request.
            Err(e) => Err(e),
        };
    }
    let fence = now.next();
    let txn = Txn::new()
        .when([clock_holds(key.clone(), now)])
        .and_then([TxnOp::put(key, fence.encode().unwrap_or_default(), None)]);
    let resp = shared.kv().txn(txn).await.map_err(read_error)?;
    shared.saw(resp.header());
    Ok(resp.succeeded().then_some(Resolution::NotCommitted))
}

/// Who wrote `ours.counter`, from the clock's history after `after` (up to `upto`, where
/// the clock holds that counter or a later one): a binary search of reads at past revisions,
/// each a plain request that a dead member only delays.
async fn history(
    shared: &Shared,
    ours: Clock,
    after: i64,
    upto: i64,
) -> Result<Resolution, StoreError> {
    // A revision of 0 would read the current state: start at etcd's first revision at least.
    let (mut lo, mut hi) = (after.max(1), upto);
    if at(shared, lo).await?.0.counter >= ours.counter {
        // Taken before ours was even sent.
        return Ok(Resolution::NotCommitted);
    }
    // Invariant: the counter is below ours at `lo` and has reached it at `hi`.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if at(shared, mid).await?.0.counter >= ours.counter {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let (clock, revision) = at(shared, hi).await?;
    Ok(if clock == ours {
        Resolution::Committed(revision)
    } else {
        Resolution::NotCommitted
    })
}

/// The clock and its mod revision as of `revision`.
async fn at(shared: &Shared, revision: i64) -> Result<(Clock, i64), StoreError> {
    let options = GetOptions::new().with_revision(revision);
    let resp = shared
        .read_at(shared.keys.clock().to_vec(), options)
        .await?;
    let kv = resp.kvs().first();
    Ok(kv.map_or((Clock::default(), 0), |kv| {
        (Clock::decode(kv.value()), kv.mod_revision())
    }))
}
