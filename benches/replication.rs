//! Replication benchmark (issue 4 item 5): fills a pouchdb-server source with the data set of
//! `data.rs` (100,000 docs of ~1 KB by default, `BENCH_DOCS=N` for quick runs), then in the
//! same run measures
//! - the read ceiling: the source read alone (`_changes` + `_bulk_get`, batches of 500);
//! - the write ceiling: a fresh target's `_bulk_docs` ingest of the same docs alone;
//! - our engine, in-process, one-shot into a fresh target (CPU from getrusage of this process:
//!   the servers and node are children; peak RSS from VmHWM reset just before);
//! - PouchDB's replicator (node, HTTP to HTTP) into a fresh target;
//!
//! verifies both targets, prints a table with each process's CPU use, then the ratios as
//! `RESULT` lines. Each target is a fresh pouchdb-server so no run inherits another's heap.
//! Options for our engine: `BENCH_WORKERS`, `BENCH_BATCH`, `BENCH_CONNS` (CouchDB's
//! `worker_processes`, `worker_batch_size`, `http_connections`); PouchDB's: `BATCH_SIZE`,
//! `BATCHES_LIMIT`. The values used are printed. `BENCH_ONLY=ours` runs only our engine (for
//! profiling; no `RESULT` lines then).

#[path = "replication/data.rs"]
mod data;
#[path = "shared/entry.rs"]
mod entry;
#[path = "replication/load.rs"]
mod load;
#[path = "replication/measure.rs"]
mod measure;
#[path = "replication/pouchdb.rs"]
mod pouchdb;
#[path = "replication/servers.rs"]
mod servers;
#[path = "replication/verify.rs"]
mod verify;

use std::time::Instant;

use couch_replicator::replication::{Context, Endpoint, ReplicationSpec, replicate};
use measure::RunnableSampler;
use servers::Server;

/// One measured run.
struct Row {
    name: &'static str,
    wall_s: f64,
    /// Replicator (or client) process CPU seconds, if measured.
    cpu_s: Option<f64>,
    src_cpu_s: f64,
    tgt_cpu_s: f64,
    /// Fraction of the run each server was runnable (CPU-bound near 1).
    src_runnable: Option<f64>,
    tgt_runnable: Option<f64>,
}

fn main() {
    // On Ctrl-C the run is dropped, which kills the servers it started.
    entry::run_main("replication", run());
}

