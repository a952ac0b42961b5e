//! What the committer predicts the clock and the keys of atomic adds will hold once the
//! `Txn`s it has in flight apply, so that the next `Txn` goes out before they answer
//! (pipelined commits).
//!
//! Because mod revisions are unknown until a `Txn` answers, the compares that chain `Txn`s
//! are on values: the clock's counter `VALUE ==` the predicted one, an added key `VALUE ==`
//! its predicted sum, `VERSION == 0` for a key predicted absent. A wrong prediction (a `Txn`
//! before it failed, another process committed, etcd applied two of ours out of order) only
//! makes a `Txn` fail those compares: its failure branch reads the real values, which
//! replace the prediction, and the `Txn` is rebuilt. Correctness never rests on the order in
//! which etcd applies our `Txn`s; only throughput does.
//!
//! Each reset starts a new epoch: a `Txn` reserved before the reset that fails afterwards
//! does not reset again (its failure is explained by the reset's cause, and the tip already
//! reflects newer `Txn`s).

use std::sync::{Mutex, MutexGuard};

use etcd_client::{Compare, CompareOp};

use super::Clock;
use super::plan::{Bases, WritePlan};

/// Predicted add keys kept at most (the hot ones are a few per job type).
const MAX_ADDS: usize = 1024;

/// What a `Txn` was built on: the clock before it, the clock it writes, and the values its
/// adds apply to.
#[derive(Debug, Clone)]
pub(crate) struct Basis {
    pub(crate) epoch: u64,
    pub(crate) clock: Clock,
    pub(crate) next: Clock,
    pub(crate) bases: Bases,
}

/// The clock and add keys' values as read from etcd.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub(crate) clock: Clock,
    pub(crate) adds: Bases,
}

#[derive(Default)]
struct State {
    epoch: u64,
    /// The clock after every reserved `Txn`; `None` when unknown (read it).
    clock: Option<Clock>,
    adds: Bases,
}

/// The prediction, shared by the committer's `Txn`s.
#[derive(Default)]
pub(crate) struct Tip(Mutex<State>);

impl Tip {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A clock a linearizable read saw, used when nothing is predicted.
    pub(crate) fn saw_clock(&self, clock: Clock) {
        let mut state = self.lock();
        if state.clock.is_none() {
            state.clock = Some(clock);
        }
    }

    /// Fills in what a read found wherever nothing is predicted.
    pub(crate) fn learn(&self, seen: Seen) {
        let mut state = self.lock();
        if state.clock.is_none() {
            state.clock = Some(seen.clock);
        }
        for (key, value) in seen.adds {
            state.adds.entry(key).or_insert(value);
        }
    }

    /// The basis of the next `Txn` writing `plan` (whose atomic adds touch `adds`), and the
    /// tip moved past it; `None` when the clock or an added key is unknown (read them).
    pub(crate) fn reserve(&self, plan: &WritePlan, adds: &[Vec<u8>]) -> Option<Basis> {
        let mut state = self.lock();
        let clock = state.clock?;
        let bases: Bases = adds
            .iter()
            .map(|k| state.adds.get(k).map(|v| (k.clone(), v.clone())))
            .collect::<Option<_>>()?;
        let next = clock.next();
        state.clock = Some(next);
        if state.adds.len() + adds.len() > MAX_ADDS {
            state.adds.retain(|k, _| adds.contains(k));
        }
        for key in adds {
            state
                .adds
                .insert(key.clone(), plan.added_value(key, &bases));
        }
        Some(Basis {
            epoch: state.epoch,
            clock,
            next,
            bases,
        })
    }

    /// A `Txn` built on a basis of `epoch` failed: what its failure branch read becomes the
    /// prediction, unless an earlier failure already reset it since that `Txn` was built.
    pub(crate) fn missed(&self, epoch: u64, seen: Seen) {
        let mut state = self.lock();
        if state.epoch == epoch {
            state.epoch += 1;
            state.clock = Some(seen.clock);
            state.adds = seen.adds;
        }
    }

    /// A `Txn`'s outcome is unknown (or it was never sent after its reservation): forget
    /// everything, the next `Txn` reads the clock and its added keys first.
    pub(crate) fn forget(&self) {
        let mut state = self.lock();
        state.epoch += 1;
        state.clock = None;
        state.adds.clear();
    }
}

/// `key` holds `value` (`None`: is absent). etcd's `VALUE` compare always fails on an absent
/// key, hence `VERSION == 0` for that case.
pub(crate) fn holds(key: Vec<u8>, value: &Option<Vec<u8>>) -> Compare {
    match value {
        Some(v) => Compare::value(key, CompareOp::Equal, v.clone()),
        None => Compare::version(key, CompareOp::Equal, 0),
    }
}

/// The clock holds `clock` (its default: the clock key was never written).
pub(crate) fn clock_holds(key: Vec<u8>, clock: Clock) -> Compare {
    holds(key, &clock.encode())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::writes::Mutation;

    fn plan_adding(key: &[u8], delta: i64) -> (WritePlan, Vec<Vec<u8>>) {
        let keys = super::super::Keys::new(b"p/");
        let mut plan = WritePlan::default();
        plan.fold(&keys, &[Mutation::Add(key.to_vec(), delta)], 0)
            .unwrap();
        let adds = plan.add_keys();
        (plan, adds)
    }

    #[test]
    fn reservations_chain_and_a_miss_resets_once_per_epoch() {
        let tip = Tip::default();
        let (plan, adds) = plan_adding(b"n", 1);
        assert!(tip.reserve(&plan, &adds).is_none());
        let mut seen = Seen {
            clock: Clock {
                counter: 7,
                nonce: 9,
            },
            ..Seen::default()
        };
        seen.adds.insert(adds[0].clone(), None);
        tip.learn(seen.clone());
        let first = tip.reserve(&plan, &adds).unwrap();
        let second = tip.reserve(&plan, &adds).unwrap();
        assert_eq!((first.clock.counter, second.clock.counter), (7, 8));
        assert_eq!(
            second.clock, first.next,
            "chained on the value the first writes"
        );
        assert_eq!(second.bases[&adds[0]], Some(1i64.to_le_bytes().to_vec()));
        tip.missed(first.epoch, seen.clone());
        // The second was built before the reset: its miss changes nothing.
        tip.missed(second.epoch, Seen::default());
        assert_eq!(tip.reserve(&plan, &adds).unwrap().clock, seen.clock);
    }
}
