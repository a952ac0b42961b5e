//! A local replica of the engine's key prefix, kept by one etcd watch, so that a
//! transaction's reads cost no request (the design Kubernetes' API server calls its watch
//! cache).
//!
//! It owns the prefix's rows as persistent ordered maps ([`imbl::OrdMap`], whose clone is
//! O(1)): one per revision it applied lately. It takes no messages; its task loads the prefix
//! at one revision, then applies the watch's events in revision order, loading again after a
//! compaction cancelled the watch and re-arming it after a lost stream.
//!
//! Why a read at the transaction's revision `R` can be served here: every commit of this
//! engine writes the clock key in its `Txn`, so the prefix does not change between the
//! clock's mod revision `M` (read with `R`, in the same read-version `Txn`) and `R`. Once the
//! replica applied everything up to `M`, its state at `R` is the prefix's state at `R`. A
//! transaction pins that map ([`Replica::pin`]) and reads it as etcd would answer its
//! `Range`s; when the replica cannot (stream down, too far behind), the transaction reads
//! from etcd as before. Read versions still come from etcd, so transactions stay strictly
//! serializable; commits still check every read with compares.
//!
//! It also serves the store's watches ([`Replica::watch`], waiters kept in
//! [`KeyWatchers`]): the events it applies are the changes a watch waits for. A stream that
//! stays silent while etcd commits (its member cut off from the leader keeps it open) is
//! replaced once a transaction waited for it in vain.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, GetResponse, WatchOptions};
use imbl::OrdMap;
use tokio::sync::{oneshot, watch};

use super::errors::read_error;
use super::key_watchers::KeyWatchers;
use crate::store::StoreError;

/// How long a transaction waits for the replica to apply its read version before it reads
/// from etcd instead.
const PIN_WAIT: Duration = Duration::from_millis(250);
/// Maps of past revisions kept for transactions whose read version the replica passed.
const KEPT: usize = 512;
/// Rows per page when loading.
const LOAD_PAGE: i64 = 1_000;
/// Pause before loading or watching again after a failure.
const RETRY: Duration = Duration::from_millis(250);

/// One row as etcd stores it: value and mod revision (keys are whole etcd keys).
#[derive(Clone, Debug)]
struct Entry {
    value: Arc<[u8]>,
    mod_revision: i64,
}

type Rows = OrdMap<Arc<[u8]>, Entry>;

/// A row read: etcd key, value, mod revision.
#[derive(Debug, Clone)]
pub(crate) struct Kv {
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
    pub(crate) mod_revision: i64,
}

/// The rows a `Range` returned, and whether more matched than its limit.
#[derive(Debug, Default)]
pub(crate) struct Page {
    pub(crate) rows: Vec<Kv>,
    pub(crate) more: bool,
}

impl From<GetResponse> for Page {
    fn from(resp: GetResponse) -> Self {
        let rows = resp
            .kvs()
            .iter()
            .map(|kv| Kv {
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                mod_revision: kv.mod_revision(),
            })
            .collect();
        Self {
            rows,
            more: resp.more(),
        }
    }
}

/// One `Range`: etcd keys `key..end` (just `key` without an end), at most `limit` rows.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) key: Vec<u8>,
    pub(crate) end: Option<Vec<u8>>,
    pub(crate) limit: i64,
    pub(crate) reverse: bool,
}

impl Spec {
    /// The `Range` options (without a revision) etcd would need.
    pub(crate) fn options(&self) -> GetOptions {
        let mut options = GetOptions::new();
        if let Some(end) = &self.end {
            options = options.with_range(end.clone()).with_limit(self.limit);
        }
        if self.reverse {
            options = options.with_sort(
                etcd_client::SortTarget::Key,
                etcd_client::SortOrder::Descend,
            );
        }
        options
    }
}

/// The prefix's rows at one revision, pinned by a transaction.
#[derive(Clone)]
pub(crate) struct Snapshot(Rows);

impl Snapshot {
    /// What etcd would answer to `spec` at this snapshot's revision.
    pub(crate) fn read(&self, spec: &Spec) -> Page {
        let row = |(k, e): (&Arc<[u8]>, &Entry)| Kv {
            key: k.to_vec(),
            value: e.value.to_vec(),
            mod_revision: e.mod_revision,
        };
        let Some(end) = &spec.end else {
            let rows = self.0.get_key_value(spec.key.as_slice()).map(row);
            return Page {
                rows: rows.into_iter().collect(),
                more: false,
            };
        };
        if spec.key >= *end {
            return Page::default();
        }
        use std::ops::Bound::{Excluded, Included};
        let bounds = (Included(spec.key.as_slice()), Excluded(end.as_slice()));
        let range = self.0.range::<_, [u8]>(bounds);
        let limit = usize::try_from(spec.limit).unwrap_or(0);
        let limit = if limit == 0 { usize::MAX } else { limit };
        let mut rows = Vec::new();
        let mut more = false;
        let mut push = |kv: (&Arc<[u8]>, &Entry)| {
            if rows.len() >= limit {
                more = true;
                return false;
            }
            rows.push(row(kv));
            true
        };
        if spec.reverse {
            for kv in range.rev() {
                if !push(kv) {
                    break;
                }
            }
        } else {
            for kv in range {
                if !push(kv) {
                    break;
                }
            }
        }
        Page { rows, more }
    }
}

