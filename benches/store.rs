//! Store benchmark: committed transactions per second of the embedded engine with 16
//! concurrent writers (group commit) against plain redb with one durable write transaction per
//! transaction, both measured in this run on the same disk for the same time.
//!
//! Each transaction reads one key and writes two (a counter and a ~200-byte document).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use couch_replicator::store::embedded::EmbeddedStore;
use couch_replicator::store::{Db, StoreError};

#[path = "support/plain_redb.rs"]
mod plain_redb;

use plain_redb::doc;

const WRITERS: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(4);

async fn embedded(dir: &std::path::Path) -> Result<(u64, u64, Duration), StoreError> {
    let store = EmbeddedStore::open(dir.join("embedded.redb"))?;
    let db = Db::new(Arc::new(store.clone()));
    let committed = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (db, committed, attempts, stop) = (
                db.clone(),
                committed.clone(),
                attempts.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let counter = format!("w{writer}/counter").into_bytes();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let counter = &counter;
                    db.run(|tx| {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        async move {
                            let current = tx
                                .get(counter, false)
                                .await?
                                .and_then(|v| v.try_into().ok())
                                .map(u64::from_le_bytes)
                                .unwrap_or(0);
                            tx.set(counter, &(current + 1).to_le_bytes());
                            tx.set(format!("w{writer}/doc/{n}").as_bytes(), &doc(writer, n));
                            Ok::<_, StoreError>(())
                        }
                    })
                    .await?;
                    committed.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, StoreError>(())
            })
        })
        .collect();
    tokio::time::sleep(RUN_FOR).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.map_err(|e| StoreError::Engine(e.to_string()))??;
    }
    let elapsed = start.elapsed();
    store.close().await?;
    Ok((
        committed.load(Ordering::Relaxed),
        attempts.load(Ordering::Relaxed),
        elapsed,
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::Builder::new()
        .prefix("store-bench")
        .tempdir_in(std::env::current_dir()?)?;
    let (plain_n, plain_t) = plain_redb::run(dir.path(), RUN_FOR)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (emb_n, emb_attempts, emb_t) = runtime.block_on(embedded(dir.path()))?;
    let plain_rate = plain_n as f64 / plain_t.as_secs_f64();
    let emb_rate = emb_n as f64 / emb_t.as_secs_f64();
    println!("{:<44} {:>10} {:>12}", "engine", "committed", "tx/s");
    println!(
        "{:<44} {:>10} {:>12.0}",
        "plain redb, 1 durable write tx per tx", plain_n, plain_rate
    );
    println!(
        "{:<44} {:>10} {:>12.0}",
        format!("embedded store, {WRITERS} writers (group commit)"),
        emb_n,
        emb_rate
    );
    println!(
        "embedded: {} attempts for {} commits ({} retried)",
        emb_attempts,
        emb_n,
        emb_attempts.saturating_sub(emb_n)
    );
    println!(
        "RESULT store_tx_per_s_group_over_single = {:.2}",
        emb_rate / plain_rate.max(f64::MIN_POSITIVE)
    );
    Ok(())
}
