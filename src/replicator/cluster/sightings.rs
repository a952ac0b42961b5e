//! Whether a member is alive, judged without trusting anyone's wall clock: [`Sightings`]
//! remembers, per member, the heartbeat row last read and when (on this process's monotonic
//! clock) it last changed. A member is silent for as long as its row has not changed.
//!
//! Comparing the row's writer wall clock with the reader's let a node whose clock ran 90 s
//! ahead see every other heartbeat as 90 s old and remove its neighbours again and again,
//! taking over the cluster's jobs. A row changes at every beat (it carries a beat count),
//! so only a member that stopped beating stays unchanged, whatever the clocks say. The price:
//! a member first seen is given `dead_after` of observation before it can be judged dead.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::replicator::node::name::NodeName;

/// Member rows as last read, and since when each has not changed.
#[derive(Debug, Default)]
pub struct Sightings {
    seen: Mutex<HashMap<NodeName, (Vec<u8>, Instant)>>,
}

impl Sightings {
    /// Records `row` as `node`'s heartbeat row read now; returns how long it has been the
    /// same (zero when it changed, or the member is new to this process).
    pub fn silent_for(&self, node: &NodeName, row: &[u8]) -> Duration {
        let now = Instant::now();
        let Ok(mut seen) = self.seen.lock() else {
            return Duration::ZERO;
        };
        match seen.get_mut(node) {
            Some((last, since)) if last.as_slice() == row => now.duration_since(*since),
            Some(entry) => {
                *entry = (row.to_vec(), now);
                Duration::ZERO
            }
            None => {
                seen.insert(node.clone(), (row.to_vec(), now));
                Duration::ZERO
            }
        }
    }

    /// Forgets members not in `present` (they left or were removed).
    pub fn keep_only(&self, present: &[NodeName]) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.retain(|n, _| present.contains(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn silence_is_measured_from_the_last_change_on_the_readers_clock() {
        let s = Sightings::default();
        let b: NodeName = "b".into();
        assert_eq!(s.silent_for(&b, b"1"), Duration::ZERO, "first sighting");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(s.silent_for(&b, b"1"), Duration::from_secs(5));
        assert_eq!(s.silent_for(&b, b"2"), Duration::ZERO, "it beat");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(s.silent_for(&b, b"2"), Duration::from_secs(3));
        s.keep_only(&[]);
        assert_eq!(s.silent_for(&b, b"2"), Duration::ZERO, "forgotten, seen anew");
    }
}
