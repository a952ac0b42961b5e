//! A batch's writes as etcd operations.
//!
//! The mutation logs of the batch's transactions, in order, fold into one final state per
//! key plus the cleared ranges (merged), as if they had committed one after the other;
//! at commit, with the stamp and the current values of atomically added keys known, that
//! becomes `Put`s, single-key deletes and `DeleteRange`s split around every key written
//! after a clear, because etcd refuses a `Txn` that writes a key twice or puts inside a
//! deleted range.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use etcd_client::{DeleteOptions, TxnOp};

use super::Keys;
use crate::store::embedded::writes::Mutation;
use crate::store::{
    StoreError, apply_atomic_add, commit_stamp, fill_versionstamp, split_versionstamp_operand,
    strinc,
};

/// What the transaction leaves in one key.
#[derive(Debug, Clone)]
enum Final {
    Value(Vec<u8>),
    Cleared,
    /// Adds on the value the key has at commit.
    Add(i64),
    /// A versionstamped value operand, and the order of its transaction in the batch.
    Stamped(Vec<u8>, u16),
}

/// The writes of one transaction, in etcd keys.
#[derive(Debug, Default)]
pub(crate) struct WritePlan {
    keys: BTreeMap<Vec<u8>, Final>,
    /// Disjoint, sorted cleared ranges.
    cleared: Vec<(Vec<u8>, Vec<u8>)>,
    /// Versionstamped-key operands (etcd key space), values, and transaction orders.
    stamped_keys: Vec<(Vec<u8>, Vec<u8>, u16)>,
}

/// A key and a value, or a begin and an end.
type Span = (Vec<u8>, Vec<u8>);

/// The current value of a key an atomic add applies to.
pub(crate) type Bases = HashMap<Vec<u8>, Option<Vec<u8>>>;

fn in_ranges(ranges: &[(Vec<u8>, Vec<u8>)], key: &[u8]) -> bool {
    ranges
        .iter()
        .any(|(b, e)| b.as_slice() <= key && key < e.as_slice())
}

/// Sorted, merged copy of `ranges`.
fn merge(mut ranges: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    ranges.sort();
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(ranges.len());
    for (b, e) in ranges {
        match out.last_mut() {
            Some(last) if b <= last.1 => {
                if e > last.1 {
                    last.1 = e;
                }
            }
            _ => out.push((b, e)),
        }
    }
    out
}

impl WritePlan {
    /// Folds the mutation log (store keys) of the batch's transaction number `order` into
    /// the final states (etcd keys), after the transactions folded before it.
    pub(crate) fn fold(
        &mut self,
        keys: &Keys,
        ops: &[Mutation],
        order: u16,
    ) -> Result<(), StoreError> {
        let plan = self;
        let mut cleared = std::mem::take(&mut plan.cleared);
        for op in ops.iter().cloned() {
            match op {
                Mutation::Set(k, v) => {
                    plan.keys.insert(keys.data(&k), Final::Value(v));
                }
                Mutation::Clear(k) => {
                    plan.keys.insert(keys.data(&k), Final::Cleared);
                }
                Mutation::ClearRange(b, e) => {
                    let (b, e) = (keys.data(&b), keys.data(&e));
                    let inside: Vec<Vec<u8>> = plan
                        .keys
                        .range::<[u8], _>((Bound::Included(&b[..]), Bound::Excluded(&e[..])))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in inside {
                        plan.keys.remove(&k);
                    }
                    cleared.push((b, e));
                }
                Mutation::Add(k, delta) => {
                    let k = keys.data(&k);
                    let next = match plan.keys.get(&k) {
                        Some(Final::Value(v)) => Final::Value(apply_atomic_add(Some(v), delta)),
                        Some(Final::Cleared) => Final::Value(apply_atomic_add(None, delta)),
                        Some(Final::Add(d)) => Final::Add(d.wrapping_add(delta)),
                        Some(Final::Stamped(v, o)) => Final::Stamped(v.clone(), *o),
                        None if in_ranges(&cleared, &k) => {
                            Final::Value(apply_atomic_add(None, delta))
                        }
                        None => Final::Add(delta),
                    };
                    plan.keys.insert(k, next);
                }
                Mutation::VersionstampedKey(operand, v) => {
                    let (bytes, offset) = split_versionstamp_operand(&operand)?;
                    let mut etcd_operand = keys.data(bytes);
                    let shift = etcd_operand.len() - bytes.len();
                    etcd_operand.extend_from_slice(&((offset + shift) as u32).to_le_bytes());
                    plan.stamped_keys.push((etcd_operand, v, order));
                }
                Mutation::VersionstampedValue(k, operand) => {
                    plan.keys
                        .insert(keys.data(&k), Final::Stamped(operand, order));
                }
            }
        }
        plan.cleared = merge(cleared);
        Ok(())
    }

