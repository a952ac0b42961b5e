//! Part 2 of the cluster benchmark: three real `serve` processes on a 3-member etcd run
//! `BENCH_JOBS` (default 3,000) continuous replications, `max_jobs` 500 each, of one
//! document each (`doc_ids`) from one source database of a real CouchDB 3.4.3 into a target
//! there, submitted as `POST /_replicate` to the nodes in turn; then one `serve` process on
//! its embedded store runs the same jobs with the same settings.
//!
//! Each run warms up `BENCH_WARMUP` seconds (default 30), then measures for `BENCH_SECS`
//! (default 60): every second each node's own running jobs
//! (`/_node/_local/_replicator_jobs`), and over the window the processes' CPU
//! (`/proc/PID/stat`, user + system) and job starts (each node's
//! `couch_replicator.jobs.starts`). `RESULT cluster_running_jobs_max_over_min`: the
//! busiest node's summed samples over the least busy one's (the worst single sample is
//! printed beside it). `RESULT cluster_cpu_per_start_over_single_node`: the three processes'
//! CPU per job start over the single node's.

use std::time::{Duration, Instant};

use serde_json::json;

use super::BenchResult;
use super::couch::{Couch, fill_with};
use super::etcd_cluster::EtcdCluster;
use super::failover_drill::{Drill, DrillReport};
use super::serve_cluster::{ServeCluster, libfaketime};

const BIN: &str = env!("CARGO_BIN_EXE_couch-replicator");
const SRC: &str = "cluster_bench_src";
const TGT: &str = "cluster_bench_tgt";

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one run measured.
struct Run {
    /// Per node: the sum of its running-job samples.
    sampled: Vec<u64>,
    /// The worst max/min of one sample.
    worst: f64,
    /// The most jobs one node ran at one sample.
    most: u64,
    cpu: Duration,
    starts: u64,
}

/// User + system CPU of `pid` so far.
fn cpu_of(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}

async fn starts(cluster: &ServeCluster) -> u64 {
    let mut sum = 0;
    for i in cluster.running() {
        if let Ok((_, v)) = cluster
            .call(
                i,
                reqwest::Method::GET,
                "_node/_local/_stats/couch_replicator/jobs/starts",
                None,
            )
            .await
        {
            sum += v["value"].as_u64().unwrap_or(0);
        }
    }
    sum
}

fn cpu(cluster: &ServeCluster) -> Duration {
    cluster
        .running()
        .into_iter()
        .filter_map(|i| cluster.pid(i))
        .map(cpu_of)
        .sum()
}

