//! The store contract's conformance suite: every promise of `couch_replicator::store`, written
//! once and run against each engine. The embedded engine runs every case; the serial memory
//! engine the cases that never hold two transactions open in one task; FoundationDB all of
//! them when built with `--features fdb` and `FDB_CLUSTER_FILE` is set; the fault-injecting
//! wrapper (faults off) over the embedded engine all of them too. The fault cases themselves
//! are in `faults.rs`.

use crate::support::deadline;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::support::store::Harness;
use couch_replicator::store::{CommitStamp, KeyValue, RangeOptions, StoreError, Tx};
use futures::FutureExt;

async fn put<H: Harness>(h: &H, pairs: &[(&str, &str)]) -> CommitStamp {
    let tx = h.db().begin().await.unwrap();
    for (k, v) in pairs {
        tx.set(&h.key(k), v.as_bytes());
    }
    tx.commit()
        .await
        .unwrap()
        .expect("a writing commit has a stamp")
}

async fn read<H: Harness>(h: &H, k: &str) -> Option<Vec<u8>> {
    let tx = h.db().begin().await.unwrap();
    tx.get(&h.key(k), true).await.unwrap()
}

fn keys<H: Harness>(h: &H, rows: &[KeyValue]) -> Vec<String> {
    rows.iter()
        .map(|r| String::from_utf8_lossy(&r.key[h.prefix().len()..]).into_owned())
        .collect()
}

fn counter(v: Option<Vec<u8>>) -> i64 {
    let v = v.expect("counter present");
    i64::from_le_bytes(v.as_slice().try_into().expect("8 bytes"))
}

mod cases {
    use super::*;

    pub async fn get_set_clear<H: Harness>(h: H) {
        put(&h, &[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]).await;
        assert_eq!(read(&h, "a").await.as_deref(), Some(&b"1"[..]));
        assert_eq!(read(&h, "zz").await, None);
        let tx = h.db().begin().await.unwrap();
        tx.clear(&h.key("a"));
        tx.clear_range(&h.key("b"), &h.key("d"));
        tx.commit().await.unwrap();
        let tx = h.db().begin().await.unwrap();
        let rows = tx
            .get_range(&h.key(""), &h.end(), RangeOptions::all())
            .await
            .unwrap();
        assert_eq!(keys(&h, &rows), vec!["d"]);
        assert_eq!(rows[0].value, b"4");
        assert_eq!(
            tx.commit().await.unwrap(),
            None,
            "read-only commit has no stamp"
        );
        h.finish().await;
    }

    pub async fn range_limits_and_reverse<H: Harness>(h: H) {
        let pairs: Vec<(String, String)> = (0..10)
            .map(|i| (format!("k{i}"), format!("v{i}")))
            .collect();
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        put(&h, &refs).await;
        let tx = h.db().begin().await.unwrap();
        let (b, e) = (h.key("k"), h.key("l"));
        let all = tx.get_range(&b, &e, RangeOptions::all()).await.unwrap();
        assert_eq!(all.len(), 10);
        let first = tx
            .get_range(&b, &e, RangeOptions::all().limit(3))
            .await
            .unwrap();
        assert_eq!(keys(&h, &first), vec!["k0", "k1", "k2"]);
        let last = tx
            .get_range(&b, &e, RangeOptions::all().limit(3).reverse())
            .await
            .unwrap();
        assert_eq!(keys(&h, &last), vec!["k9", "k8", "k7"]);
        let inner = tx
            .get_range(&h.key("k3"), &h.key("k5"), RangeOptions::all())
            .await
            .unwrap();
        assert_eq!(keys(&h, &inner), vec!["k3", "k4"]);
        let back = tx
            .get_range(&h.key("k3"), &h.key("k6"), RangeOptions::all().reverse())
            .await
            .unwrap();
        assert_eq!(keys(&h, &back), vec!["k5", "k4", "k3"]);
        assert!(
            tx.get_range(&e, &b, RangeOptions::all())
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            tx.get_range(&b, &b, RangeOptions::all())
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            tx.get_range(&b, &e, RangeOptions::all().limit(0))
                .await
                .unwrap()
                .is_empty()
        );
        let many = tx
            .get_range(&b, &e, RangeOptions::all().limit(50).snapshot())
            .await
            .unwrap();
        assert_eq!(many, all);
        drop(tx);
        h.finish().await;
    }