    /// Keys whose new value depends on their value at commit.
    pub(crate) fn add_keys(&self) -> Vec<Vec<u8>> {
        self.keys
            .iter()
            .filter(|(_, f)| matches!(f, Final::Add(_)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The value an atomically added key gets from `bases`.
    pub(crate) fn added_value(&self, key: &[u8], bases: &Bases) -> Option<Vec<u8>> {
        match self.keys.get(key) {
            Some(Final::Add(delta)) => {
                let base = bases.get(key).cloned().flatten();
                Some(apply_atomic_add(base.as_deref(), *delta))
            }
            _ => None,
        }
    }

    /// An upper bound of the operations [`WritePlan::ops`] makes.
    pub(crate) fn op_estimate(&self) -> usize {
        self.keys.len() + self.stamped_keys.len() * 2 + self.cleared.len() * 2
    }

    /// Bytes the operations carry (keys and values).
    pub(crate) fn byte_estimate(&self) -> usize {
        let keys: usize = self
            .keys
            .iter()
            .map(|(k, f)| {
                k.len()
                    + match f {
                        Final::Value(v) | Final::Stamped(v, _) => v.len(),
                        Final::Cleared => 0,
                        Final::Add(_) => 8,
                    }
            })
            .sum();
        let stamped: usize = self
            .stamped_keys
            .iter()
            .map(|(k, v, _)| k.len() + v.len())
            .sum();
        let cleared: usize = self.cleared.iter().map(|(b, e)| b.len() + e.len()).sum();
        keys + stamped + cleared + 16 * self.op_estimate()
    }

    /// The final puts (etcd key → value) for this stamp and these add bases.
    fn puts(&self, counter: u64, bases: &Bases) -> Result<Vec<Span>, StoreError> {
        let mut puts = BTreeMap::new();
        for (k, f) in &self.keys {
            let value = match f {
                Final::Value(v) => v.clone(),
                Final::Cleared => continue,
                Final::Add(delta) => {
                    let base = bases.get(k).cloned().flatten();
                    apply_atomic_add(base.as_deref(), *delta)
                }
                Final::Stamped(operand, order) => {
                    fill_versionstamp(operand, &commit_stamp(counter, *order))?
                }
            };
            puts.insert(k.clone(), value);
        }
        for (operand, v, order) in &self.stamped_keys {
            puts.insert(
                fill_versionstamp(operand, &commit_stamp(counter, *order))?,
                v.clone(),
            );
        }
        Ok(puts.into_iter().collect())
    }

    /// The etcd operations of this plan.
    pub(crate) fn ops(&self, counter: u64, bases: &Bases) -> Result<Vec<TxnOp>, StoreError> {
        let puts = self.puts(counter, bases)?;
        let mut ops = Vec::with_capacity(puts.len() + self.cleared.len());
        for (b, e) in &self.cleared {
            // The range minus the keys put inside it, as consecutive pieces.
            let mut from = b.clone();
            for (k, _) in puts.iter().filter(|(k, _)| b <= k && k < e) {
                if from < *k {
                    ops.push(TxnOp::delete(
                        from.clone(),
                        Some(DeleteOptions::new().with_range(k.clone())),
                    ));
                }
                from = super::conflicts::point(k).1;
            }
            if from < *e {
                ops.push(TxnOp::delete(
                    from,
                    Some(DeleteOptions::new().with_range(e.clone())),
                ));
            }
        }
        for (k, f) in &self.keys {
            if matches!(f, Final::Cleared) && !in_ranges(&self.cleared, k) {
                ops.push(TxnOp::delete(k.clone(), None));
            }
        }
        for (k, v) in puts {
            ops.push(TxnOp::put(k, v, None));
        }
        Ok(ops)
    }
}

/// The spans a mutation log writes (etcd keys): keys and cleared ranges, for the
/// committer's check that no transaction of a batch read what another one writes. A
/// versionstamped key counts as the range under the bytes before its stamp.
pub(crate) fn write_spans(keys: &Keys, ops: &[Mutation]) -> Vec<(Vec<u8>, Vec<u8>)> {
    ops.iter()
        .filter_map(|op| match op {
            Mutation::Set(k, _)
            | Mutation::Clear(k)
            | Mutation::Add(k, _)
            | Mutation::VersionstampedValue(k, _) => Some(super::conflicts::point(&keys.data(k))),
            Mutation::ClearRange(b, e) => Some((keys.data(b), keys.data(e))),
            Mutation::VersionstampedKey(operand, _) => {
                let (bytes, offset) = split_versionstamp_operand(operand).ok()?;
                let head = keys.data(&bytes[..offset]);
                let end = strinc(&head).unwrap_or_else(|| vec![0xFF; head.len() + 1]);
                Some((head, end))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new(b"p/")
    }

    #[test]
    fn writes_after_a_clear_split_the_delete_range() {
        let ops = vec![
            Mutation::Set(b"x".to_vec(), b"0".to_vec()),
            Mutation::ClearRange(b"a".to_vec(), b"z".to_vec()),
            Mutation::Set(b"m".to_vec(), b"1".to_vec()),
            Mutation::Add(b"n".to_vec(), 2),
            Mutation::Add(b"zz".to_vec(), 3),
            Mutation::Clear(b"zzz".to_vec()),
        ];
        let mut plan = WritePlan::default();
        plan.fold(&keys(), &ops, 0).unwrap();
        assert_eq!(plan.add_keys(), vec![b"p/dzz".to_vec()]);
        let ops = plan.ops(1, &Bases::new()).unwrap();
        // [a, m) [m\0, n) [n\0, z), delete zzz, put m, n, zz.
        assert_eq!(ops.len(), 7);
    }

    #[test]
    fn ranges_merge() {
        let merged = merge(vec![
            (b"c".to_vec(), b"e".to_vec()),
            (b"a".to_vec(), b"c".to_vec()),
            (b"x".to_vec(), b"y".to_vec()),
        ]);
        assert_eq!(
            merged,
            vec![
                (b"a".to_vec(), b"e".to_vec()),
                (b"x".to_vec(), b"y".to_vec())
            ]
        );
    }
}
