//! Model-based test of the embedded engine's serializability.
//!
//! Proptest generates a few transactions (get, get_range with limit/reverse/snapshot, set,
//! clear, clear_range, atomic add over a small key space) and a schedule that interleaves
//! their begins, operations and commits; commits are spawned so that several land in one
//! group-commit batch. Then the committed history is replayed serially, in commit (stamp)
//! order, on the serial `MemoryStore`, and:
//! - every conflict-checked read of every committed writing transaction returns what the
//!   serial replay reads at that point;
//! - every read-only transaction (committed without the committer) read one consistent
//!   state: the state after some prefix of the commit order;
//! - a transaction without conflict-checked reads always commits; failures are only
//!   `Conflict`;
//! - the final contents equal the replay's.

use crate::support::deadline;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use crate::support::store::{Embedded, Harness};
use couch_replicator::store::memory::MemoryStore;
use couch_replicator::store::{
    CommitStamp, Db, KeyValue, RangeOptions, StoreError, Tx, apply_atomic_add,
};
use proptest::prelude::*;

const KEYS: u8 = 6;

#[derive(Debug, Clone)]
enum Op {
    Get {
        key: u8,
        snapshot: bool,
    },
    Range {
        begin: u8,
        end: u8,
        limit: Option<usize>,
        reverse: bool,
        snapshot: bool,
    },
    Set {
        key: u8,
        value: u8,
    },
    Clear {
        key: u8,
    },
    ClearRange {
        begin: u8,
        end: u8,
    },
    Add {
        key: u8,
        delta: i8,
    },
}

impl Op {
    fn writes(&self) -> bool {
        match self {
            Op::Get { .. } | Op::Range { .. } => false,
            Op::ClearRange { begin, end } => begin < end,
            _ => true,
        }
    }

    fn checked_read(&self) -> bool {
        matches!(
            self,
            Op::Get {
                snapshot: false,
                ..
            } | Op::Range {
                snapshot: false,
                ..
            }
        )
    }
}

fn key(k: u8) -> Vec<u8> {
    format!("k{k}").into_bytes()
}

fn read_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..KEYS, any::<bool>()).prop_map(|(key, snapshot)| Op::Get { key, snapshot }),
        (
            0..KEYS,
            1..=KEYS,
            prop::option::of(1..4usize),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(begin, end, limit, reverse, snapshot)| Op::Range {
                begin,
                end,
                limit,
                reverse,
                snapshot
            }),
    ]
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => read_op(),
        2 => (0..KEYS, any::<u8>()).prop_map(|(key, value)| Op::Set { key, value }),
        1 => (0..KEYS).prop_map(|key| Op::Clear { key }),
        1 => (0..KEYS, 1..=KEYS).prop_map(|(begin, end)| Op::ClearRange { begin, end }),
        2 => (0..KEYS, any::<i8>()).prop_map(|(key, delta)| Op::Add { key, delta }),
    ]
}

fn program() -> impl Strategy<Value = Vec<Vec<Op>>> {
    let tx = prop_oneof![
        1 => prop::collection::vec(read_op(), 1..4),
        3 => prop::collection::vec(any_op(), 1..6),
    ];
    prop::collection::vec(tx, 2..7)
}

/// What a read returned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Read {
    Value(Option<Vec<u8>>),
    Rows(Vec<KeyValue>),
}

async fn run_op(tx: &Tx, op: &Op) -> Result<Option<Read>, StoreError> {
    Ok(match op {
        Op::Get { key: k, snapshot } => Some(Read::Value(tx.get(&key(*k), *snapshot).await?)),
        Op::Range {
            begin,
            end,
            limit,
            reverse,
            snapshot,
        } => {
            let options = RangeOptions {
                limit: *limit,
                reverse: *reverse,
                snapshot: *snapshot,
            };
            Some(Read::Rows(
                tx.get_range(&key(*begin), &key(*end), options).await?,
            ))
        }
        Op::Set { key: k, value } => {
            tx.set(&key(*k), &[*value]);
            None
        }
        Op::Clear { key: k } => {
            tx.clear(&key(*k));
            None
        }
        Op::ClearRange { begin, end } => {
            tx.clear_range(&key(*begin), &key(*end));
            None
        }
        Op::Add { key: k, delta } => {
            tx.atomic_add(&key(*k), i64::from(*delta));
            None
        }
    })
}

/// A read-only transaction's reads evaluated on a plain committed state.
fn eval_read(state: &BTreeMap<Vec<u8>, Vec<u8>>, op: &Op) -> Option<Read> {
    match op {
        Op::Get { key: k, .. } => Some(Read::Value(state.get(&key(*k)).cloned())),
        Op::Range {
            begin,
            end,
            limit,
            reverse,
            ..
        } => {
            let (b, e) = (key(*begin), key(*end));
            if b >= e {
                return Some(Read::Rows(Vec::new()));
            }
            let range = state.range::<Vec<u8>, _>((Bound::Included(&b), Bound::Excluded(&e)));
            let to_kv = |(k, v): (&Vec<u8>, &Vec<u8>)| KeyValue {
                key: k.clone(),
                value: v.clone(),
            };
            let limit = limit.unwrap_or(usize::MAX);
            Some(Read::Rows(if *reverse {
                range.rev().take(limit).map(to_kv).collect()
            } else {
                range.take(limit).map(to_kv).collect()
            }))
        }
        _ => None,
    }
}