    pub async fn read_your_writes<H: Harness>(h: H) {
        put(&h, &[("a", "1"), ("b", "2"), ("c", "3"), ("e", "5")]).await;
        let tx = h.db().begin().await.unwrap();
        tx.set(&h.key("d"), b"4");
        assert_eq!(
            tx.get(&h.key("d"), false).await.unwrap().as_deref(),
            Some(&b"4"[..])
        );
        tx.clear_range(&h.key("a"), &h.key("d"));
        assert_eq!(tx.get(&h.key("b"), false).await.unwrap(), None);
        assert_eq!(
            tx.get(&h.key("d"), false).await.unwrap().as_deref(),
            Some(&b"4"[..])
        );
        tx.set(&h.key("b"), b"new");
        tx.atomic_add(&h.key("n"), 5);
        tx.atomic_add(&h.key("n"), -2);
        assert_eq!(counter(tx.get(&h.key("n"), false).await.unwrap()), 3);
        let rows = tx
            .get_range(&h.key(""), &h.end(), RangeOptions::all())
            .await
            .unwrap();
        assert_eq!(keys(&h, &rows), vec!["b", "d", "e", "n"]);
        assert_eq!(rows[0].value, b"new");
        let rev = tx
            .get_range(&h.key(""), &h.end(), RangeOptions::all().reverse().limit(3))
            .await
            .unwrap();
        assert_eq!(keys(&h, &rev), vec!["n", "e", "d"]);
        tx.clear(&h.key("e"));
        let rows = tx
            .get_range(&h.key("c"), &h.end(), RangeOptions::all().limit(2))
            .await
            .unwrap();
        assert_eq!(keys(&h, &rows), vec!["d", "n"]);
        tx.commit().await.unwrap();
        let tx = h.db().begin().await.unwrap();
        let rows = tx
            .get_range(&h.key(""), &h.end(), RangeOptions::all())
            .await
            .unwrap();
        assert_eq!(keys(&h, &rows), vec!["b", "d", "n"]);
        assert_eq!(counter(Some(rows[2].value.clone())), 3);
        drop(tx);
        // An add on a key the transaction did not write applies to the stored value.
        let tx = h.db().begin().await.unwrap();
        tx.atomic_add(&h.key("n"), 10);
        assert_eq!(counter(tx.get(&h.key("n"), false).await.unwrap()), 13);
        tx.commit().await.unwrap();
        assert_eq!(counter(read(&h, "n").await), 13);
        h.finish().await;
    }

    /// Two transactions read then write the same key: the second to commit conflicts.
    pub async fn read_write_conflict<H: Harness>(h: H) {
        put(&h, &[("k", "0")]).await;
        let db = h.db();
        let t1 = db.begin().await.unwrap();
        let t2 = db.begin().await.unwrap();
        for (t, v) in [(&t1, "1"), (&t2, "2")] {
            assert_eq!(
                t.get(&h.key("k"), false).await.unwrap().as_deref(),
                Some(&b"0"[..])
            );
            t.set(&h.key("k"), v.as_bytes());
        }
        t1.commit().await.unwrap();
        assert_eq!(t2.commit().await, Err(StoreError::Conflict));
        assert!(StoreError::Conflict.is_retryable());
        assert_eq!(read(&h, "k").await.as_deref(), Some(&b"1"[..]));
        h.finish().await;
    }

