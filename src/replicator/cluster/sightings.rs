//! Whether a member is alive, judged without trusting anyone's wall clock: [`Sightings`]
//! remembers, per member, the heartbeat row last read and when (on this process's monotonic
//! clock) it last changed. A member is silent for as long as its row has not changed.
//!
//! Comparing the row's writer wall clock with the reader's let a node whose clock ran 90 s
//! ahead see every other heartbeat as 90 s old and remove its neighbours again and again,
//! taking over the cluster's jobs. A row changes at every beat (it carries a beat count),
//! so only a member that stopped beating stays unchanged, whatever the clocks say. The price:
//! a member first seen is given `dead_after` of observation before it can be judged dead.
//!
//! The rows' wall clocks still serve one purpose, the schedule: couch_jobs compares the
//! times jobs are scheduled for with each node's "now", so a node 90 s behind saw jobs
//! enqueued by the others as 90 s in the future and took none of them. Each changed row is
//! therefore also a sample of its writer's clock against ours (written minus read, the best
//! of the last [`SAMPLES`] being the one read soonest after its write), and the jobs clock is
//! moved to the median of the members' clocks (ours counting as one; offsets under
//! [`DEAD_BAND_MS`] are left at zero), so every node schedules on about the same time. Only pending jobs' eligibility depends on it; who is
//! alive and who runs a job never does.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::jobs::CorrectedClock;
use crate::replicator::node::name::NodeName;

/// Clock samples kept per member.
pub const SAMPLES: usize = 8;
/// How long a member's clock still counts after its last sample: a member that leaves for a
/// restart (or is cut off for a while) keeps its vote, so the consensus does not jump when
/// the membership shrinks. Without it, nodes at +0 and +90 s whose third member (at -90 s)
/// left for a restart jumped to +45 s, and the jobs they handed back waited 45 s for the
/// restarted node, still at +0.
pub const REMEMBER: Duration = Duration::from_secs(600);
/// Offsets smaller than this are left at zero: the samples' own error (a row is read up to a
/// heartbeat after its write) is of this order, and synchronised clocks need no correction.
pub const DEAD_BAND_MS: i64 = 2_000;

/// The jobs clock to correct, and which member is this node.
#[derive(Debug)]
struct Consensus {
    clock: Arc<CorrectedClock>,
    me: NodeName,
    /// Per other member: its row's time minus our base clock's when we saw it change, and
    /// when the last of them was taken.
    samples: HashMap<NodeName, (VecDeque<i64>, Instant)>,
}

impl Consensus {
    fn sample(&mut self, node: &NodeName, row: &[u8]) {
        let Some(written) = row.get(..8).and_then(|b| b.try_into().ok()) else {
            return;
        };
        if *node == self.me {
            return;
        }
        let sample = i64::from_le_bytes(written) - self.clock.base_ms();
        let (kept, at) = self
            .samples
            .entry(node.clone())
            .or_insert_with(|| (VecDeque::new(), Instant::now()));
        if kept.len() == SAMPLES {
            kept.pop_front();
        }
        kept.push_back(sample);
        *at = Instant::now();
        self.settle();
    }

    /// Moves the clock to the median of the members' clocks, ours (offset 0) included.
    fn settle(&self) {
        let mut offsets: Vec<i64> = self
            .samples
            .values()
            .filter(|(_, at)| at.elapsed() < REMEMBER)
            .filter_map(|(s, _)| s.iter().max().copied())
            .collect();
        offsets.push(0);
        offsets.sort_unstable();
        let mid = offsets.len() / 2;
        let median = if offsets.len() % 2 == 1 {
            offsets[mid]
        } else {
            (offsets[mid - 1] + offsets[mid]) / 2
        };
        self.clock.set_offset_ms(if median.abs() < DEAD_BAND_MS {
            0
        } else {
            median
        });
    }
}

/// Member rows as last read, and since when each has not changed.
#[derive(Debug, Default)]
pub struct Sightings {
    seen: Mutex<HashMap<NodeName, (Vec<u8>, Instant)>>,
    consensus: Option<Mutex<Consensus>>,
}

impl Sightings {
    /// Sightings that also move `clock` to the members' median clock; `me` is this node.
    pub fn with_clock(clock: Arc<CorrectedClock>, me: NodeName) -> Self {
        Self {
            seen: Mutex::default(),
            consensus: Some(Mutex::new(Consensus {
                clock,
                me,
                samples: HashMap::new(),
            })),
        }
    }

