//! Crash test of the embedded engine: a child process (this test binary re-executed with
//! `STORE_CRASH_CHILD` set) commits in a loop from several concurrent writers and prints every
//! acknowledged commit; the parent kills it with SIGKILL at a random moment (seeded; the seed
//! is printed and can be forced with `STORE_CRASH_SEED`), reopens the store and checks that
//! every acknowledged commit is there, that each writer's durable commits form a gap-free
//! prefix, and that the atomic counter, a cleared-and-rewritten range and versionstamped keys
//! written by the same commits match them. Several rounds reuse the same file, so
//! each round also starts from a store recovered after a kill.

use crate::support::deadline;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::store::embedded::EmbeddedStore;
use couch_replicator::store::{Db, RangeOptions, StoreError, tuple};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The test's name as the harness knows it (its module path without the crate), so the child
/// runs exactly this test in whichever binary holds it.
fn test_name() -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::acknowledged_commits_survive_sigkill")
}
const CHILD_ENV: &str = "STORE_CRASH_CHILD";
const ROUND_ENV: &str = "STORE_CRASH_ROUND";
const WRITERS: u32 = 4;
const ROUNDS: u32 = 4;

fn doc_key(round: u32, writer: u32, n: u64) -> Vec<u8> {
    format!("r{round}/w{writer}/{n:010}").into_bytes()
}

fn doc_value(round: u32, writer: u32, n: u64) -> Vec<u8> {
    format!(
        "round {round} writer {writer} commit {n} {}",
        "x".repeat(64)
    )
    .into_bytes()
}

const COUNTER: &[u8] = b"counter";

/// Each commit clears the writer's scratch range and leaves one key in it.
fn scratch_range(round: u32, writer: u32) -> (Vec<u8>, Vec<u8>) {
    let begin = format!("s{round}/w{writer}/").into_bytes();
    let mut end = begin.clone();
    end.push(0xFF);
    (begin, end)
}

fn scratch_key(round: u32, writer: u32, n: u64) -> Vec<u8> {
    format!("s{round}/w{writer}/{n:010}").into_bytes()
}

/// Each commit also writes a versionstamped key under this tuple prefix.
fn stamped_prefix(round: u32, writer: u32) -> Vec<u8> {
    tuple::pack(&("vs", format!("{round}/{writer}")))
}

fn stamped_key(round: u32, writer: u32) -> Vec<u8> {
    tuple::pack_with_versionstamp(&(
        "vs",
        format!("{round}/{writer}"),
        tuple::Versionstamp::incomplete(0),
    ))
}

/// The child: commit forever, printing `ACK round writer n` after each acknowledged commit.
async fn child(path: String, round: u32) -> Result<(), StoreError> {
    let store = EmbeddedStore::open(&path)?;
    let db = Db::new(Arc::new(store));
    let tasks: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let db = db.clone();
            tokio::spawn(async move {
                for n in 0u64.. {
                    db.run(|tx| async move {
                        tx.set(&doc_key(round, writer, n), &doc_value(round, writer, n));
                        tx.atomic_add(COUNTER, 1);
                        let (begin, end) = scratch_range(round, writer);
                        tx.clear_range(&begin, &end);
                        tx.set(&scratch_key(round, writer, n), b"latest");
                        tx.set_versionstamped_key(&stamped_key(round, writer), &n.to_be_bytes());
                        Ok::<_, StoreError>(())
                    })
                    .await?;
                    println!("ACK {round} {writer} {n}");
                }
                Ok::<_, StoreError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| StoreError::Engine(e.to_string()))??;
    }
    Ok(())
}

/// Runs one child until a random moment after its first acknowledgement, kills it, and
/// returns the highest acknowledged commit per writer.
async fn crash_round(path: &str, round: u32, rng: &mut impl Rng) -> BTreeMap<u32, u64> {
    let exe = std::env::current_exe().expect("test binary path");
    let mut process = Command::new(exe)
        .arg(test_name())
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, path)
        .env(ROUND_ENV, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the committing child");
    let stdout = process.stdout.take().expect("child stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut acked: BTreeMap<u32, u64> = BTreeMap::new();
    let record = |line: &str, acked: &mut BTreeMap<u32, u64>| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let ["ACK", r, w, n] = fields[..] {
            assert_eq!(r.parse::<u32>().unwrap(), round);
            let (w, n): (u32, u64) = (w.parse().unwrap(), n.parse().unwrap());
            let previous = acked.insert(w, n);
            assert!(
                previous.is_none_or(|p| p + 1 == n),
                "writer {w} acknowledged out of order"
            );
        }
    };
    // Wait for the first acknowledgement, so the kill lands while commits are flowing.
    loop {
        let line = lines
            .next_line()
            .await
            .expect("read child")
            .expect("child exited before committing");
        record(&line, &mut acked);
        if !acked.is_empty() {
            break;
        }
    }
    let delay = Duration::from_millis(rng.random_range(20..600));
    let until = tokio::time::sleep(delay);
    tokio::pin!(until);
    loop {
        tokio::select! {
            _ = &mut until => break,
            line = lines.next_line() => {
                let line = line.expect("read child").expect("child exited early");
                record(&line, &mut acked);
            }
        }
    }
    process.start_kill().expect("SIGKILL the child");
    // Lines already in the pipe were acknowledged before the kill.
    while let Some(line) = lines.next_line().await.expect("read child") {
        record(&line, &mut acked);
    }
    let status = process.wait().await.expect("reap the child");
    assert!(!status.success(), "the child was killed, not finished");
    println!(
        "round {round}: killed after {delay:?}, acknowledged {:?}",
        acked
    );
    acked
}