async fn run() -> Result<(), String> {
    let n = entry::env_num("BENCH_DOCS", 100_000) as u64;
    // No compression: the ceilings must be the servers' best raw rates.
    let http = reqwest::Client::builder()
        .no_proxy()
        .gzip(false)
        .build()
        .map_err(|e| e.to_string())?;
    let source = Server::start(&http).await?;
    source.create_db(&http, "source").await?;
    let src_db = source.db("source");
    eprintln!("filling the source with {n} documents...");
    let fill = load::fill(&http, &src_db, n).await?;
    let checked = verify::verify(&http, &src_db, n).await?;
    eprintln!(
        "source filled in {:.1} s and verified ({checked:?})",
        fill.as_secs_f64()
    );
    let mut rows = Vec::new();
    let only_ours = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "ours");

    // Read ceiling: the source alone.
    if !only_ours {
        let c0 = source.cpu_seconds();
        let sampler = RunnableSampler::start(vec![source.pid()]);
        let (docs, revs, took) = load::read_all(&http, &src_db).await?;
        let runnable = sampler.stop();
        if docs != n {
            return Err(format!("read ceiling saw {docs} docs, expected {n}"));
        }
        rows.push(Row {
            name: "ceiling: source read",
            wall_s: took.as_secs_f64(),
            cpu_s: None,
            src_cpu_s: source.cpu_seconds() - c0,
            tgt_cpu_s: 0.0,
            src_runnable: runnable.first().copied(),
            tgt_runnable: None,
        });
        eprintln!(
            "read ceiling: {revs} revisions in {:.1} s",
            took.as_secs_f64()
        );

        // Write ceiling: a fresh target alone.
        {
            let target = Server::start(&http).await?;
            target.create_db(&http, "ceiling").await?;
            let c0 = target.cpu_seconds();
            let sampler = RunnableSampler::start(vec![target.pid()]);
            let took = load::fill(&http, &target.db("ceiling"), n).await?;
            let runnable = sampler.stop();
            rows.push(Row {
                name: "ceiling: target write",
                wall_s: took.as_secs_f64(),
                cpu_s: None,
                src_cpu_s: 0.0,
                tgt_cpu_s: target.cpu_seconds() - c0,
                src_runnable: None,
                tgt_runnable: runnable.first().copied(),
            });
        }
    }

    // Our engine.
    let workers = entry::env_num("BENCH_WORKERS", 4);
    let batch = entry::env_num("BENCH_BATCH", 500);
    let conns = entry::env_num("BENCH_CONNS", 20);
    let ours_rss;
    {
        let target = Server::start(&http).await?;
        target.create_db(&http, "ours").await?;
        let src_ep = Endpoint::parse(&src_db).map_err(|e| e.to_string())?;
        let tgt_ep = Endpoint::parse(&target.db("ours")).map_err(|e| e.to_string())?;
        let mut spec = ReplicationSpec::new(src_ep, tgt_ep);
        spec.options.worker_processes = workers;
        spec.options.worker_batch_size = batch;
        spec.options.http_connections = conns;
        let (s0, t0c) = (source.cpu_seconds(), target.cpu_seconds());
        eprintln!("ours: replicating (pid {})", std::process::id());
        let exact_peak = measure::reset_peak_rss();
        let sampler = RunnableSampler::start(vec![source.pid(), target.pid()]);
        let cpu0 = measure::self_cpu_seconds();
        let t = Instant::now();
        let stats = replicate(spec, Context::default())
            .await
            .map_err(|e| format!("our replication failed: {e}"))?;
        let wall = t.elapsed().as_secs_f64();
        let cpu = measure::self_cpu_seconds() - cpu0;
        ours_rss = measure::peak_rss_mb();
        let runnable = sampler.stop();
        if !exact_peak {
            eprintln!("note: could not reset VmHWM; peak RSS covers the whole bench process");
        }
        rows.push(Row {
            name: "ours (in-process)",
            wall_s: wall,
            cpu_s: Some(cpu),
            src_cpu_s: source.cpu_seconds() - s0,
            tgt_cpu_s: target.cpu_seconds() - t0c,
            src_runnable: runnable.first().copied(),
            tgt_runnable: runnable.get(1).copied(),
        });
        eprintln!(
            "ours: docs_written={} failures={} docs_read={}",
            stats.docs_written, stats.doc_write_failures, stats.docs_read
        );
        let c = verify::verify(&http, &target.db("ours"), n).await?;
        eprintln!("ours: target verified ({c:?})");
    }

    // PouchDB's replicator.
    let mut pouch_options = serde_json::Value::Null;
    if !only_ours {
        let target = Server::start(&http).await?;
        target.create_db(&http, "pouch").await?;
        let (s0, t0c) = (source.cpu_seconds(), target.cpu_seconds());
        let sampler = RunnableSampler::start(vec![source.pid(), target.pid()]);
        let p = pouchdb::replicate(&src_db, &target.db("pouch")).await?;
        let runnable = sampler.stop();
        rows.push(Row {
            name: "PouchDB 9 (node)",
            wall_s: p.wall_s,
            cpu_s: Some(p.cpu_s),
            src_cpu_s: source.cpu_seconds() - s0,
            tgt_cpu_s: target.cpu_seconds() - t0c,
            src_runnable: runnable.first().copied(),
            tgt_runnable: runnable.get(1).copied(),
        });
        eprintln!("pouchdb: docs_written={}", p.docs_written);
        pouch_options = p.options;
        let c = verify::verify(&http, &target.db("pouch"), n).await?;
        eprintln!("pouchdb: target verified ({c:?})");
    }

    println!(
        "replication benchmark: {n} docs (~1 KB; 10% several revisions, 1/3 of those \
         conflicted; 1% with a 20 KB attachment), pouchdb-server 4.2.0 --in-memory, {} cores",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!(
        "ours: worker_processes={workers} worker_batch_size={batch} http_connections={conns} \
         (CouchDB defaults 4/500/20); PouchDB: {pouch_options}"
    );
    println!(
        "{:<22} {:>8} {:>8} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6}",
        "run",
        "docs/s",
        "wall s",
        "client CPU",
        "client/doc",
        "src/doc",
        "tgt/doc",
        "src busy",
        "tgt busy",
        "src R",
        "tgt R"
    );
    println!(
        "(CPU in seconds or µs per document; busy = server CPU / wall, one core = 100%; \
         R = share of 10 ms samples the server was runnable, i.e. wanted a core)"
    );
    let pct = |f: Option<f64>| f.map_or("-".into(), |f| format!("{:.0}%", f * 100.0));
    for r in &rows {
        let cpu = r.cpu_s.map_or("-".into(), |c| format!("{c:.2}"));
        let per = r
            .cpu_s
            .map_or("-".into(), |c| format!("{:.0}", c * 1e6 / n as f64));
        let us = |c: f64| {
            if c > 0.0 {
                format!("{:.0}", c * 1e6 / n as f64)
            } else {
                "-".into()
            }
        };
        println!(
            "{:<22} {:>8.0} {:>8.2} {:>10} {:>10} {:>8} {:>8} {:>8.0}% {:>8.0}% {:>6} {:>6}",
            r.name,
            n as f64 / r.wall_s,
            r.wall_s,
            cpu,
            per,
            us(r.src_cpu_s),
            us(r.tgt_cpu_s),
            100.0 * r.src_cpu_s / r.wall_s,
            100.0 * r.tgt_cpu_s / r.wall_s,
            pct(r.src_runnable),
            pct(r.tgt_runnable)
        );
    }
    if only_ours {
        return Ok(());
    }
    let rate = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .map_or(0.0, |r| n as f64 / r.wall_s)
    };
    let cpu = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| r.cpu_s)
            .unwrap_or(0.0)
    };
    let ceiling = rate("ceiling: source read").min(rate("ceiling: target write"));
    let ours = rate("ours (in-process)");
    println!("ceiling (lower of read and write alone): {ceiling:.0} docs/s");
    println!(
        "RESULT docs_per_s_ours_over_pouchdb = {:.2}",
        ours / rate("PouchDB 9 (node)")
    );
    println!(
        "RESULT docs_per_s_ours_over_ceiling = {:.2}",
        ours / ceiling
    );
    println!(
        "RESULT cpu_s_ours_over_pouchdb = {:.3}",
        cpu("ours (in-process)") / cpu("PouchDB 9 (node)")
    );
    // Absolute, so not a RESULT line: the PouchDB replicator's node process has no
    // comparable window to measure.
    println!("peak RSS of ours during the run: {ours_rss:.1} MiB");
    Ok(())
}
