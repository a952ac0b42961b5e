//! Scheduler benchmark (issue 14): N continuous replications (`BENCH_JOBS`, default 10,000)
//! on one node, each of one document (`doc_ids`) from one source database of a real CouchDB
//! 3.4.3 endpoint into a target database there. The jobs are split between two `_replicator`
//! databases in proportion to their shares: one in ten (job i with i % 10 == 0) in
//! `a/_replicator` (100 shares), the rest in `b/_replicator` (900 shares); so fair share and
//! per-job fairness coincide: every job's fair running time is `max_jobs`/N of the time and both
//! databases rotate with the same period. The same N jobs run first on our node (in this
//! process, on an embedded store), then on a second CouchDB 3.4.3 whose own scheduler is given
//! the same documents in the same two databases and the same settings (`max_jobs`,
//! `max_churn`, `interval`, shares).
//!
//! Each run warms up for at least one nominal rotation period (below; every job's first
//! turn does more work than the later ones) and until its scheduler has rotated once
//! (CouchDB's first reschedule comes from the 60 s timer it set before the interval was
//! configured), then measures for a window of ten nominal rotation periods (a rotation:
//! ceil(N / min(`max_churn`, `max_jobs`)) intervals, the time for every job to run once under
//! round-robin with one interval per turn; real turns are longer by the schedulers' jitter,
//! so about eight real rotations). In a window of k rotations a job runs k or k + 1 turns
//! whatever its phase, so per-job fairness can only approach 1 as k grows (`BENCH_SECS`
//! overrides the window). Every second it reads which jobs run (fairness: max/min of
//! per-job running samples over all jobs, with their spread and the turns seen per job;
//! fair-share error of the two databases' totals against 100:900), every two seconds the
//! TCP connections the scheduler's process holds to the endpoint, and a hundred times the
//! latency of a document update reaching the target for a running job (p50/p90/p99 of those
//! that arrived within 10 s; those that did not are counted apart, by whether the job was
//! rotated out meanwhile or still ran). Ours is read from
//! the job server (a job counts from its start); CouchDB's from `_active_tasks` (cheap, but
//! a job shows there only once its replication has initialised, so short turns are
//! undercounted). Job starts are each scheduler's own `couch_replicator.jobs` counters.
//!
//! CPU is the scheduler process's over the window: beam's for CouchDB; for ours, this
//! process's less the sampling, which runs on its own OS thread (with its own runtime) whose
//! CPU time is read and subtracted. Answering "which jobs run" is our job server's work on its
//! own task and stays billed to ours, as `_active_tasks` is billed to beam. The CPU result
//! is for the same work: both schedulers get the same settings, but CouchDB 3.4's
//! reschedule stops jobs one by one, synchronously, and at this scale falls far behind
//! `max_churn` (at 10,000 jobs it ran about a fifth of the job turns ours ran in the same
//! window), so the ratio is of CPU per job start, each scheduler's idle upkeep over the time
//! its turns took included; the window's plain CPU ratio is printed beside it. Printed: a
//! table, the spreads and counters, then the ratios as `RESULT` lines.
//!
//! Settings: `BENCH_MAX_JOBS` (default min(500, N/4)), `BENCH_CHURN` (default `max_jobs`),
//! `BENCH_INTERVAL` seconds (default 5). `BENCH_OURS_ONLY` runs our node alone (for tuning:
//! no ratios, no `RESULT` lines); `BENCH_TRACE=FILE` writes each job's turns there (JSON, the
//! last window's: run it with `BENCH_OURS_ONLY` for ours). Needs `COUCHDB_PEER_SCRIPT` (the CouchDB peer script).

#[path = "shared/entry.rs"]
mod entry;
#[path = "replication/measure.rs"]
#[allow(dead_code)]
mod measure;
#[path = "scheduler/peers.rs"]
mod peers;
#[path = "scheduler/runs.rs"]
mod runs;
#[path = "scheduler/sampler.rs"]
mod sampler;

use peers::Couch;
use runs::{Measured, Plan};
use serde_json::{Value, json};

fn main() {
    // On Ctrl-C the run is dropped, which kills the servers it started.
    entry::run_main("scheduler", run());
}

