//! The store contract under FoundationDB's failure modes, through the fault-injecting
//! wrapper on every engine (FoundationDB too with `--features fdb` and `FDB_CLUSTER_FILE`):
//! each fault reaches callers as the error FDB gives, and `Db::run` retries it the way that
//! keeps a transaction from applying twice or never returning.

use crate::support::deadline;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::store::Harness;
use couch_replicator::store::faulty::{CommitFault, FaultKind, FaultRates, FaultyStore};
use couch_replicator::store::{Db, RangeOptions, RetryPolicy, StoreError, TX_IDS, Tx, tuple};

fn faulty<H: Harness>(h: &H, rates: FaultRates) -> (FaultyStore, Db) {
    let f = FaultyStore::new(h.store(), rates, 7);
    let db = Db::new(Arc::new(f.clone())).with_txid_prefix(h.prefix());
    (f, db)
}

fn counter(v: Option<Vec<u8>>) -> i64 {
    v.map_or(0, |v| {
        i64::from_le_bytes(v.as_slice().try_into().expect("8 bytes"))
    })
}

/// Adds 1 to the counter at `key` through `db.run`; returns how often the body ran.
async fn bump(db: &Db, key: &[u8]) -> (Result<u32, StoreError>, u32) {
    let runs = AtomicU32::new(0);
    let result = db
        .run(|tx: Tx| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tx.atomic_add(key, 1);
                Ok::<_, StoreError>(n)
            }
        })
        .await;
    (result, runs.load(Ordering::SeqCst))
}

async fn read<H: Harness>(h: &H, key: &[u8]) -> i64 {
    let tx = h.db().begin().await.unwrap();
    counter(tx.get(key, true).await.unwrap())
}

fn txid_range<H: Harness>(h: &H) -> (Vec<u8>, Vec<u8>) {
    let mut begin = h.prefix().to_vec();
    begin.extend_from_slice(&tuple::pack(&(TX_IDS,)));
    let mut end = begin.clone();
    end.push(0xFF);
    (begin, end)
}

mod cases {
    use super::*;

    /// 1021 after a commit that landed: the retry finds the transaction id and returns the
    /// first attempt's result; the body's effect is applied once.
    pub async fn unknown_result_after_applied_commit_applies_once<H: Harness>(h: H) {
        let (f, db) = faulty(&h, FaultRates::none());
        let key = h.key("n");
        f.force_commit_fault(CommitFault::UnknownApplied);
        let (result, runs) = bump(&db, &key).await;
        assert_eq!(result, Ok(1), "the first attempt's result");
        assert_eq!(runs, 1);
        assert_eq!(read(&h, &key).await, 1, "applied exactly once");
        assert_eq!(f.count(FaultKind::UnknownApplied), 1);
        h.finish().await;
    }

    /// 1021 after a commit that did not land: the body runs again and applies once.
    pub async fn unknown_result_without_commit_is_retried<H: Harness>(h: H) {
        let (f, db) = faulty(&h, FaultRates::none());
        let key = h.key("n");
        f.force_commit_fault(CommitFault::UnknownNotApplied);
        f.force_commit_fault(CommitFault::UnknownNotApplied);
        let (result, runs) = bump(&db, &key).await;
        assert_eq!(result, Ok(3));
        assert_eq!(runs, 3);
        assert_eq!(read(&h, &key).await, 1);
        h.finish().await;
    }

