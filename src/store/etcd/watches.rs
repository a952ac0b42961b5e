//! Watches: a wait for one key to change from a start revision (the transaction's read
//! revision + 1, or its commit revision + 1 for a key it wrote), so a change the watch was
//! not yet listening for still fires it.
//!
//! The local replica serves it when it can (its one stream already carries every change of
//! the prefix). Otherwise it is a native etcd watch: a lost stream is re-armed from the same
//! revision; a compaction that cancels the watch is re-armed from now if the key provably
//! did not change (else the watch fires, and callers re-read as the contract says).

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{GetOptions, WatchOptions};

use super::Shared;
use crate::store::StoreError;

/// Pause before re-arming a watch whose stream failed.
const REARM: Duration = Duration::from_millis(250);

/// Resolves once `key` (etcd key) changed at or after `start`.
pub(crate) async fn wait(shared: &Shared, key: Vec<u8>, mut start: i64) -> Result<(), StoreError> {
    if let Some(fired) = shared.replica.as_ref().and_then(|r| r.watch(&key, start)) {
        shared.stats.replica_watches.fetch_add(1, Ordering::Relaxed);
        // Also fires (without a change) when the replica loads again or the store is
        // dropped: callers read again, as after any watch.
        let _ = fired.await;
        return Ok(());
    }
    shared.stats.native_watches.fetch_add(1, Ordering::Relaxed);
    loop {
        let options = WatchOptions::new().with_start_revision(start);
        let mut stream = match shared
            .client
            .watch_client()
            .watch(key.clone(), Some(options))
            .await
        {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "etcd: watch not armed, retrying");
                tokio::time::sleep(REARM).await;
                continue;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(resp)) if !resp.events().is_empty() => return Ok(()),
                Ok(Some(resp)) if resp.canceled() && resp.compact_revision() > 0 => {
                    match unchanged_since(shared, &key, start).await {
                        Some(now) => {
                            start = now;
                            break;
                        }
                        None => return Ok(()),
                    }
                }
                Ok(Some(resp)) if resp.canceled() => {
                    super::errors::refresh_if_auth(&shared.client, resp.cancel_reason()).await;
                    tracing::debug!(
                        reason = resp.cancel_reason(),
                        "etcd: watch cancelled, re-arming"
                    );
                    tokio::time::sleep(REARM).await;
                    break;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    tokio::time::sleep(REARM).await;
                    break;
                }
            }
        }
    }
}

/// After a compaction: the revision to watch from when the key exists and was last written
/// before `start`; `None` when it may have changed.
async fn unchanged_since(shared: &Shared, key: &[u8], start: i64) -> Option<i64> {
    let resp = shared
        .kv()
        .get(key.to_vec(), None::<GetOptions>)
        .await
        .ok()?;
    let kv = resp.kvs().first()?;
    (kv.mod_revision() < start).then(|| resp.header().map_or(start, |h| h.revision() + 1))
}
