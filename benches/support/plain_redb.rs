//! The peer every store-level benchmark is measured against: plain redb with one durable
//! write transaction (one fsync) per transaction, each reading a counter and writing it plus
//! a ~200-byte document. Included by `benches/store.rs` and `benches/jobs.rs` with `#[path]`.
#![allow(dead_code)] // each bench uses a different part

use std::path::Path;
use std::time::{Duration, Instant};

use redb::ReadableTable;

const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("bench");

/// A replication-like JSON document of about 200 bytes.
pub fn doc(writer: usize, n: u64) -> Vec<u8> {
    format!(
        "{{\"_id\":\"doc-{writer}-{n}\",\"type\":\"replication\",\"source\":\"http://127.0.0.1:5984/source\",\"target\":\"http://127.0.0.1:5984/target\",\"state\":\"pending\",\"n\":{n}}}"
    )
    .into_bytes()
}

/// Commit transactions one after another for `run_for` in a new database in `dir`; returns
/// how many committed and how long it really took.
pub fn run(dir: &Path, run_for: Duration) -> Result<(u64, Duration), redb::Error> {
    let db = redb::Database::create(dir.join("plain.redb"))?;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < run_for {
        let w = db.begin_write()?;
        {
            let mut t = w.open_table(TABLE)?;
            let count = t
                .get(b"counter".as_slice())?
                .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            t.insert(b"counter".as_slice(), (count + 1).to_le_bytes().as_slice())?;
            let key = format!("doc/{n}");
            t.insert(key.as_bytes(), doc(0, n).as_slice())?;
        }
        w.commit()?;
        n += 1;
    }
    Ok((n, start.elapsed()))
}