async fn run() -> Result<(), String> {
    let jobs = entry::env_num("BENCH_JOBS", 10_000).max(2);
    let max_jobs = entry::env_num("BENCH_MAX_JOBS", (jobs / 4).clamp(1, 500));
    let mut plan = Plan {
        jobs,
        max_jobs,
        max_churn: entry::env_num("BENCH_CHURN", max_jobs),
        interval_sec: entry::env_num("BENCH_INTERVAL", 5) as u64,
        window_sec: 0,
    };
    // Many rotations: in a window of k rotations a job runs k or k + 1 turns whatever its
    // phase, so max/min can only approach 1 as k grows ((k + 1) / k, and turn lengths vary
    // with the interval's jitter). Ten nominal periods, about eight real ones (ticks come an
    // interval plus up to a third of it apart).
    plan.window_sec = entry::env_num("BENCH_SECS", 10 * plan.rotation_sec() as usize) as u64;
    eprintln!("plan: {plan:?}");
    // No idle sockets: while our node runs, this process's connections to the endpoint are
    // counted as the node's, so the bench's own probes must not linger among them.
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| e.to_string())?;
    let endpoint = Couch::start()?;
    for db in ["src", "tgt_ours", "tgt_couch"] {
        put(&http, &endpoint.url(db), json!({})).await?;
    }
    fill(&http, &endpoint, jobs).await?;
    eprintln!("endpoint filled with {jobs} documents");

    let pending_bytes = runs::pending_job_bytes(&endpoint, &plan).await?;
    eprintln!("ours: {pending_bytes:.0} bytes per pending job");
    let ours = runs::ours(&endpoint, &plan).await?;
    eprintln!("ours: {ours:?}");
    if std::env::var_os("BENCH_OURS_ONLY").is_some() {
        // For tuning our scheduler: no peer run, so no ratios and no RESULT lines.
        report_ours(&plan, &ours);
        return Ok(());
    }
    let scheduler = Couch::start()?;
    let theirs = runs::couchdb(&http, &endpoint, &scheduler, &plan).await?;
    eprintln!("couchdb: {theirs:?}");
    report(&plan, &ours, &theirs);
    memory(&plan, &ours, pending_bytes);
    Ok(())
}

/// Writes documents `d0..d{n}` to the endpoint's `src`.
async fn fill(http: &reqwest::Client, endpoint: &Couch, n: usize) -> Result<(), String> {
    for start in (0..n).step_by(1000) {
        let docs: Vec<Value> = (start..(start + 1000).min(n))
            .map(|i| json!({"_id": format!("d{i}"), "v": 0}))
            .collect();
        let url = endpoint.url("src/_bulk_docs");
        let r = http
            .post(url)
            .json(&json!({ "docs": docs }))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("_bulk_docs: {}", r.status()));
        }
    }
    Ok(())
}

/// PUT `body` to `url`, accepting 2xx and 412 (exists).
pub async fn put(http: &reqwest::Client, url: &str, body: Value) -> Result<Value, String> {
    let r = http
        .put(url)
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    if status.is_success() || status.as_u16() == 412 {
        Ok(v)
    } else {
        Err(format!("PUT {status}: {v}"))
    }
}

/// Memory per job on our node: pending from the queue-only node; running from the main
/// run's RSS growth less what its pending jobs account for.
fn memory(plan: &Plan, ours: &Measured, pending_bytes: f64) {
    let running = plan.max_jobs.min(plan.jobs);
    let pending_share = pending_bytes * (plan.jobs - running) as f64;
    let grown = ours.rss_grown_mb * 1024.0 * 1024.0;
    let running_bytes = (grown - pending_share).max(0.0) / running.max(1) as f64;
    println!(
        "\nour memory per job: pending {:.1} KiB, running {:.1} KiB ({} running, RSS grew {:.1} MiB)",
        pending_bytes / 1024.0,
        running_bytes / 1024.0,
        running,
        ours.rss_grown_mb
    );
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::INFINITY }
}