async fn verify(path: &str, history: &[BTreeMap<u32, u64>]) {
    let store = EmbeddedStore::open(path).expect("reopen after SIGKILL");
    let db = Db::new(Arc::new(store.clone()));
    let tx = db.begin().await.unwrap();
    let mut durable_total = 0u64;
    for (round, acked) in history.iter().enumerate() {
        let round = round as u32;
        for writer in 0..WRITERS {
            let prefix = format!("r{round}/w{writer}/").into_bytes();
            let mut end = prefix.clone();
            end.push(0xFF);
            let rows = tx
                .get_range(&prefix, &end, RangeOptions::all())
                .await
                .unwrap();
            // Durable commits of one writer are 0..count with nothing missing, and their
            // values are intact.
            for (i, row) in rows.iter().enumerate() {
                assert_eq!(row.key, doc_key(round, writer, i as u64), "gap in writer");
                assert_eq!(row.value, doc_value(round, writer, i as u64));
            }
            if let Some(&last) = acked.get(&writer) {
                // At most the one in-flight commit is durable beyond the acknowledged ones.
                let count = rows.len() as u64;
                assert!(
                    count > last,
                    "round {round} writer {writer}: acknowledged commit {last} lost ({count} durable)"
                );
                assert!(count <= last + 2, "more commits than the writer issued");
            } else {
                assert!(rows.len() <= 1, "more commits than the writer issued");
            }
            let count = rows.len() as u64;
            durable_total += count;
            // The cleared-and-rewritten scratch range holds only the last durable commit's key.
            let (begin, end) = scratch_range(round, writer);
            let scratch = tx
                .get_range(&begin, &end, RangeOptions::all())
                .await
                .unwrap();
            let expected: Vec<Vec<u8>> = count
                .checked_sub(1)
                .map(|last| scratch_key(round, writer, last))
                .into_iter()
                .collect();
            let scratch: Vec<String> = scratch
                .iter()
                .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
                .collect();
            let expected: Vec<String> = expected
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            assert!(
                scratch == expected,
                "round {round} writer {writer}: scratch range holds {} keys (first {:?}), expected {:?}",
                scratch.len(),
                scratch.first(),
                expected
            );
            // One versionstamped key per durable commit, in commit order.
            let prefix = stamped_prefix(round, writer);
            let mut end = prefix.clone();
            end.push(0xFF);
            let stamped = tx
                .get_range(&prefix, &end, RangeOptions::all())
                .await
                .unwrap();
            let order: Vec<u64> = stamped
                .iter()
                .map(|kv| u64::from_be_bytes(kv.value.as_slice().try_into().unwrap()))
                .collect();
            assert_eq!(
                order,
                (0..count).collect::<Vec<_>>(),
                "round {round} writer {writer}: versionstamped keys"
            );
        }
    }
    let counter = tx.get(COUNTER, false).await.unwrap().unwrap_or_default();
    let counter = i64::from_le_bytes(counter.try_into().expect("8-byte counter"));
    assert_eq!(
        counter as u64, durable_total,
        "the counter and the documents were committed together"
    );
    drop(tx);
    store.close().await.unwrap();
}

#[test]
fn acknowledged_commits_survive_sigkill() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(path) = std::env::var(CHILD_ENV) {
        let round = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
        // Runs until the parent kills it; an error here ends the child early, which the
        // parent reports.
        if let Err(e) = runtime.block_on(child(path, round)) {
            eprintln!("crash child failed: {e}");
            std::process::exit(3);
        }
        return;
    }
    let seed: u64 = match std::env::var("STORE_CRASH_SEED") {
        Ok(s) => s.parse().expect("STORE_CRASH_SEED is a number"),
        Err(_) => rand::random(),
    };
    println!("store crash test seed: {seed} (set STORE_CRASH_SEED to repeat)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let path = path.to_str().unwrap().to_string();
    runtime.block_on(async {
        deadline(120, "the crash rounds", async {
            let mut history = Vec::new();
            for round in 0..ROUNDS {
                history.push(crash_round(&path, round, &mut rng).await);
                // Commits since the last checkpoint are in the commit log: reopening replays it.
                let log = std::fs::metadata(format!("{path}.wal")).map_or(0, |m| m.len());
                println!("round {round}: commit log holds {log} bytes at the kill");
                verify(&path, &history).await;
            }
        })
        .await;
    });
}