struct Outcome {
    reads: Vec<Option<Read>>,
    result: Result<Option<CommitStamp>, StoreError>,
}

enum Phase {
    Waiting,
    Running(Tx, usize, Vec<Option<Read>>),
    Committing,
    Done,
}

/// Runs the program on the embedded engine following `schedule`.
async fn run_embedded(db: &Db, program: &[Vec<Op>], schedule: &[u8]) -> Vec<Outcome> {
    let n = program.len();
    let mut phases: Vec<Phase> = (0..n).map(|_| Phase::Waiting).collect();
    type Committed = (Vec<Option<Read>>, Result<Option<CommitStamp>, StoreError>);
    let mut pending: Vec<(usize, tokio::task::JoinHandle<Committed>)> = Vec::new();
    let mut outcomes: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
    // After the schedule, finish every transaction in order.
    let tail = (0..n as u8).flat_map(|i| std::iter::repeat_n(i, 8));
    for pick in schedule.iter().copied().chain(tail) {
        if pick == u8::MAX {
            for (i, handle) in pending.drain(..) {
                let (reads, result) = handle.await.unwrap();
                outcomes[i] = Some(Outcome { reads, result });
            }
            continue;
        }
        let i = pick as usize % n;
        let phase = std::mem::replace(&mut phases[i], Phase::Done);
        phases[i] = match phase {
            Phase::Waiting => Phase::Running(db.begin().await.unwrap(), 0, Vec::new()),
            Phase::Running(tx, step, mut reads) if step < program[i].len() => {
                reads.push(run_op(&tx, &program[i][step]).await.unwrap());
                Phase::Running(tx, step + 1, reads)
            }
            Phase::Running(tx, _, reads) => {
                // Spawned: commits issued back to back share a group-commit batch.
                let handle = tokio::spawn(async move {
                    let result = tx.commit().await;
                    (reads, result)
                });
                pending.push((i, handle));
                Phase::Committing
            }
            other => other,
        };
    }
    for (i, handle) in pending {
        let (reads, result) = handle.await.unwrap();
        outcomes[i] = Some(Outcome { reads, result });
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every transaction finished"))
        .collect()
}

async fn dump(db: &Db) -> Vec<KeyValue> {
    let tx = db.begin().await.unwrap();
    tx.get_range(b"", b"\xff", RangeOptions::all().snapshot())
        .await
        .unwrap()
}

fn state_of(rows: &[KeyValue]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    rows.iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

async fn check(seed: Vec<(u8, u8)>, program: Vec<Vec<Op>>, schedule: Vec<u8>) {
    let h = Embedded::new().await;
    let db = h.db();
    let memory = MemoryStore::new();
    let mem_db = Db::new(Arc::new(memory.clone()));
    for target in [&db, &mem_db] {
        let tx = target.begin().await.unwrap();
        for (k, v) in &seed {
            tx.set(&key(*k), &[*v]);
        }
        tx.commit().await.unwrap();
    }

    let outcomes = run_embedded(&db, &program, &schedule).await;

    let mut writers: Vec<(CommitStamp, usize)> = Vec::new();
    for (i, outcome) in outcomes.iter().enumerate() {
        let checked = program[i].iter().any(Op::checked_read);
        match &outcome.result {
            Ok(Some(stamp)) => writers.push((*stamp, i)),
            Ok(None) => assert!(
                !program[i].iter().any(Op::writes),
                "tx {i} wrote but got no stamp"
            ),
            Err(StoreError::Conflict) => {
                assert!(checked, "tx {i} had no checked reads but conflicted")
            }
            Err(e) => panic!("tx {i} failed with {e}"),
        }
    }
    writers.sort();

    // Serial replay in commit order; remember the state after every prefix.
    let mut states = vec![memory.dump()];
    for (_, i) in &writers {
        let tx = mem_db.begin().await.unwrap();
        let mut reads = Vec::new();
        for op in &program[*i] {
            reads.push(run_op(&tx, op).await.unwrap());
        }
        tx.commit().await.unwrap();
        for (step, op) in program[*i].iter().enumerate() {
            if op.checked_read() {
                assert_eq!(
                    outcomes[*i].reads[step], reads[step],
                    "tx {i} step {step} ({op:?}) read differently from the serial replay"
                );
            }
        }
        states.push(memory.dump());
    }
    for (i, outcome) in outcomes.iter().enumerate() {
        if program[i].iter().any(Op::writes) || outcome.result.is_err() {
            continue;
        }
        let consistent = states.iter().any(|rows| {
            let state = state_of(rows);
            program[i]
                .iter()
                .zip(&outcome.reads)
                .all(|(op, read)| eval_read(&state, op) == *read)
        });
        assert!(
            consistent,
            "read-only tx {i} saw no committed state: {:?}",
            outcome.reads
        );
    }
    assert_eq!(dump(&db).await, memory.dump(), "final contents differ");
    // Sanity for the model itself: atomic adds really are little-endian adds.
    assert_eq!(apply_atomic_add(Some(&[1]), 1), 2i64.to_le_bytes());
    h.finish().await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn concurrent_history_is_serializable(
        seed in prop::collection::vec((0..KEYS, any::<u8>()), 0..5),
        program in program(),
        schedule in prop::collection::vec(prop_oneof![8 => 0..32u8, 1 => Just(u8::MAX)], 0..60),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            deadline(60, "a model case", check(seed, program, schedule)).await;
        });
    }
}
