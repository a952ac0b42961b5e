//! The etcd engine's local replica (`src/store/etcd/replica.rs`) on a real etcd: a process's
//! transactions read from its replica yet see what another process committed just before
//! (read versions still come from etcd); and a replica cut off etcd while the other process
//! writes, deletes and compacts the revisions it missed loads the prefix again once it
//! reaches etcd, so it never serves a deleted or stale row. Store watches are served by the
//! replica's stream (no etcd watch of their own) and fire on another process's change, also
//! when that change happened while the replica was cut off.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use couch_replicator::store::etcd::{EtcdConfig, EtcdStore};
use couch_replicator::store::{Db, RangeOptions, StoreError, Tx, Watch};

use crate::support::relay::Link;
use crate::support::store::Etcd;
use crate::support::{deadline, wait_for};

async fn put(db: &Db, key: &'static str, value: &str) {
    let value = value.to_string();
    db.run(|tx: Tx| {
        let value = value.clone();
        async move {
            tx.set(key.as_bytes(), value.as_bytes());
            Ok::<_, StoreError>(())
        }
    })
    .await
    .expect("put");
}

async fn get(db: &Db, key: &'static str) -> Option<String> {
    db.run(|tx: Tx| async move { tx.get(key.as_bytes(), false).await })
        .await
        .expect("get")
        .map(|v| String::from_utf8_lossy(&v).into_owned())
}

async fn try_get(db: &Db, key: &'static str) -> Result<Option<Vec<u8>>, StoreError> {
    db.run(|tx: Tx| async move { tx.get(key.as_bytes(), false).await })
        .await
}