    /// Concurrent read-modify-write through `Db::run`: every increment lands exactly once.
    pub async fn run_retries_until_all_commit<H: Harness>(h: H) {
        let db = h.db();
        let key = h.key("counter");
        let attempts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (db, key, attempts, barrier) =
                    (db.clone(), key.clone(), attempts.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    db.run(|tx: Tx| {
                        let key = key.clone();
                        attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        async move {
                            let n = match tx.get(&key, false).await? {
                                Some(v) => String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0),
                                None => 0,
                            };
                            tokio::task::yield_now().await;
                            tx.set(&key, (n + 1).to_string().as_bytes());
                            Ok::<_, StoreError>(())
                        }
                    })
                    .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(read(&h, "counter").await.as_deref(), Some(&b"8"[..]));
        assert!(attempts.load(std::sync::atomic::Ordering::SeqCst) >= 8);
        h.finish().await;
    }

    pub async fn snapshot_reads_do_not_conflict<H: Harness>(h: H) {
        put(&h, &[("a", "1"), ("b", "1")]).await;
        let db = h.db();
        let t1 = db.begin().await.unwrap();
        assert!(t1.get(&h.key("a"), true).await.unwrap().is_some());
        let rows = t1
            .get_range(&h.key(""), &h.end(), RangeOptions::all().snapshot())
            .await
            .unwrap();
        assert_eq!(rows.len(), 2);
        t1.set(&h.key("out1"), b"x");
        let t2 = db.begin().await.unwrap();
        t2.set(&h.key("a"), b"2");
        t2.set(&h.key("c"), b"2");
        t2.commit().await.unwrap();
        t1.commit().await.expect("snapshot reads never conflict");
        h.finish().await;
    }

    pub async fn explicit_read_conflict_ranges<H: Harness>(h: H) {
        let db = h.db();
        let t1 = db.begin().await.unwrap();
        t1.add_read_conflict_range(&h.key("a"), &h.key("c"));
        t1.set(&h.key("x"), b"1");
        let t2 = db.begin().await.unwrap();
        t2.set(&h.key("b"), b"1");
        t2.commit().await.unwrap();
        assert_eq!(t1.commit().await, Err(StoreError::Conflict));

        let t3 = db.begin().await.unwrap();
        t3.add_read_conflict_key(&h.key("k"));
        t3.set(&h.key("y"), b"1");
        let t4 = db.begin().await.unwrap();
        t4.set(&h.key("k\0"), b"1"); // just after the key: outside the range
        t4.commit().await.unwrap();
        t3.commit()
            .await
            .expect("a write next to the key does not conflict");

        // The key exists, so the clear below changes it: etcd conflicts on changed data,
        // not (as FoundationDB also does) on clears of keys that are absent anyway.
        put(&h, &[("k", "0")]).await;
        let t5 = db.begin().await.unwrap();
        t5.add_read_conflict_key(&h.key("k"));
        t5.set(&h.key("y"), b"2");
        let t6 = db.begin().await.unwrap();
        t6.clear_range(&h.key("j"), &h.key("l"));
        t6.commit().await.unwrap();
        assert_eq!(
            t5.commit().await,
            Err(StoreError::Conflict),
            "clear_range hits the key"
        );
        h.finish().await;
    }

    /// A limited range read conflicts only on the part of the range it returned.
    pub async fn range_read_conflicts_on_covered_part<H: Harness>(h: H) {
        put(&h, &[("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")]).await;
        let db = h.db();
        for (reverse, outside, inside) in [(false, "e", "a0"), (true, "cc", "dd")] {
            let opts = if reverse {
                RangeOptions::all().limit(2).reverse()
            } else {
                RangeOptions::all().limit(2)
            };
            let t1 = db.begin().await.unwrap();
            assert_eq!(
                t1.get_range(&h.key("a"), &h.key("n"), opts)
                    .await
                    .unwrap()
                    .len(),
                2
            );
            t1.set(&h.key("out"), b"1");
            let t2 = db.begin().await.unwrap();
            t2.set(&h.key(outside), b"1");
            t2.commit().await.unwrap();
            t1.commit().await.expect("write outside the covered part");

            let t3 = db.begin().await.unwrap();
            assert_eq!(
                t3.get_range(&h.key("a"), &h.key("n"), opts)
                    .await
                    .unwrap()
                    .len(),
                2
            );
            t3.set(&h.key("out"), b"2");
            let t4 = db.begin().await.unwrap();
            t4.set(&h.key(inside), b"1");
            t4.commit().await.unwrap();
            assert_eq!(
                t3.commit().await,
                Err(StoreError::Conflict),
                "reverse={reverse}"
            );
        }
        h.finish().await;
    }

