//! couch_jobs on a real 3-member etcd cluster (started here on loopback, by pid), with its
//! peer measured in the same run on the same cluster at the same concurrency:
//!
//! * raw single-key `Txn`s per second (a compare on the worker's own key and a put), and
//! * couch_jobs cycles (`add` → `accept` → `update` → `finish`, four transactions) per
//!   second through the etcd engine;
//!
//! `RESULT jobs_cycles_etcd_over_raw_txn` is the second over the first; the raw rate is
//! measured before and after the cycles, each phase after a compaction. Skips (saying so)
//! when the `etcd` binary is not installed. `RESULT jobs_cycles_ideal_client_over_raw_txn`
//! is the ceiling of that ratio on the machine that runs it: the same cycles as an ideal
//! client would send them (`benches/cluster/ceiling.rs`).
//!
//! Part 2 ([`part2`], `benches/cluster/serve.rs`): three `serve` processes on a 3-member
//! etcd running `BENCH_JOBS` (default 3,000) continuous replications (`max_jobs` 500 each)
//! against a real CouchDB 3.4.3, then one embedded single-node `serve` running the same
//! jobs: `RESULT cluster_running_jobs_max_over_min` and
//! `RESULT cluster_cpu_per_start_over_single_node` (node 2's clock 90 s ahead when
//! libfaketime is installed); then the failover drill (`tests/support/failover_drill.rs`) on
//! a new 3-member etcd: `RESULT failover_seconds`, `RESULT rolling_restart_max_pause_seconds`
//! and `RESULT double_runs`. Skips without CouchDB's peer script.
//! `BENCH_PARTS=1` or `2` runs one part only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use couch_replicator::jobs::{JobData, Jobs, JobsOptions};
use couch_replicator::store::Db;
use couch_replicator::store::etcd::{
    DEFAULT_PIPELINE, DEFAULT_READ_PIPELINE, EtcdConfig, EtcdStore,
};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

#[path = "cluster/ceiling.rs"]
mod ceiling;
#[path = "attachments/couch.rs"]
#[allow(dead_code)]
mod couch;
#[path = "../tests/support/etcd.rs"]
#[allow(dead_code)]
mod etcd_cluster;
#[path = "../tests/support/failover_drill.rs"]
mod failover_drill;
#[path = "shared/cycles.rs"]
mod job_cycles;
#[path = "cluster/serve.rs"]
mod part2;
#[path = "shared/relay.rs"]
mod relay;
#[path = "../tests/support/run_log.rs"]
mod run_log;
#[path = "../tests/support/serve_cluster.rs"]
#[allow(dead_code)]
mod serve_cluster;

const WORKERS: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(5);
const CYCLE_TYPE: &str = "bench_cycle";

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `WORKERS` tasks each sending `Txn`s on its own key; returns (txns, elapsed).
async fn raw_txns(endpoints: &[String]) -> BenchResult<(u64, Duration)> {
    // The store's own connection (TCP_NODELAY), so both sides use the same transport.
    let config = EtcdConfig::new(endpoints.to_vec());
    let client = config.client().await?;
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (mut kv, done, stop) = (client.kv_client(), done.clone(), stop.clone());
            tokio::spawn(async move {
                let key = format!("raw/{w}");
                let mut seen = 0;
                while !stop.load(Ordering::Relaxed) {
                    let txn = Txn::new()
                        .when([Compare::mod_revision(key.clone(), CompareOp::Equal, seen)])
                        .and_then([TxnOp::put(key.clone(), b"v".to_vec(), None)]);
                    let resp = kv.txn(txn).await?;
                    seen = resp.header().map_or(0, |h| h.revision());
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, etcd_client::Error>(())
            })
        })
        .collect();
    job_cycles::stop_after(tasks, &stop, &done, start, RUN_FOR).await
}

/// CPU seconds (user + system) this process used so far, from `/proc/self/stat` (0 when
/// unreadable): the client's share of the machine, which the etcd members compete for.
fn own_cpu_seconds() -> f64 {
    cpu_seconds("self")
}

/// The etcd members' CPU seconds so far, summed.
fn etcd_cpu_seconds(cluster: &etcd_cluster::EtcdCluster) -> f64 {
    (0..3)
        .filter_map(|i| cluster.pid(i))
        .map(|pid| cpu_seconds(&pid.to_string()))
        .sum()
}