async fn keys(db: &Db, options: RangeOptions) -> Vec<String> {
    db.run(|tx: Tx| async move { tx.get_range(b"r/", b"r0", options).await })
        .await
        .expect("range")
        .into_iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

/// Reads `key` and watches it, in one transaction.
async fn watch(db: &Db, key: &'static str) -> Watch {
    db.run(|tx: Tx| async move {
        tx.get(key.as_bytes(), false).await?;
        Ok::<_, StoreError>(tx.watch(key.as_bytes()))
    })
    .await
    .expect("watch")
}

/// Another process's change fires a watch the replica serves; an unchanged key's does not.
async fn replica_watches(h: Etcd) {
    let writer = Db::new(Arc::new(h.store.clone()));
    let reader_store = EtcdStore::connect(&EtcdConfig::new(h.cluster.endpoints()))
        .await
        .expect("reader");
    let reader = Db::new(Arc::new(reader_store.clone()));
    put(&writer, "w", "0").await;
    put(&writer, "quiet", "0").await;
    wait_for(10, "the replica's first load", || async {
        (reader_store.replica_loads() == 1).then_some(())
    })
    .await;
    for i in 1..=5 {
        // Waiting before the change comes: fired by the replica's event.
        let changed = tokio::spawn(watch(&reader, "w").await);
        let quiet = watch(&reader, "quiet").await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        put(&writer, "w", &i.to_string()).await;
        tokio::time::timeout(std::time::Duration::from_secs(10), changed)
            .await
            .expect("the watch fires on the change")
            .expect("task")
            .expect("watch");
        let unchanged = tokio::time::timeout(std::time::Duration::from_millis(200), quiet).await;
        assert!(
            unchanged.is_err(),
            "round {i}: an unchanged key's watch fired"
        );
    }
    // A key written after the watch's read, before the watch was registered, still fires it.
    let late = watch(&reader, "w").await;
    put(&writer, "w", "late").await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    tokio::time::timeout(std::time::Duration::from_secs(10), late)
        .await
        .expect("a change before the wait still fires")
        .expect("watch");
    let stats = reader_store.stats();
    assert_eq!(
        stats.native_watches.load(Ordering::Relaxed),
        0,
        "{}",
        stats.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_serves_watches_without_an_etcd_watch_each() {
    let Some(h) = Etcd::new().await else {
        return;
    };
    deadline(60, "replica watches", replica_watches(h)).await;
}

/// Another process's commit is visible to the next transaction, served by the replica.
async fn fresh_reads(h: Etcd) {
    let writer = Db::new(Arc::new(h.store.clone()));
    let reader_store = EtcdStore::connect(&EtcdConfig::new(h.cluster.endpoints()))
        .await
        .expect("reader");
    let reader = Db::new(Arc::new(reader_store.clone()));
    for i in 0..20 {
        put(&writer, "k", &i.to_string()).await;
        assert_eq!(get(&reader, "k").await, Some(i.to_string()), "round {i}");
    }
    for k in ["r/b", "r/a", "r/d", "r/c"] {
        put(&writer, k, "x").await;
    }
    assert_eq!(
        keys(&reader, RangeOptions::default()).await,
        ["r/a", "r/b", "r/c", "r/d"]
    );
    let last_two = RangeOptions {
        limit: Some(2),
        reverse: true,
        ..RangeOptions::default()
    };
    assert_eq!(keys(&reader, last_two).await, ["r/d", "r/c"]);
    // A replica that lags more than its wait (a loaded machine) sends a read to etcd
    // instead: correct, only slower; so only "some were local" is asserted.
    let stats = reader_store.stats();
    assert!(
        stats.local_reads.load(Ordering::Relaxed) > 0,
        "{}",
        stats.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_the_replica_see_the_commits_of_other_processes() {
    let Some(h) = Etcd::new().await else {
        return;
    };
    deadline(60, "replica reads", fresh_reads(h)).await;
}

/// Cut off, the replica misses writes and deletes whose revisions are then compacted: back
/// on etcd, it must load again rather than serve what it had.
async fn reload_after_compaction(h: Etcd) {
    let endpoint = h.cluster.endpoint(0);
    let (relay, reader_store) = h.behind_relay(Link::default()).await;
    let writer = Db::new(Arc::new(h.store.clone()));
    let reader = Db::new(Arc::new(reader_store.clone()));
    wait_for(10, "the replica's first load", || async {
        (reader_store.replica_loads() == 1).then_some(())
    })
    .await;
    put(&writer, "gone", "soon").await;
    put(&writer, "k", "old").await;
    assert_eq!(get(&reader, "gone").await.as_deref(), Some("soon"));
    let k_changed = watch(&reader, "k").await;

    relay.block();
    writer
        .run(|tx: Tx| async move {
            tx.clear(b"gone");
            tx.set(b"k", b"new");
            Ok::<_, StoreError>(())
        })
        .await
        .expect("write while the reader is cut off");
    for i in 0..10 {
        put(&writer, "churn", &i.to_string()).await;
    }
    let mut admin = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("admin");
    let revision = admin
        .get("x", None)
        .await
        .expect("revision")
        .header()
        .map_or(0, |h| h.revision());
    admin.compact(revision, None).await.expect("compact");
    relay.unblock();

    let local_before = reader_store.stats().local_reads.load(Ordering::Relaxed);
    // Reads fail while the client reconnects; once the replica is back they are local.
    wait_for(30, "the replica serves reads again", || async {
        let served = reader_store.stats().local_reads.load(Ordering::Relaxed) > local_before;
        let k = try_get(&reader, "k").await.ok().flatten();
        (served && k.as_deref() == Some(&b"new"[..])).then_some(())
    })
    .await;
    assert_eq!(
        get(&reader, "gone").await,
        None,
        "a deleted row is not served"
    );
    assert_eq!(
        reader_store.replica_loads(),
        2,
        "loaded at start and after the compaction"
    );
    assert_eq!(get(&reader, "churn").await.as_deref(), Some("9"));
    tokio::time::timeout(std::time::Duration::from_secs(10), k_changed)
        .await
        .expect("a change made while the replica was cut off fires its watch")
        .expect("watch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_past_a_compaction_loads_the_prefix_again() {
    let Some(h) = Etcd::new().await else {
        return;
    };
    deadline(90, "replica reload", reload_after_compaction(h)).await;
}