    pub async fn blind_writes_and_atomic_adds_never_conflict<H: Harness>(h: H) {
        put(&h, &[("n", "")]).await;
        let db = h.db();
        let t1 = db.begin().await.unwrap();
        let t2 = db.begin().await.unwrap();
        for t in [&t1, &t2] {
            t.atomic_add(&h.key("n"), 7);
            t.set(&h.key("blind"), b"x");
            t.clear(&h.key("other"));
        }
        t1.commit().await.unwrap();
        t2.commit().await.expect("blind writes do not conflict");
        assert_eq!(counter(read(&h, "n").await), 14);
        // A reader that did not read "n" does not conflict with adds to it.
        let t3 = db.begin().await.unwrap();
        t3.get(&h.key("blind"), false).await.unwrap();
        t3.set(&h.key("z"), b"1");
        let t4 = db.begin().await.unwrap();
        t4.atomic_add(&h.key("n"), 1);
        t4.commit().await.unwrap();
        t3.commit().await.unwrap();
        h.finish().await;
    }

    /// Stamps increase across commits, are unique within concurrent batches, and match the
    /// bytes written into versionstamped keys and values.
    pub async fn versionstamps<H: Harness>(mut h: H) {
        let db = h.db();
        let mut stamps = Vec::new();
        for i in 0..3u8 {
            let tx = db.begin().await.unwrap();
            tx.set_versionstamped_key(&h.vs_key("vs"), &[i]);
            let vs_value = {
                let mut v = b"v=".to_vec();
                v.extend_from_slice(&[0; 10]);
                v.extend_from_slice(&2u32.to_le_bytes());
                v
            };
            tx.set_versionstamped_value(&h.key(&format!("val{i}")), &vs_value);
            let stamp = tx.commit().await.unwrap().unwrap();
            let stored = read(&h, &format!("val{i}")).await.unwrap();
            assert_eq!(&stored[..2], b"v=");
            assert_eq!(&stored[2..], &stamp);
            stamps.push(stamp);
        }
        // Concurrent commits (one batch on group-committing engines).
        let tasks: Vec<_> = (0..16u8)
            .map(|i| {
                let (db, key) = (db.clone(), h.vs_key("vs"));
                tokio::spawn(async move {
                    let tx = db.begin().await.unwrap();
                    tx.set_versionstamped_key(&key, &[100 + i]);
                    tx.commit().await.unwrap().unwrap()
                })
            })
            .collect();
        for t in tasks {
            stamps.push(t.await.unwrap());
        }
        let unique: HashSet<_> = stamps.iter().collect();
        assert_eq!(unique.len(), stamps.len(), "stamps are unique");
        assert!(stamps[..3].windows(2).all(|w| w[0] < w[1]));
        assert!(stamps[3..].iter().all(|s| *s > stamps[2]));
        // The stored keys carry the returned stamps, in stamp order.
        let tx = db.begin().await.unwrap();
        let mut begin = h.prefix().to_vec();
        begin.extend_from_slice(&couch_replicator::store::tuple::pack(&("vs",)));
        begin.pop(); // drop the tuple's end marker
        let mut end = begin.clone();
        end.push(0xFF);
        let rows = tx
            .get_range(&begin, &end, RangeOptions::all())
            .await
            .unwrap();
        drop(tx);
        assert_eq!(rows.len(), 19);
        let mut sorted = stamps.clone();
        sorted.sort();
        for (row, stamp) in rows.iter().zip(&sorted) {
            assert!(
                row.key.windows(10).any(|w| w == stamp),
                "row key carries its stamp"
            );
        }
        let last = *sorted.last().unwrap();
        h.reopen().await;
        let after = put(&h, &[("after", "1")]).await;
        assert!(after > last, "stamps keep increasing across a reopen");
        h.finish().await;
    }