struct State {
    /// The newest revision applied: the prefix's state at it is `maps.back()`.
    revision: i64,
    /// `(revision, rows)` of the revisions applied lately, oldest first.
    maps: VecDeque<(i64, Rows)>,
    /// The watch is armed: a transaction may wait for it to catch up.
    live: bool,
    /// Store watches waiting for a key to change.
    watchers: KeyWatchers,
}

/// The replica; its task stops when the store's last handle drops ([`ReplicaTask`]).
pub(crate) struct Replica {
    state: Mutex<State>,
    applied: watch::Sender<i64>,
    /// Told when a transaction waited [`PIN_WAIT`] in vain for a revision etcd had already
    /// committed: the stream may be silent (its member cut off from the leader keeps it open
    /// and sends nothing), so the task arms a new one from where it is.
    stale: tokio::sync::Notify,
    /// Times the prefix was loaded (1 at start, +1 per compaction that cut the watch off).
    pub(crate) loads: std::sync::atomic::AtomicU64,
}

impl Replica {
    fn new() -> Self {
        Self {
            state: Mutex::new(State {
                revision: 0,
                maps: VecDeque::new(),
                live: false,
                watchers: KeyWatchers::default(),
            }),
            applied: watch::channel(0).0,
            stale: tokio::sync::Notify::new(),
            loads: Default::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the replica of `prefix` (etcd keys `prefix..strinc(prefix)`).
    pub(crate) fn start(client: Client, prefix: Vec<u8>) -> (Arc<Self>, ReplicaTask) {
        let replica = Arc::new(Self::new());
        let task = tokio::spawn(run(replica.clone(), client, prefix));
        let handle = ReplicaTask {
            task,
            replica: replica.clone(),
        };
        (replica, handle)
    }

    /// The prefix's rows at `revision`, given `clock_mod`, the clock's mod revision at it;
    /// waits up to [`PIN_WAIT`] for the watch to apply `clock_mod`. `None` when the replica
    /// cannot tell (the caller reads from etcd).
    pub(crate) async fn pin(&self, revision: i64, clock_mod: i64) -> Option<Snapshot> {
        let mut applied = self.applied.subscribe();
        let deadline = tokio::time::Instant::now() + PIN_WAIT;
        loop {
            {
                let state = self.state();
                if state.revision >= clock_mod && !state.maps.is_empty() {
                    return state.at(revision).map(Snapshot);
                }
                if !state.live {
                    return None;
                }
            }
            match tokio::time::timeout_at(deadline, applied.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return None,
                Err(_) => {
                    self.stale.notify_one();
                    return None;
                }
            }
        }
    }
}

impl Replica {
    /// Fires once `key` (an etcd key in the prefix) changed at or after `start`, or at once
    /// if it already did; `None` when the replica cannot tell (nothing loaded yet, or the
    /// revision before `start` is older than the maps kept): the caller watches etcd.
    pub(crate) fn watch(&self, key: &[u8], start: i64) -> Option<oneshot::Receiver<()>> {
        let mut state = self.state();
        if state.maps.is_empty() {
            return None;
        }
        // Events up to the replica's revision are applied: look at them; later ones fire
        // the registered watch as they come.
        if start - 1 <= state.revision && state.changed_since(key, start)? {
            let (fire, fired) = oneshot::channel();
            let _ = fire.send(());
            return Some(fired);
        }
        Some(state.watchers.add(key, start))
    }
}

impl State {
    /// Whether `key` changed at or after `start` in the maps kept (its mod revision, 0 when
    /// absent, differs from the one before `start`); `None` when that one is not kept.
    fn changed_since(&self, key: &[u8], start: i64) -> Option<bool> {
        let seen = |rows: &Rows| rows.get(key).map_or(0, |e| e.mod_revision);
        let before = seen(&self.at(start - 1)?);
        let later = self.maps.iter().filter(|(r, _)| *r >= start);
        Some(later.map(|(_, rows)| seen(rows)).any(|m| m != before))
    }

    /// The rows at `revision`, which the prefix did not change after the replica's state
    /// (or, if the replica is past it, the newest map at or before it).
    fn at(&self, revision: i64) -> Option<Rows> {
        if revision >= self.revision {
            return self.maps.back().map(|(_, rows)| rows.clone());
        }
        let (first, _) = self.maps.front()?;
        if revision < *first {
            return None;
        }
        self.maps
            .iter()
            .rev()
            .find(|(r, _)| *r <= revision)
            .map(|(_, rows)| rows.clone())
    }

    /// Makes `rows` the state at `revision`.
    fn push(&mut self, revision: i64, rows: Rows) {
        self.revision = revision;
        self.maps.push_back((revision, rows));
        while self.maps.len() > KEPT {
            self.maps.pop_front();
        }
    }
}

/// Aborts the replica's task when dropped (with the store's last handle), and fires the
/// watches it served: later ones watch etcd.
pub(crate) struct ReplicaTask {
    task: tokio::task::JoinHandle<()>,
    replica: Arc<Replica>,
}

impl Drop for ReplicaTask {
    fn drop(&mut self) {
        self.task.abort();
        let mut state = self.replica.state();
        state.live = false;
        state.maps.clear();
        state.watchers.fire_all();
    }
}

/// The key after every key that starts with `prefix` (`"\0"`, etcd's "to the end", for an
/// empty prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    crate::store::strinc(prefix).unwrap_or_else(|| vec![0])
}

async fn run(replica: Arc<Replica>, client: Client, prefix: Vec<u8>) {
    let end = prefix_end(&prefix);
    loop {
        let (revision, rows) = match load(&client, &prefix, &end).await {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::debug!(error = %e, "etcd replica: load failed, retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        {
            let mut state = replica.state();
            state.maps.clear();
            state.push(revision, rows);
            // What changed while the replica was cut off is unknown: every watch fires.
            state.watchers.fire_all();
        }
        replica
            .loads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        replica.applied.send_replace(revision);
        // Follows the watch until a compaction makes it load again.
        follow(&replica, &client, &prefix, &end).await;
    }
}

/// The prefix's rows at the cluster's current revision, page by page at that revision.
async fn load(client: &Client, prefix: &[u8], end: &[u8]) -> Result<(i64, Rows), StoreError> {
    let mut kv = client.kv_client();
    let mut rows = Rows::new();
    let mut from = prefix.to_vec();
    let mut revision = 0;
    loop {
        let mut options = GetOptions::new()
            .with_range(end.to_vec())
            .with_limit(LOAD_PAGE);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let resp = kv
            .get(from.clone(), Some(options))
            .await
            .map_err(read_error)?;
        if revision == 0 {
            revision = resp.header().map_or(0, |h| h.revision());
        }
        for kv in resp.kvs() {
            let entry = Entry {
                value: kv.value().into(),
                mod_revision: kv.mod_revision(),
            };
            rows.insert(kv.key().into(), entry);
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok((revision, rows)),
        }
    }
}

/// Why a watch stream ended.
enum End {
    /// The revisions the replica needs were compacted: load again.
    Compacted,
    /// The stream failed or was cancelled: arm a new one after a pause.
    Lost,
    /// Transactions waited in vain for it: arm a new one at once (the state stays valid).
    Stale,
}

/// Applies the watch's events from the replica's revision on; returns when the replica must
/// load again (the revisions it needs were compacted).
async fn follow(replica: &Replica, client: &Client, prefix: &[u8], end: &[u8]) {
    // A stream armed less than this ago is not replaced for being behind.
    const STALE_AFTER: Duration = Duration::from_secs(1);
    loop {
        let start = replica.state().revision + 1;
        let options = WatchOptions::new()
            .with_range(end.to_vec())
            .with_start_revision(start);
        let mut stream = match client
            .watch_client()
            .watch(prefix.to_vec(), Some(options))
            .await
        {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "etcd replica: watch not armed, retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        replica.state().live = true;
        let armed = tokio::time::Instant::now();
        let ended = loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = replica.stale.notified() => {
                    if armed.elapsed() < STALE_AFTER {
                        continue;
                    }
                    tracing::info!("etcd replica: the watch fell behind etcd, arming a new one");
                    break End::Stale;
                }
            };
            match message {
                Ok(Some(resp)) if resp.canceled() => {
                    super::errors::refresh_if_auth(client, resp.cancel_reason()).await;
                    if resp.compact_revision() > 0 {
                        break End::Compacted;
                    }
                    break End::Lost;
                }
                Ok(Some(resp)) => apply(replica, resp.events()),
                Ok(None) | Err(_) => break End::Lost,
            }
        };
        match ended {
            End::Stale => continue,
            End::Compacted | End::Lost => {
                replica.state().live = false;
                replica.applied.send_modify(|_| {});
            }
        }
        if matches!(ended, End::Compacted) {
            tracing::info!("etcd replica: revisions compacted past the watch, loading again");
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Applies one watch response: a map per revision, in order.
fn apply(replica: &Replica, events: &[etcd_client::Event]) {
    if events.is_empty() {
        return;
    }
    let mut state = replica.state();
    let Some((_, mut rows)) = state.maps.back().cloned() else {
        return;
    };
    let mut current = state.revision;
    for event in events {
        let Some(kv) = event.kv() else { continue };
        let revision = kv.mod_revision();
        if revision <= state.revision {
            // Already applied (a re-armed watch starts after the state, so this is a guard).
            continue;
        }
        if revision != current && current > state.revision {
            state.push(current, rows.clone());
        }
        current = revision;
        state.watchers.changed(kv.key(), revision);
        match event.event_type() {
            EventType::Put => {
                let entry = Entry {
                    value: kv.value().into(),
                    mod_revision: revision,
                };
                rows.insert(kv.key().into(), entry);
            }
            EventType::Delete => {
                rows.remove(kv.key());
            }
        }
    }
    if current > state.revision {
        state.push(current, rows);
    }
    drop(state);
    replica.applied.send_replace(current);
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