    /// 1020 and 1007 are retried until the body commits.
    pub async fn conflicts_and_too_old_reads_are_retried<H: Harness>(h: H) {
        let (f, db) = faulty(&h, FaultRates::none());
        let key = h.key("n");
        f.force_commit_fault(CommitFault::Conflict);
        f.force_too_old_reads(2);
        let runs = AtomicU32::new(0);
        let seen = db
            .run(|tx: Tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                let key = key.clone();
                async move {
                    let v = counter(tx.get(&key, false).await?);
                    tx.atomic_add(&key, 1);
                    Ok::<_, StoreError>(v)
                }
            })
            .await;
        assert_eq!(seen, Ok(0));
        assert_eq!(
            runs.load(Ordering::SeqCst),
            4,
            "2 too_old + 1 conflict + 1 commit"
        );
        assert_eq!(read(&h, &key).await, 1);
        assert_eq!(f.count(FaultKind::TooOld), 2);
        assert_eq!(f.count(FaultKind::Conflict), 1);
        h.finish().await;
    }

    /// A commit that never returns ends in 1031 at the run's timeout, whether it landed or
    /// not; the caller learns the outcome is unknown, never a false success.
    pub async fn hung_commit_times_out<H: Harness>(h: H) {
        let (f, db) = faulty(&h, FaultRates::none());
        let db = db.with_retry(RetryPolicy {
            timeout: Some(Duration::from_millis(300)),
            ..RetryPolicy::default()
        });
        let key = h.key("n");
        f.force_commit_fault(CommitFault::Hang { applied: false });
        assert_eq!(bump(&db, &key).await.0, Err(StoreError::TimedOut));
        assert_eq!(read(&h, &key).await, 0);
        f.force_commit_fault(CommitFault::Hang { applied: true });
        assert_eq!(bump(&db, &key).await.0, Err(StoreError::TimedOut));
        assert_eq!(read(&h, &key).await, 1);
        assert!(!StoreError::TimedOut.is_retryable());
        h.finish().await;
    }

    /// `retry_limit`: a transaction that always conflicts gives up after max_attempts.
    pub async fn retry_limit_bounds_attempts<H: Harness>(h: H) {
        let rates = FaultRates {
            conflict: 1.0,
            ..FaultRates::none()
        };
        let (_f, db) = faulty(&h, rates);
        let db = db.with_retry(RetryPolicy {
            max_attempts: 5,
            ..RetryPolicy::default()
        });
        let key = h.key("n");
        let (result, runs) = bump(&db, &key).await;
        assert_eq!(result, Err(StoreError::Conflict));
        assert_eq!(runs, 5);
        assert_eq!(read(&h, &key).await, 0);
        h.finish().await;
    }

    /// Watches may fire with no change (callers re-read) or late (callers wait).
    pub async fn watches_fire_spuriously_or_late<H: Harness>(h: H) {
        let rates = FaultRates {
            watch_spurious: 1.0,
            ..FaultRates::none()
        };
        let (_f, db) = faulty(&h, rates);
        let key = h.key("w");
        let tx = db.begin().await.unwrap();
        let watch = tx.watch(&key);
        tx.commit().await.unwrap();
        watch.await.expect("a spurious fire is a success");
        assert_eq!(read(&h, &key).await, 0, "nothing changed");

        let rates = FaultRates {
            watch_late: 1.0,
            max_delay: Duration::from_millis(50),
            ..FaultRates::none()
        };
        let (f, db) = faulty(&h, rates);
        let tx = db.begin().await.unwrap();
        let watch = tx.watch(&key);
        tx.commit().await.unwrap();
        f.set_enabled(false);
        bump(&db, &key).await.0.unwrap();
        watch.await.expect("a late watch still fires");
        assert_eq!(f.count(FaultKind::WatchLate), 1);
        h.finish().await;
    }

    /// Every write commits a transaction id; landed ids are cleared by later writes, so
    /// they do not pile up, and read-only runs write none.
    pub async fn transaction_ids_are_cleared<H: Harness>(h: H) {
        let (_f, db) = faulty(&h, FaultRates::none());
        let key = h.key("n");
        for _ in 0..150 {
            bump(&db, &key).await.0.unwrap();
        }
        let (begin, end) = txid_range(&h);
        let before = db
            .run(|tx: Tx| {
                let (begin, end) = (begin.clone(), end.clone());
                async move { tx.get_range(&begin, &end, RangeOptions::all()).await }
            })
            .await
            .unwrap()
            .len();
        assert!((1..=65).contains(&before), "{before} ids left");
        assert_eq!(db.txid_backlog(), before);
        assert_eq!(read(&h, &key).await, 150);
        h.finish().await;
    }
}

macro_rules! faults {
    ($engine:ident, $make:expr) => {
        mod $engine {
            #[allow(unused_imports)]
            use super::*;
            faults!(@cases $make, [
                unknown_result_after_applied_commit_applies_once,
                unknown_result_without_commit_is_retried,
                conflicts_and_too_old_reads_are_retried,
                hung_commit_times_out,
                retry_limit_bounds_attempts,
                watches_fire_spuriously_or_late,
                transaction_ids_are_cleared,
            ]);
        }
    };
    (@cases $make:expr, [$($case:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                #[allow(clippy::redundant_closure_call)]
                if let Some(h) = $make.await {
                    deadline(60, stringify!($case), cases::$case(h)).await;
                }
            }
        )*
    };
}

faults!(embedded, async {
    Some(crate::support::store::Embedded::new().await)
});
faults!(memory, async {
    Some(crate::support::store::Memory::new().await)
});
faults!(etcd, crate::support::store::Etcd::new());
#[cfg(feature = "fdb")]
faults!(foundationdb, crate::support::store::Fdb::new());