    pub async fn watch_fires_after_commit_not_before<H: Harness>(h: H) {
        put(&h, &[("w", "0")]).await;
        let db = h.db();
        let watch = {
            let tx = db.begin().await.unwrap();
            let w = tx.watch(&h.key("w"));
            tx.commit().await.unwrap();
            w
        };
        let mut watch = tokio::spawn(watch);
        // Writes elsewhere and a same-transaction read do not fire it.
        put(&h, &[("other", "1")]).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut watch)
                .await
                .is_err()
        );
        put(&h, &[("w", "1")]).await;
        tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .expect("watch fires after the change")
            .unwrap()
            .unwrap();

        // A watch on a key the transaction itself writes fires only on a later change.
        let watch = {
            let tx = db.begin().await.unwrap();
            tx.set(&h.key("w"), b"2");
            let w = tx.watch(&h.key("w"));
            tx.commit().await.unwrap();
            w
        };
        let mut watch = tokio::spawn(watch);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut watch)
                .await
                .is_err()
        );
        put(&h, &[("w", "3")]).await;
        tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .unwrap()
            .unwrap()
            .unwrap();

        // A change between the read version and the commit fires at once.
        let tx = db.begin().await.unwrap();
        tx.get(&h.key("w"), true).await.unwrap();
        let watch = tx.watch(&h.key("w"));
        put(&h, &[("w", "4")]).await;
        tx.commit().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .unwrap()
            .unwrap();
        h.finish().await;
    }

    /// The part of the watch test a serial engine can run.
    pub async fn watch_fires_on_change<H: Harness>(h: H) {
        let db = h.db();
        let watch = {
            let tx = db.begin().await.unwrap();
            let w = tx.watch(&h.key("w"));
            tx.commit().await.unwrap();
            w
        };
        let mut watch = watch.fuse();
        assert!(
            (&mut watch).now_or_never().is_none(),
            "not fired before a change"
        );
        put(&h, &[("other", "1")]).await;
        assert!((&mut watch).now_or_never().is_none());
        let tx = db.begin().await.unwrap();
        tx.atomic_add(&h.key("w"), 1);
        tx.commit().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .unwrap()
            .unwrap();
        h.finish().await;
    }

    pub async fn watch_on_dropped_transaction_errors<H: Harness>(h: H) {
        let db = h.db();
        let tx = db.begin().await.unwrap();
        let watch = tx.watch(&h.key("w"));
        tx.set(&h.key("w"), b"1");
        drop(tx);
        let result = tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .unwrap();
        assert!(
            result.is_err(),
            "a watch of an uncommitted transaction fails"
        );
        assert_eq!(
            read(&h, "w").await,
            None,
            "the dropped transaction wrote nothing"
        );
        h.finish().await;
    }

    pub async fn durable_across_reopen<H: Harness>(mut h: H) {
        put(&h, &[("a", "1"), ("b", "2")]).await;
        let tx = h.db().begin().await.unwrap();
        tx.atomic_add(&h.key("n"), 41);
        tx.clear(&h.key("b"));
        tx.commit().await.unwrap();
        h.reopen().await;
        assert_eq!(read(&h, "a").await.as_deref(), Some(&b"1"[..]));
        assert_eq!(read(&h, "b").await, None);
        let tx = h.db().begin().await.unwrap();
        tx.atomic_add(&h.key("n"), 1);
        tx.commit().await.unwrap();
        assert_eq!(counter(read(&h, "n").await), 42);
        h.finish().await;
    }
}

