//! The etcd engine learns by itself what became of a commit whose answer was lost, so
//! `Db::run` writes no transaction ids on it: through a TCP relay that delays one direction,
//! the connection is cut while the commit `Txn` is in flight. Cut after etcd applied it (the
//! answer still on its way back): the commit is reported as landed, once. Cut before it
//! reached etcd: a fence takes the clock's next counter, so the lost `Txn` can never apply,
//! and `Db::run` runs the transaction again. Each case also runs with another process
//! committing right after the cut, so the clock's history has to tell. The counter always
//! ends at exactly 2 and etcd holds no key but the counters and the clock.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use couch_replicator::store::{Db, RetryPolicy, StoreError, Tx};

use crate::support::deadline;
use crate::support::relay::Link;
use crate::support::store::Etcd;

async fn add_one(db: &Db, key: &'static [u8]) -> Result<(), StoreError> {
    db.run(|tx: Tx| async move {
        tx.atomic_add(key, 1);
        Ok::<_, StoreError>(())
    })
    .await
}

/// `interleave`: another process commits right after the cut, so the clock is past the lost
/// `Txn`'s counter when the engine asks, and its history must tell.
async fn lost_answer(h: Etcd, link: Link, interleave: bool) {
    let endpoint = h.cluster.endpoint(0);
    let delay = link.up.max(link.down);
    let (relay, store) = h.behind_relay(link).await;
    let db = Db::new(Arc::new(store.clone())).with_retry(RetryPolicy {
        timeout: Some(Duration::from_secs(60)),
        ..RetryPolicy::default()
    });
    // The committer now knows the clock and the counter: the next commit is one `Txn`.
    add_one(&db, b"n").await.expect("warm-up");
    let commit = tokio::spawn({
        let db = db.clone();
        async move { add_one(&db, b"n").await }
    });
    tokio::time::sleep(delay / 3).await;
    relay.cut();
    let direct = Db::new(Arc::new(h.store.clone()));
    if interleave {
        add_one(&direct, b"other")
            .await
            .expect("another process's commit");
    }
    commit
        .await
        .expect("task")
        .expect("the commit ends as landed");
    assert_eq!(
        store.stats().lost.load(Ordering::Relaxed),
        1,
        "{}",
        store.stats().summary()
    );

    let n = direct
        .run(|tx: Tx| async move { tx.get(b"n", false).await })
        .await
        .expect("read");
    assert_eq!(n, Some(2i64.to_le_bytes().to_vec()), "applied exactly once");
    let mut admin = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("admin");
    let all = admin
        .get(
            "",
            Some(
                etcd_client::GetOptions::new()
                    .with_all_keys()
                    .with_keys_only(),
            ),
        )
        .await
        .expect("keys");
    let expected = if interleave { 3 } else { 2 };
    let what = "the counters and the clock; no transaction ids";
    assert_eq!(all.kvs().len(), expected, "{what}");
}

/// Where the relay holds bytes for 900 ms: on the way to etcd (the commit is cut before
/// etcd sees it) or back (its answer is cut after etcd applied it).
enum Cut {
    BeforeEtcd,
    AfterEtcd,
}

async fn case(cut: Cut, interleave: bool, what: &str) {
    let Some(h) = Etcd::new().await else {
        return;
    };
    let held = Duration::from_millis(900);
    let link = match cut {
        Cut::BeforeEtcd => Link {
            up: held,
            ..Link::default()
        },
        Cut::AfterEtcd => Link {
            down: held,
            ..Link::default()
        },
    };
    deadline(90, what, lost_answer(h, link, interleave)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_lost_after_etcd_applied_the_commit_reports_it_landed() {
    case(Cut::AfterEtcd, false, "lost answer, applied").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_lost_after_etcd_applied_the_commit_is_found_in_the_clocks_history() {
    case(Cut::AfterEtcd, true, "lost answer, history").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_lost_before_etcd_saw_it_is_fenced_and_run_again() {
    case(Cut::BeforeEtcd, false, "lost commit, never applied").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_lost_before_etcd_saw_it_and_overtaken_is_run_again() {
    case(Cut::BeforeEtcd, true, "lost commit, overtaken").await;
}
