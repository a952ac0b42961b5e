//! A transaction's range reads: the rows of `begin..end` at its revision, paged from the
//! replica or etcd ([`Cursor`]), merged in key order (or reversed) with the transaction's own
//! buffered writes (atomic adds applied to what was read), and the part of the range the
//! result depended on recorded as observed and, unless a snapshot read, in the read set.

use std::cmp::Ordering;
use std::collections::VecDeque;

use super::super::replica::Spec;
use super::{EtcdTx, finished, key_after};
use crate::store::embedded::writes::{Lookup, unreadable};
use crate::store::{KeyValue, RangeOptions, StoreError, apply_atomic_add};

/// A row read from etcd: store key, value, mod revision.
struct Row {
    key: Vec<u8>,
    value: Vec<u8>,
    mod_revision: i64,
}

/// Pages through `begin..end` (store keys) at one revision, in key order or reversed.
struct Cursor<'a> {
    tx: &'a EtcdTx,
    begin: Vec<u8>,
    end: Vec<u8>,
    reverse: bool,
    page: usize,
    rows: VecDeque<Row>,
    done: bool,
}

impl Cursor<'_> {
    async fn next(&mut self) -> Result<Option<Row>, StoreError> {
        if self.rows.is_empty() && !self.done {
            self.fetch().await?;
        }
        Ok(self.rows.pop_front())
    }

    async fn fetch(&mut self) -> Result<(), StoreError> {
        let keys = &self.tx.shared.keys;
        let spec = Spec {
            key: keys.data(&self.begin),
            end: Some(keys.data(&self.end)),
            limit: self.page as i64,
            reverse: self.reverse,
        };
        let page = self.tx.read(spec).await?;
        for kv in page.rows {
            if let Some(key) = keys.strip(&kv.key) {
                self.rows.push_back(Row {
                    key: key.to_vec(),
                    value: kv.value,
                    mod_revision: kv.mod_revision,
                });
            }
        }
        match self.rows.back() {
            Some(last) if page.more => {
                if self.reverse {
                    self.end = last.key.clone();
                } else {
                    self.begin = key_after(&last.key);
                }
            }
            _ => self.done = true,
        }
        Ok(())
    }
}

impl EtcdTx {
    /// Reads `begin..end` at `R` overlaid with the transaction's own writes, at most
    /// `options.limit` rows, recording what the result depended on.
    pub(super) async fn read_range(
        &self,
        begin: &[u8],
        end: &[u8],
        options: RangeOptions,
    ) -> Result<Vec<KeyValue>, StoreError> {
        if self.state().done {
            return Err(finished());
        }
        let limit = options.limit.unwrap_or(usize::MAX);
        if begin >= end || limit == 0 {
            return Ok(Vec::new());
        }
        let own = self.state().writes.keys_in(begin, end, options.reverse);
        let mut own = own.into_iter().peekable();
        let mut cursor = Cursor {
            tx: self,
            begin: begin.to_vec(),
            end: end.to_vec(),
            reverse: options.reverse,
            page: limit.saturating_add(own.len()).clamp(16, 1000),
            rows: VecDeque::new(),
            done: false,
        };
        let mut rows = Vec::new();
        let mut seen: Vec<(Vec<u8>, i64)> = Vec::new();
        let mut base = cursor.next().await?;
        while rows.len() < limit {
            let order = match (&base, own.peek()) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(row), Some(k)) => {
                    let o = row.key.as_slice().cmp(k.as_slice());
                    if options.reverse { o.reverse() } else { o }
                }
            };
            if order == Ordering::Less {
                if let Some(row) = base.take() {
                    seen.push((row.key.clone(), row.mod_revision));
                    if !self.state().writes.hides(&row.key) {
                        rows.push(KeyValue {
                            key: row.key,
                            value: row.value,
                        });
                    }
                }
                base = cursor.next().await?;
                continue;
            }
            let Some(key) = own.next() else { break };
            let base_value = if order == Ordering::Equal {
                let row = base.take();
                base = cursor.next().await?;
                row.map(|r| {
                    seen.push((r.key, r.mod_revision));
                    r.value
                })
            } else {
                None
            };
            let value = match self.state().writes.lookup(&key) {
                Lookup::Known(v) => v,
                Lookup::Unreadable => return Err(unreadable()),
                Lookup::Base(None) => base_value,
                Lookup::Base(Some(d)) => Some(apply_atomic_add(base_value.as_deref(), d)),
            };
            if let Some(value) = value {
                rows.push(KeyValue { key, value });
            }
        }
        self.record_range(begin, end, &rows, limit, options, seen);
        Ok(rows)
    }

    /// Records the part of the range the result depended on, and each row read in it: as
    /// observed, and in the read set unless the read was a snapshot read.
    fn record_range(
        &self,
        begin: &[u8],
        end: &[u8],
        rows: &[KeyValue],
        limit: usize,
        options: RangeOptions,
        seen: Vec<(Vec<u8>, i64)>,
    ) {
        let reverse = options.reverse;
        let (b, e) = match rows.last() {
            Some(last) if rows.len() >= limit => {
                if reverse {
                    (last.key.clone(), end.to_vec())
                } else {
                    (begin.to_vec(), key_after(&last.key))
                }
            }
            _ => (begin.to_vec(), end.to_vec()),
        };
        let keys = &self.shared.keys;
        let mut state = self.state();
        for (key, m) in seen {
            if b <= key && key < e {
                if !options.snapshot {
                    state.reads.key(keys.data(&key), m);
                }
                state.observed.keys.entry(key).or_insert(m);
            }
        }
        if !options.snapshot {
            state.reads.range(keys.data(&b), keys.data(&e));
        }
        state.observed.spans.push((b, e));
    }
}