/// Submits `jobs` continuous one-document replications to the nodes in turn, 8 at a time.
async fn submit(cluster: &ServeCluster, couch: &Couch, jobs: usize) -> BenchResult<()> {
    let nodes = cluster.running();
    let started = Instant::now();
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(8) {
        let calls = chunk.iter().map(|&k| {
            let body = json!({"source": couch.url(SRC), "target": couch.url(TGT),
                "continuous": true, "doc_ids": [format!("d{k:06}")]});
            let node = nodes[k % nodes.len()];
            async move {
                cluster
                    .call(node, reqwest::Method::POST, "_replicate", Some(&body))
                    .await
            }
        });
        for answer in futures::future::join_all(calls).await {
            let (status, body) = answer?;
            if status != 202 && status != 200 {
                return Err(format!("_replicate answered {status}: {body}").into());
            }
        }
    }
    println!(
        "submitted {jobs} jobs in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Warms up, then samples for the window.
async fn measure(cluster: &ServeCluster, warmup: Duration, window: Duration) -> Run {
    tokio::time::sleep(warmup).await;
    let nodes = cluster.running();
    let (cpu0, starts0) = (cpu(cluster), starts(cluster).await);
    let mut run = Run {
        sampled: vec![0; nodes.len()],
        worst: 1.0,
        most: 0,
        cpu: Duration::ZERO,
        starts: 0,
    };
    let end = Instant::now() + window;
    while Instant::now() < end {
        let mut sample = Vec::with_capacity(nodes.len());
        for &i in &nodes {
            sample.push(cluster.local_jobs(i).await.map_or(0, |j| j.len()) as u64);
        }
        for (sum, n) in run.sampled.iter_mut().zip(&sample) {
            *sum += n;
        }
        run.worst = run.worst.max(ratio(&sample));
        run.most = run.most.max(sample.iter().copied().max().unwrap_or(0));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    run.cpu = cpu(cluster).saturating_sub(cpu0);
    run.starts = starts(cluster).await.saturating_sub(starts0);
    run
}

fn ratio(v: &[u64]) -> f64 {
    let (max, min) = (
        v.iter().copied().max().unwrap_or(0),
        v.iter().copied().min().unwrap_or(0),
    );
    max as f64 / min.max(1) as f64
}

fn cpu_per_start(run: &Run) -> f64 {
    run.cpu.as_secs_f64() / run.starts.max(1) as f64
}

/// Runs part 2; skips (saying so) without CouchDB or etcd.
pub async fn run() -> BenchResult<()> {
    let couch = match Couch::start() {
        Ok(c) => c,
        Err(e) => {
            println!("part 2 skipped: {e}");
            return Ok(());
        }
    };
    let Some(etcd) = EtcdCluster::start(3).await else {
        return Ok(());
    };
    let jobs = env_num("BENCH_JOBS", 3000) as usize;
    let warmup = Duration::from_secs(env_num("BENCH_WARMUP", 30));
    let window = Duration::from_secs(env_num("BENCH_SECS", 60));
    let http = reqwest::Client::new();
    fill_with(
        &http,
        &couch,
        SRC,
        jobs,
        500,
        |i| json!({"_id": format!("d{i:06}"), "n": i}),
    )
    .await?;
    let r = http.put(couch.url(TGT)).send().await?;
    if !r.status().is_success() {
        return Err(format!("PUT /{TGT}: {}", r.status()).into());
    }
    // Production timings but a short interval, so the window holds many rotations.
    let ini = "[replicator]\nmax_jobs = 500\ninterval_sec = 5\njob_timeout_sec = 61\n\
               startup_jitter = 1000\n";

    let endpoints = etcd.endpoints().join(",");
    let three = {
        let mut cluster = ServeCluster::prepare(BIN.as_ref(), &endpoints, 3, ini)?;
        if let Some(lib) = libfaketime() {
            println!("node 2's wall clock runs 90 s ahead (libfaketime)");
            cluster.set_env(1, "LD_PRELOAD", lib);
            cluster.set_env(1, "FAKETIME", "+90s");
            cluster.set_env(1, "FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        for i in 0..3 {
            cluster.restart(i).await?;
        }
        submit(&cluster, &couch, jobs).await?;
        measure(&cluster, warmup, window).await
    };
    drop(etcd);
    let single = {
        let cluster = ServeCluster::start(BIN.as_ref(), "", 1, ini).await?;
        submit(&cluster, &couch, jobs).await?;
        measure(&cluster, warmup, window).await
    };
    print_results(jobs, window, &three, &single);
    drill(&couch).await
}

/// The failover drill on CouchDB: `BENCH_DRILL_JOBS` (default 30) continuous jobs.
async fn drill(couch: &Couch) -> BenchResult<()> {
    let Some(etcd) = EtcdCluster::start(3).await else {
        return Ok(());
    };
    let drill = Drill {
        bin: BIN.into(),
        upstream_root: format!("http://127.0.0.1:{}", couch.port),
        credentials: Some(("admin".into(), "admin".into())),
        etcd: etcd.endpoints(),
        jobs: env_num("BENCH_DRILL_JOBS", 30) as usize,
        faketime: libfaketime().map(str::to_owned),
        ini: String::new(),
    };
    let report = drill.run().await?;
    print_drill(&drill, &report);
    Ok(())
}

fn print_drill(drill: &Drill, report: &DrillReport) {
    println!(
        "failover drill: {} continuous jobs on 3 serve processes, CouchDB 3.4.3, a writer \
         adding a document to every source each second; clocks {}",
        drill.jobs,
        if drill.faketime.is_some() {
            "of node 2 +90 s and node 3 -90 s"
        } else {
            "untouched (libfaketime not installed)"
        }
    );
    println!("{:<36} {:>10}", "phase", "seconds");
    for (phase, took) in &report.phases {
        println!("{phase:<36} {:>10.1}", took.as_secs_f64());
    }
    println!(
        "the longest pause's requests (ms, pid, method, path): {:?}",
        report.pause_evidence
    );
    for (pair, requests) in report.double_runs.iter().zip(&report.evidence) {
        println!("double run: {pair:?}\n  requests: {requests:?}");
    }
    println!(
        "RESULT failover_seconds = {:.1}",
        report.failover.as_secs_f64()
    );
    println!(
        "RESULT rolling_restart_max_pause_seconds = {:.1}",
        report.rolling_pause.as_secs_f64()
    );
    println!("RESULT double_runs = {}", report.double_runs.len());
}

fn print_results(jobs: usize, window: Duration, three: &Run, single: &Run) {
    let secs = window.as_secs_f64();
    println!("{jobs} continuous jobs, max_jobs 500 per node, {secs:.0} s window");
    println!(
        "{:<44} {:>22} {:>10} {:>8} {:>12}",
        "run", "mean running per node", "CPU s", "starts", "CPU ms/start"
    );
    for (name, run) in [
        ("3 serve processes on 3-member etcd", three),
        ("1 serve process, embedded store", single),
    ] {
        let means: Vec<String> = run
            .sampled
            .iter()
            .map(|s| format!("{:.0}", *s as f64 / secs))
            .collect();
        println!(
            "{:<44} {:>22} {:>10.1} {:>8} {:>12.2}",
            name,
            means.join("/"),
            run.cpu.as_secs_f64(),
            run.starts,
            cpu_per_start(run) * 1000.0
        );
    }
    println!("worst single sample max/min (3 nodes): {:.3}", three.worst);
    println!(
        "most jobs one node ran at a sample (max_jobs 500): 3 nodes {}, single node {}",
        three.most, single.most
    );
    println!(
        "RESULT cluster_running_jobs_max_over_min = {:.3}",
        ratio(&three.sampled)
    );
    let single_cost = cpu_per_start(single);
    let over = if single_cost > 0.0 {
        format!("{:.3}", cpu_per_start(three) / single_cost)
    } else {
        "n/a (no job start in the single-node window)".into()
    };
    println!("RESULT cluster_cpu_per_start_over_single_node = {over}");
}
