//! The peer every store-level benchmark is measured against: plain redb, 16 writer threads,
//! one durable write transaction (one fsync) per transaction, each reading the writer's
//! counter and writing it back plus a ~200-byte document under the writer's own key range.
//! Included by `benches/store.rs` and `benches/jobs.rs` with `#[path]`.
#![allow(dead_code)] // each bench uses a different part

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redb::ReadableTable;

/// Concurrent writers, as in the store benchmark.
pub const WRITERS: usize = 16;

pub const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("bench");

pub fn doc(writer: usize, n: u64) -> Vec<u8> {
    format!(
        "{{\"_id\":\"doc-{writer}-{n}\",\"type\":\"replication\",\"source\":\"http://127.0.0.1:5984/source\",\"target\":\"http://127.0.0.1:5984/target\",\"state\":\"pending\",\"n\":{n}}}"
    )
    .into_bytes()
}

pub fn counter_key(writer: usize) -> Vec<u8> {
    format!("w{writer}/counter").into_bytes()
}

pub fn doc_key(writer: usize, n: u64) -> Vec<u8> {
    format!("w{writer}/doc/{n:012}").into_bytes()
}

/// The benchmark transaction on a plain redb table.
pub fn redb_tx(
    t: &mut redb::Table<&[u8], &[u8]>,
    writer: usize,
    n: u64,
) -> Result<(), redb::Error> {
    let counter = counter_key(writer);
    let count = t
        .get(counter.as_slice())?
        .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    t.insert(counter.as_slice(), (count + 1).to_le_bytes().as_slice())?;
    t.insert(doc_key(writer, n).as_slice(), doc(writer, n).as_slice())?;
    Ok(())
}

/// 16 threads, each committing its transactions one durable redb write transaction each.
pub fn plain_redb(
    db: &Arc<redb::Database>,
    next: &AtomicU64,
    round: Duration,
) -> Result<u64, redb::Error> {
    let stop = AtomicBool::new(false);
    let committed = AtomicU64::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let (db, stop, committed) = (db.clone(), &stop, &committed);
                s.spawn(move || -> Result<(), redb::Error> {
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let w = db.begin_write()?;
                        redb_tx(&mut w.open_table(TABLE)?, writer, n)?;
                        w.commit()?;
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        std::thread::sleep(round);
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().expect("writer thread")?;
        }
        Ok(committed.load(Ordering::Relaxed))
    })
}

/// Plain redb with the writes of 16 transactions (one per writer) in each durable commit.
pub fn batched_redb(
    db: &redb::Database,
    next: &AtomicU64,
    round: Duration,
) -> Result<u64, redb::Error> {
    let start = Instant::now();
    let mut committed = 0;
    while start.elapsed() < round {
        let w = db.begin_write()?;
        {
            let mut t = w.open_table(TABLE)?;
            for writer in 0..WRITERS {
                redb_tx(&mut t, writer, next.fetch_add(1, Ordering::Relaxed))?;
            }
        }
        w.commit()?;
        committed += WRITERS as u64;
    }
    Ok(committed)
}

/// [`plain_redb`] for `run_for` in a new database in `dir`; returns how many committed and
/// how long it really took.
pub fn run(dir: &Path, run_for: Duration) -> Result<(u64, Duration), redb::Error> {
    let db = Arc::new(redb::Database::create(dir.join("plain.redb"))?);
    let next = AtomicU64::new(0);
    let start = Instant::now();
    let n = plain_redb(&db, &next, run_for)?;
    Ok((n, start.elapsed()))
}