fn report(plan: &Plan, ours: &Measured, theirs: &Measured) {
    println!(
        "\nscheduler: {} continuous jobs (1 in 10 in a/_replicator, 100 shares; the rest in \
         b/_replicator, 900 shares), max_jobs {}, max_churn {}, interval {} s, \
         rotation {} s, window {} s",
        plan.jobs,
        plan.max_jobs,
        plan.max_churn,
        plan.interval_sec,
        plan.rotation_sec(),
        plan.window_sec
    );
    println!(
        "{:<10} {:>8} {:>9} {:>8} {:>12} {:>10} {:>11} {:>10} {:>9} {:>8} {:>13}",
        "scheduler",
        "cpu s",
        "rss MiB",
        "conns",
        "fair max/min",
        "never ran",
        "share err",
        "p99 ms",
        "probes",
        "starts",
        "cpu ms/start"
    );
    for (name, m) in [("ours", ours), ("couchdb", theirs)] {
        println!(
            "{:<10} {:>8.2} {:>9.1} {:>8.1} {:>12.2} {:>10} {:>11.3} {:>10.0} {:>9} {:>8} {:>13.2}",
            name,
            m.cpu_s,
            m.rss_mb,
            m.connections,
            m.fairness,
            m.never_ran,
            m.share_error,
            m.p99_ms,
            m.probes,
            own_starts(m),
            per_start_ms(m)
        );
    }
    println!(
        "ours: {:.2} CPU s of the bench's sampling thread subtracted",
        ours.bench_cpu_s
    );
    println!(
        "most jobs running at once (sampled every second; max_jobs {}): ours {}, couchdb {}",
        plan.max_jobs, ours.most_running, theirs.most_running
    );
    for (name, m) in [("ours", ours), ("couchdb", theirs)] {
        let [p50, p90, p99] = m.latency_ms;
        println!(
            "{name}: update-to-target latency over {} probes: p50 {p50:.0} ms, p90 {p90:.0} ms, \
             p99 {p99:.0} ms; timed out (10 s) while the job ran: {}, after it was rotated \
             out: {}",
            m.probes, m.probe_timeouts, m.probes_rotated_out
        );
    }
    println!(
        "CPU over the window, ours over couchdb: {:.3}, with {:.2} times couchdb's job starts \
         (each scheduler's own counter)",
        ratio(ours.cpu_s, theirs.cpu_s),
        ratio(own_starts(ours) as f64, own_starts(theirs) as f64)
    );
    if ours.missed + theirs.missed > 0 {
        println!(
            "running set unreadable at {} of our samples, {} of couchdb's (left out)",
            ours.missed, theirs.missed
        );
    }
    for (name, m) in [("ours", ours), ("couchdb", theirs)] {
        print_spread(name, m);
        if let Some(c) = m.own_counts {
            println!(
                "{name}'s own counters over the window: {} job starts, {} stops, {} crashes \
                 ({} jobs seen newly running by the samples, every second)",
                c.starts, c.stops, c.crashes, m.starts
            );
        }
    }
    results(ours, theirs);
}

/// Our figures alone (`BENCH_OURS_ONLY`).
fn report_ours(plan: &Plan, ours: &Measured) {
    println!(
        "ours alone: {} jobs, window {} s: cpu {:.2} s, rss {:.1} MiB, conns {:.1}, fairness \
         {:.2} ({} never ran), share error {:.3}, {} starts, {:.2} cpu ms/start",
        plan.jobs,
        plan.window_sec,
        ours.cpu_s,
        ours.rss_mb,
        ours.connections,
        ours.fairness,
        ours.never_ran,
        ours.share_error,
        own_starts(ours),
        per_start_ms(ours)
    );
    print_spread("ours", ours);
}

/// The per-job running samples' spread.
fn print_spread(name: &str, m: &Measured) {
    for (what, [min, p1, p50, p99, max]) in [
        ("running samples", m.spread),
        ("turns seen", m.turn_spread),
        ("a/_replicator running samples", m.group_spreads[0]),
        ("b/_replicator running samples", m.group_spreads[1]),
        ("a/_replicator turns", m.group_turn_spreads[0]),
        ("b/_replicator turns", m.group_turn_spreads[1]),
    ] {
        println!("{name}: {what} per job: min {min}, p1 {p1}, median {p50}, p99 {p99}, max {max}");
    }
}

/// Job starts over the window: the scheduler's own counter (it also counts a start that no
/// sample saw), else the samples' count.
fn own_starts(m: &Measured) -> u64 {
    m.own_counts.map_or(m.starts as u64, |c| c.starts)
}

/// CPU milliseconds per job start: what one job turn costs the scheduler, its idle upkeep
/// over the time the turn took at its own pace included.
fn per_start_ms(m: &Measured) -> f64 {
    ratio(m.cpu_s * 1000.0, own_starts(m) as f64)
}

fn results(ours: &Measured, theirs: &Measured) {
    // For the same work: both get the same settings, but CouchDB 3.4's reschedule stops
    // jobs one by one, synchronously, and falls far behind `max_churn` at this scale, so in
    // the same window it does a fraction of the job turns ours does. CPU per job start is
    // the CPU each needs for the same number of turns.
    println!(
        "RESULT scheduler_cpu_ours_over_couchdb = {:.3}",
        ratio(per_start_ms(ours), per_start_ms(theirs))
    );
    println!(
        "RESULT scheduler_rss_ours_over_couchdb = {:.3}",
        ratio(ours.rss_mb, theirs.rss_mb)
    );
    println!(
        "RESULT scheduler_connections_ours_over_couchdb = {:.3}",
        ratio(ours.connections, theirs.connections)
    );
    println!(
        "RESULT scheduler_fairness_max_over_min = {:.3}",
        ours.fairness
    );
    println!("RESULT fair_share_error = {:.3}", ours.share_error);
    println!(
        "RESULT change_latency_p99_ours_over_couchdb = {:.3}",
        ratio(ours.p99_ms, theirs.p99_ms)
    );
}
