//! What became of a commit `Txn` whose answer was lost (a timeout, a connection cut, a member
//! killed while it was in flight): the engine learns it from etcd itself, so `Db::run` needs
//! no transaction-id key in every commit (two writes per transaction saved, put and clear).
//!
//! Every commit `Txn` moves the clock from the value it predicted to the next counter with a
//! nonce of its own, under a compare on the exact old value, so exactly one `Txn` ever writes
//! each counter. Ours landed iff the value with our counter carries our nonce:
//! - the clock holds our value: landed, at its mod revision;
//! - it is past our counter: the watch history from before we sent shows who wrote our
//!   counter (unknown only if those revisions were compacted meanwhile);
//! - it is still before our counter: ours may yet apply, so we take the next counter
//!   ourselves with a fence `Txn` (a fresh nonce, no data). Once the fence lands no `Txn`
//!   chained on the values we predicted can match its compare any more: not landed.
//!
//! Takes no messages; [`outcome`] is called by the committer.

use std::time::Duration;

use etcd_client::{Txn, TxnOp, WatchOptions};

use super::tip::clock_holds;
use super::{Clock, Shared};

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

async fn step(
    shared: &Shared,
    ours: Clock,
    after: i64,
) -> Result<Option<Resolution>, etcd_client::Error> {
    let key = shared.keys.clock().to_vec();
    let resp = shared.kv().get(key.clone(), None).await?;
    shared.saw(resp.header());
    let (now, revision) = resp.kvs().first().map_or((Clock::default(), 0), |kv| {
        (Clock::decode(kv.value()), kv.mod_revision())
    });
    if now == ours {
        return Ok(Some(Resolution::Committed(revision)));
    }
    if now.counter >= ours.counter {
        return history(shared, ours, after).await.map(Some);
    }
    let fence = now.next();
    let txn = Txn::new()
        .when([clock_holds(key.clone(), now)])
        .and_then([TxnOp::put(key, fence.encode().unwrap_or_default(), None)]);
    let resp = shared.kv().txn(txn).await?;
    shared.saw(resp.header());
    Ok(resp.succeeded().then_some(Resolution::NotCommitted))
}

/// Who wrote `ours.counter`, from the clock's history after `after`.
async fn history(
    shared: &Shared,
    ours: Clock,
    after: i64,
) -> Result<Resolution, etcd_client::Error> {
    let options = WatchOptions::new().with_start_revision(after + 1);
    let key = shared.keys.clock().to_vec();
    let mut stream = shared.client.watch_client().watch(key, Some(options)).await?;
    while let Some(resp) = stream.message().await? {
        if resp.canceled() {
            tracing::warn!(
                compacted = resp.compact_revision(),
                "etcd: a lost commit's history was compacted; its outcome stays unknown"
            );
            return Ok(Resolution::Unknown);
        }
        for kv in resp.events().iter().filter_map(|e| e.kv()) {
            let clock = Clock::decode(kv.value());
            if clock.counter < ours.counter {
                continue;
            }
            return Ok(if clock == ours {
                Resolution::Committed(kv.mod_revision())
            } else {
                Resolution::NotCommitted
            });
        }
    }
    Ok(Resolution::Unknown)
}
