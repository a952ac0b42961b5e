//! The store watches the local replica serves: who waits for which key to change at or
//! after which revision.
//!
//! The replica ([`super::replica`]) registers a watch here once it knows the key did not
//! change yet, and reports each event it applies; a watch fires on the first event on its
//! key at or after its start revision. Before this, every store watch opened an etcd watch
//! stream of its own (a gRPC stream, and watcher goroutines on the member): 69 streams a
//! second in the cluster bench's steady state, for changes the replica's one stream already
//! carried. A watch whose waiter has gone is dropped the next time its key is registered or
//! changes.

use std::collections::HashMap;

use tokio::sync::oneshot;

/// Waiting watches by etcd key.
#[derive(Default)]
pub(crate) struct KeyWatchers {
    by_key: HashMap<Vec<u8>, Vec<Waiter>>,
}

struct Waiter {
    start: i64,
    fire: oneshot::Sender<()>,
}

impl KeyWatchers {
    /// Waits for `key` to change at or after `start`.
    pub(crate) fn add(&mut self, key: &[u8], start: i64) -> oneshot::Receiver<()> {
        let (fire, fired) = oneshot::channel();
        let waiters = self.by_key.entry(key.to_vec()).or_default();
        waiters.retain(|w| !w.fire.is_closed());
        waiters.push(Waiter { start, fire });
        fired
    }

    /// `key` changed at `revision`: fires its watches that started at or before it.
    pub(crate) fn changed(&mut self, key: &[u8], revision: i64) {
        let Some(waiters) = self.by_key.get_mut(key) else {
            return;
        };
        for waiter in std::mem::take(waiters) {
            if waiter.start <= revision {
                let _ = waiter.fire.send(());
            } else if !waiter.fire.is_closed() {
                waiters.push(waiter);
            }
        }
        if waiters.is_empty() {
            self.by_key.remove(key);
        }
    }

    /// Fires every watch (the replica loaded the prefix again and cannot tell what changed
    /// meanwhile; a watch may fire without a change, and its caller reads again).
    pub(crate) fn fire_all(&mut self) {
        for waiter in self.by_key.drain().flat_map(|(_, w)| w) {
            let _ = waiter.fire.send(());
        }
    }

    /// Keys with a waiting watch.
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_fires_on_a_change_at_or_after_its_start_only() {
        let mut watchers = KeyWatchers::default();
        let mut early = watchers.add(b"k", 10);
        let mut other = watchers.add(b"j", 1);
        watchers.changed(b"k", 9);
        assert!(
            early.try_recv().is_err(),
            "a change before the start fires nothing"
        );
        watchers.changed(b"k", 10);
        assert!(early.try_recv().is_ok());
        assert!(
            other.try_recv().is_err(),
            "another key's change fires nothing"
        );
        assert_eq!(watchers.keys(), 1);
    }

    #[test]
    fn abandoned_watches_are_dropped_and_a_reload_fires_the_rest() {
        let mut watchers = KeyWatchers::default();
        drop(watchers.add(b"k", 5));
        let mut kept = watchers.add(b"k", 5);
        assert_eq!(watchers.by_key[b"k".as_slice()].len(), 1);
        watchers.fire_all();
        assert!(kept.try_recv().is_ok());
        assert_eq!(watchers.keys(), 0);
    }
}