    /// This machine's own wall clock (the jobs clock without the correction), the time a
    /// heartbeat row carries; `None` without a clock to correct.
    pub fn local_ms(&self) -> Option<i64> {
        let c = self.consensus.as_ref()?.lock().ok()?;
        Some(c.clock.base_ms())
    }

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
                drop(seen);
                self.sample(node, row);
                Duration::ZERO
            }
            None => {
                seen.insert(node.clone(), (row.to_vec(), now));
                Duration::ZERO
            }
        }
    }

    fn sample(&self, node: &NodeName, row: &[u8]) {
        if let Some(c) = &self.consensus
            && let Ok(mut c) = c.lock()
        {
            c.sample(node, row);
        }
    }

    /// Forgets the rows of members not in `present` (they left or were removed); their
    /// clocks still count for [`REMEMBER`].
    pub fn keep_only(&self, present: &[NodeName]) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.retain(|n, _| present.contains(n));
        }
        if let Some(c) = &self.consensus
            && let Ok(mut c) = c.lock()
        {
            c.samples.retain(|_, (_, at)| at.elapsed() < REMEMBER);
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
        assert_eq!(
            s.silent_for(&b, b"2"),
            Duration::ZERO,
            "forgotten, seen anew"
        );
    }

    fn row(ms: i64, beat: u64) -> Vec<u8> {
        let mut r = ms.to_le_bytes().to_vec();
        r.push(1);
        r.extend_from_slice(&beat.to_le_bytes());
        r
    }

    /// Sightings of node `me` correcting a manual clock at 1,000,000 ms.
    fn corrected() -> (
        Arc<crate::jobs::ManualClock>,
        Arc<CorrectedClock>,
        Sightings,
        NodeName,
    ) {
        let base = Arc::new(crate::jobs::ManualClock::new(1_000_000));
        let clock = Arc::new(CorrectedClock::new(base.clone()));
        let me: NodeName = "me".into();
        let s = Sightings::with_clock(clock.clone(), me.clone());
        (base, clock, s, me)
    }

    #[test]
    fn the_jobs_clock_moves_to_the_members_median() {
        let (base, clock, s, me) = corrected();
        let (ahead, behind): (NodeName, NodeName) = ("ahead".into(), "behind".into());
        // Rows are sampled when they change: first sightings set nothing.
        s.silent_for(&ahead, &row(1_090_000, 0));
        s.silent_for(&me, &row(1_000_000, 0));
        assert_eq!(clock.offset_ms(), 0);
        // One member 90 s ahead, read 400 ms and then 100 ms after its writes: the best
        // sample (read soonest) counts; with us at 0 the median of two is half-way.
        base.set_ms(1_002_400);
        s.silent_for(&ahead, &row(1_092_000, 1));
        base.set_ms(1_004_100);
        s.silent_for(&ahead, &row(1_094_000, 2));
        assert_eq!(clock.offset_ms(), 89_900 / 2);
        // Our own row never counts, a third member 90 s behind makes us the median.
        s.silent_for(&me, &row(1_004_100, 1));
        s.silent_for(&behind, &row(914_000, 0));
        s.silent_for(&behind, &row(914_100, 1));
        assert_eq!(clock.offset_ms(), 0);
        // The member ahead leaves (a restart): its clock still counts, nothing moves.
        s.keep_only(&[me.clone(), behind.clone()]);
        s.silent_for(&behind, &row(914_200, 2));
        assert_eq!(clock.offset_ms(), 0);
        assert_eq!(s.local_ms(), Some(1_004_100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_gone_for_long_stops_counting_and_small_offsets_are_ignored() {
        let (_base, clock, s, me) = corrected();
        let (ahead, near): (NodeName, NodeName) = ("ahead".into(), "near".into());
        s.silent_for(&ahead, &row(1_090_000, 0));
        s.silent_for(&ahead, &row(1_090_000, 1));
        assert_eq!(clock.offset_ms(), 45_000);
        tokio::time::advance(REMEMBER).await;
        s.keep_only(std::slice::from_ref(&me));
        // A member a second off (a row read late) moves nothing.
        s.silent_for(&near, &row(1_000_000, 0));
        s.silent_for(&near, &row(1_001_500, 1));
        assert_eq!(clock.offset_ms(), 0);
    }
}