macro_rules! conformance {
    ($engine:ident, $make:expr, [$($case:ident),* $(,)?]) => {
        mod $engine {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    #[allow(clippy::redundant_closure_call)]
                    if let Some(h) = $make.await {
                        deadline(60, stringify!($case), cases::$case(h)).await;
                    }
                }
            )*
        }
    };
}

conformance!(
    embedded,
    async { Some(crate::support::store::Embedded::new().await) },
    [
        get_set_clear,
        range_limits_and_reverse,
        read_your_writes,
        read_write_conflict,
        run_retries_until_all_commit,
        snapshot_reads_do_not_conflict,
        explicit_read_conflict_ranges,
        range_read_conflicts_on_covered_part,
        blind_writes_and_atomic_adds_never_conflict,
        versionstamps,
        watch_fires_after_commit_not_before,
        watch_fires_on_change,
        watch_on_dropped_transaction_errors,
        durable_across_reopen,
    ]
);

conformance!(
    faulty_embedded,
    async { Some(crate::support::store::Faulty::new().await) },
    [
        get_set_clear,
        range_limits_and_reverse,
        read_your_writes,
        read_write_conflict,
        run_retries_until_all_commit,
        snapshot_reads_do_not_conflict,
        explicit_read_conflict_ranges,
        range_read_conflicts_on_covered_part,
        blind_writes_and_atomic_adds_never_conflict,
        versionstamps,
        watch_fires_after_commit_not_before,
        watch_fires_on_change,
        watch_on_dropped_transaction_errors,
        durable_across_reopen,
    ]
);

conformance!(
    memory,
    async { Some(crate::support::store::Memory::new().await) },
    [
        get_set_clear,
        range_limits_and_reverse,
        read_your_writes,
        run_retries_until_all_commit,
        watch_fires_on_change,
        watch_on_dropped_transaction_errors,
    ]
);

conformance!(
    etcd,
    crate::support::store::Etcd::new(),
    [
        get_set_clear,
        range_limits_and_reverse,
        read_your_writes,
        read_write_conflict,
        run_retries_until_all_commit,
        snapshot_reads_do_not_conflict,
        explicit_read_conflict_ranges,
        range_read_conflicts_on_covered_part,
        blind_writes_and_atomic_adds_never_conflict,
        versionstamps,
        watch_fires_after_commit_not_before,
        watch_fires_on_change,
        watch_on_dropped_transaction_errors,
        durable_across_reopen,
    ]
);

// The same engine with every read sent to etcd: the path a transaction takes when its
// replica cannot serve its read version.
conformance!(
    etcd_remote_reads,
    crate::support::store::Etcd::remote_reads(),
    [
        get_set_clear,
        range_limits_and_reverse,
        read_your_writes,
        read_write_conflict,
        snapshot_reads_do_not_conflict,
        explicit_read_conflict_ranges,
        range_read_conflicts_on_covered_part,
        versionstamps,
        watch_fires_after_commit_not_before,
        durable_across_reopen,
    ]
);

#[cfg(feature = "fdb")]
conformance!(
    foundationdb,
    crate::support::store::Fdb::new(),
    [
        get_set_clear,
        range_limits_and_reverse,
        read_your_writes,
        read_write_conflict,
        run_retries_until_all_commit,
        snapshot_reads_do_not_conflict,
        explicit_read_conflict_ranges,
        range_read_conflicts_on_covered_part,
        blind_writes_and_atomic_adds_never_conflict,
        versionstamps,
        watch_fires_after_commit_not_before,
        watch_fires_on_change,
        watch_on_dropped_transaction_errors,
        durable_across_reopen,
    ]
);

/// Without the `fdb` feature the FoundationDB run is skipped, saying so.
#[cfg(not(feature = "fdb"))]
#[test]
fn foundationdb_conformance_needs_the_fdb_feature() {
    if std::env::var_os("FDB_CLUSTER_FILE").is_some() {
        println!("skipping FoundationDB conformance: built without --features fdb");
    } else {
        println!("skipping FoundationDB conformance: FDB_CLUSTER_FILE not set");
    }
}