/// CPU seconds (user + system) of process `pid` (`self` for this one), 0 when unreadable.
fn cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

fn job_data(worker: usize, n: u64, step: &str) -> JobData {
    let mut d = JobData::new();
    d.insert("worker".into(), worker.into());
    d.insert("n".into(), n.into());
    d.insert("step".into(), step.into());
    d
}

/// `WORKERS` tasks each looping add → accept → update → finish; returns (cycles, elapsed).
async fn cycles(jobs: &Jobs) -> BenchResult<(u64, Duration)> {
    job_cycles::cycles(jobs, CYCLE_TYPE, WORKERS, RUN_FOR, job_data).await
}

/// One client's sequential begin → get → set → commit, with where the time goes.
async fn sequential(store: &EtcdStore) -> BenchResult<()> {
    use couch_replicator::store::Store;
    let (mut begin, mut get, mut commit) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let n = 100;
    for i in 0..n {
        let t0 = Instant::now();
        let tx = store.begin().await?;
        let t1 = Instant::now();
        tx.get(b"seq", false).await?;
        let t2 = Instant::now();
        tx.set(b"seq", format!("{i}").as_bytes());
        tx.commit().await?;
        let t3 = Instant::now();
        begin += t1 - t0;
        get += t2 - t1;
        commit += t3 - t2;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0 / n as f64;
    println!(
        "sequential store transaction: begin {:.1} ms, get {:.1} ms, commit {:.1} ms",
        ms(begin),
        ms(get),
        ms(commit)
    );
    Ok(())
}

/// Compacts the cluster's history up to now, as operators' auto-compaction does, so that
/// each measurement starts from the same state instead of the history the last one left.
async fn compact(endpoints: &[String]) -> BenchResult<()> {
    let mut client = EtcdConfig::new(endpoints.to_vec()).client().await?;
    let revision = client
        .get("compact", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    let options = etcd_client::CompactionOptions::new().with_physical();
    match client.compact(revision, Some(options)).await {
        // Nothing written since the last compaction.
        Err(e) if e.to_string().contains("compacted") => Ok(()),
        other => other.map(drop).map_err(Into::into),
    }
}

/// The couch_jobs cycles of one store configuration: (cycles, elapsed, summary line).
async fn depth_cycles(
    endpoints: &[String],
    (commits, reads): (usize, usize),
) -> BenchResult<(u64, Duration, String)> {
    let config = EtcdConfig {
        pipeline: commits,
        read_pipeline: reads,
        ..EtcdConfig::new(endpoints.to_vec()).with_prefix(format!("bench-p{commits}-{reads}/"))
    };
    let other = EtcdStore::connect(&config).await?;
    let jobs = Jobs::new(Db::new(Arc::new(other.clone())), JobsOptions::default());
    let (n, t) = cycles(&jobs).await?;
    let line = format!(
        "etcd engine, {commits} commit / {reads} read Txns in flight: {}; {:.1} requests per cycle",
        other.stats().summary(),
        other.stats().requests() as f64 / n.max(1) as f64
    );
    Ok((n, t, line))
}

async fn part1() -> BenchResult<()> {
    let Some(cluster) = etcd_cluster::EtcdCluster::start(3).await else {
        return Ok(());
    };
    let endpoints = cluster.endpoints();
    // Raw Txns before and after the cycles (each phase after a compaction): the cluster
    // slows as its history grows, so the peer is measured on both sides of the cycles.
    compact(&endpoints).await?;
    let etcd_before = etcd_cpu_seconds(&cluster);
    let (raw1_n, raw1_t) = raw_txns(&endpoints).await?;
    let raw1_cpu = etcd_cpu_seconds(&cluster) - etcd_before;

    let store = EtcdStore::connect(&EtcdConfig::new(endpoints.clone())).await?;
    sequential(&store).await?;
    compact(&endpoints).await?;
    let jobs = Jobs::new(Db::new(Arc::new(store.clone())), JobsOptions::default());
    let before = store.stats().requests();
    let cpu_before = own_cpu_seconds();
    let etcd_before = etcd_cpu_seconds(&cluster);
    let (cycles_n, cycles_t) = cycles(&jobs).await?;
    let cpu = own_cpu_seconds() - cpu_before;
    let etcd_cpu = etcd_cpu_seconds(&cluster) - etcd_before;
    let defaults = (DEFAULT_PIPELINE, DEFAULT_READ_PIPELINE);
    println!(
        "etcd engine, {} commit / {} read Txns in flight: {}; {:.1} requests per cycle; \
         this process's CPU {:.2} ms per cycle",
        defaults.0,
        defaults.1,
        store.stats().summary(),
        (store.stats().requests() - before) as f64 / cycles_n.max(1) as f64,
        cpu * 1000.0 / cycles_n.max(1) as f64
    );

    compact(&endpoints).await?;
    let etcd_before = etcd_cpu_seconds(&cluster);
    let (raw2_n, raw2_t) = raw_txns(&endpoints).await?;
    let raw2_cpu = etcd_cpu_seconds(&cluster) - etcd_before;

    // Other depths than the defaults (commit `Txn`s, first-read `Txn`s in flight), for
    // comparison; each under its own key prefix so that every run starts from an empty store.
    let mut depths = Vec::new();
    for depth in [(1, 1), (1, 2), (2, 1)] {
        if depth == defaults {
            continue;
        }
        compact(&endpoints).await?;
        let (n, t, line) = depth_cycles(&endpoints, depth).await?;
        println!("{line}");
        depths.push((depth, n, n as f64 / t.as_secs_f64()));
    }

    // The ceiling: the same cycles as an ideal client would send them (`cluster/ceiling.rs`).
    let mut ideal = Vec::new();
    for per_txn in [1, 4, 8, 16] {
        compact(&endpoints).await?;
        let etcd_before = etcd_cpu_seconds(&cluster);
        let (n, t) = ceiling::ideal_cycles(&endpoints, WORKERS, per_txn, RUN_FOR).await?;
        ideal.push((per_txn, n, t, etcd_cpu_seconds(&cluster) - etcd_before));
    }

    let rate = |n: u64, t: Duration| n as f64 / t.as_secs_f64();
    let raw_rate = rate(raw1_n + raw2_n, raw1_t + raw2_t);
    let cycle_rate = rate(cycles_n, cycles_t);
    let per_op = |cpu: f64, n: u64| cpu * 1000.0 / n.max(1) as f64;
    println!(
        "{:<60} {:>10} {:>12} {:>14}",
        "measurement (3-member etcd)", "count", "per second", "etcd CPU ms/op"
    );
    for (label, n, t, cpu) in [
        ("before", raw1_n, raw1_t, raw1_cpu),
        ("after", raw2_n, raw2_t, raw2_cpu),
    ] {
        println!(
            "{:<60} {:>10} {:>12.0} {:>14.3}",
            format!("raw single-key Txn, {WORKERS} clients, {label} the cycles"),
            n,
            rate(n, t),
            per_op(cpu, n)
        );
    }
    println!(
        "{:<60} {:>10} {:>12.0} {:>14.3}",
        format!("job cycles add/accept/update/finish, {WORKERS} workers"),
        cycles_n,
        cycle_rate,
        per_op(etcd_cpu, cycles_n)
    );
    for ((commits, reads), n, rate) in depths {
        println!(
            "{:<60} {:>10} {:>12.0}",
            format!("job cycles, {commits} commit / {reads} read Txns in flight"),
            n,
            rate
        );
    }
    let mut best_ideal: f64 = 0.0;
    for (per_txn, n, t, cpu) in ideal {
        println!(
            "{:<60} {:>10} {:>12.0} {:>14.3}",
            format!("ideal client's cycles, {per_txn} workers per Txn"),
            n,
            rate(n, t),
            per_op(cpu, n)
        );
        best_ideal = best_ideal.max(rate(n, t));
    }
    let raw_rate = raw_rate.max(f64::MIN_POSITIVE);
    println!(
        "RESULT jobs_cycles_ideal_client_over_raw_txn = {:.3}",
        best_ideal / raw_rate
    );
    println!(
        "RESULT jobs_cycles_etcd_over_raw_txn = {:.3}",
        cycle_rate / raw_rate
    );
    Ok(())
}

fn main() -> BenchResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let parts = std::env::var("BENCH_PARTS").unwrap_or_else(|_| "1,2".into());
    if parts.split(',').any(|p| p.trim() == "1") {
        runtime.block_on(part1())?;
    }
    if parts.split(',').any(|p| p.trim() == "2") {
        runtime.block_on(part2::run())?;
    }
    Ok(())
}
