//! Store benchmark: committed transactions per second of the embedded engine with 16
//! concurrent writers (group commit) against plain redb with one durable write transaction
//! per transaction, measured in this run on the same disk.
//!
//! Fairness: every engine runs the same transaction (read the writer's counter, write it back
//! plus one, write a ~200-byte document under the writer's own key range) from the same 16
//! writers (threads for plain redb, tasks for the store), and the engines take turns in short
//! rounds so that a disk that is busier at one moment (the machine is shared) does not favour
//! one of them. A third peer, plain redb committing 16 transactions' writes in one durable
//! write transaction, shows what batching alone gives on redb.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use couch_replicator::store::embedded::EmbeddedStore;
use couch_replicator::store::{Db, StoreError};

#[path = "support/plain_redb.rs"]
mod plain_redb;

use plain_redb::{WRITERS, batched_redb, counter_key, doc, doc_key, plain_redb};

const ROUNDS: usize = 5;
const ROUND: Duration = Duration::from_millis(1000);
/// 16 tasks committing through `Db::run` on the embedded store. Returns commits and attempts.
async fn embedded(db: &Db, next: &Arc<AtomicU64>) -> Result<(u64, u64), StoreError> {
    let committed = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (db, committed, attempts, stop, next) = (
                db.clone(),
                committed.clone(),
                attempts.clone(),
                stop.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                let counter = counter_key(writer);
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
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
                            tx.set(&doc_key(writer, n), &doc(writer, n));
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
    tokio::time::sleep(ROUND).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.map_err(|e| StoreError::Engine(e.to_string()))??;
    }
    Ok((
        committed.load(Ordering::Relaxed),
        attempts.load(Ordering::Relaxed),
    ))
}

#[derive(Default)]
struct Tally {
    committed: u64,
    elapsed: Duration,
    rounds: Vec<f64>,
}

impl Tally {
    fn add(&mut self, committed: u64, elapsed: Duration) {
        self.committed += committed;
        self.elapsed += elapsed;
        self.rounds.push(committed as f64 / elapsed.as_secs_f64());
    }

    fn rate(&self) -> f64 {
        self.committed as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn row(&self, name: &str) {
        let rounds: Vec<String> = self.rounds.iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "{name:<48} {:>9} {:>9.0}   {}",
            self.committed,
            self.rate(),
            rounds.join(" / ")
        );
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::Builder::new()
        .prefix("store-bench")
        .tempdir_in(std::env::current_dir()?)?;
    let plain_db = Arc::new(redb::Database::create(dir.path().join("plain.redb"))?);
    let batched_db = redb::Database::create(dir.path().join("batched.redb"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let store = EmbeddedStore::open(dir.path().join("embedded.redb"))?;
    let db = Db::new(Arc::new(store.clone()));
    let next = Arc::new(AtomicU64::new(0));
    let (mut plain, mut batched, mut group) =
        (Tally::default(), Tally::default(), Tally::default());
    let mut attempts = 0;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        plain.add(plain_redb(&plain_db, &next, ROUND)?, start.elapsed());
        let start = Instant::now();
        let (n, tried) = runtime.block_on(embedded(&db, &next))?;
        group.add(n, start.elapsed());
        attempts += tried;
        let start = Instant::now();
        batched.add(batched_redb(&batched_db, &next, ROUND)?, start.elapsed());
    }
    runtime.block_on(store.close())?;
    println!(
        "{:<48} {:>9} {:>9}   per round",
        "engine (16 writers, same transaction)", "committed", "tx/s"
    );
    plain.row("plain redb, 1 durable write tx per tx");
    group.row("embedded store (group commit + commit log)");
    batched.row("plain redb, 16 txs per durable write tx");
    println!(
        "embedded: {attempts} attempts for {} commits ({} retried)",
        group.committed,
        attempts.saturating_sub(group.committed)
    );
    println!(
        "RESULT store_tx_per_s_group_over_single = {:.2}",
        group.rate() / plain.rate().max(f64::MIN_POSITIVE)
    );
    println!(
        "RESULT store_tx_per_s_group_over_redb_batched = {:.2}",
        group.rate() / batched.rate().max(f64::MIN_POSITIVE)
    );
    Ok(())
}
