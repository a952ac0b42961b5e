//! Tools benchmark (issue 28): `verify` against replicating, same run, same servers. Fills a
//! pouchdb-server source with the replication bench's data set (`BENCH_DOCS` documents, 100,000
//! by default: ~1 KB each, some with several revisions, conflicts and attachments), then
//! measures our engine replicating it one-shot into a fresh pouchdb-server target, `verify`
//! of that target (`_revs_diff` only) and `verify --deep` (also `_bulk_get` on both sides),
//! and prints a table and `RESULT verify_docs_per_s_over_replicate = X`.
//! `BENCH_WORKERS` / `BENCH_BATCH` apply to both (CouchDB's defaults 4 / 500).

#[allow(dead_code)]
#[path = "replication/data.rs"]
mod data;
#[allow(dead_code)]
#[path = "shared/entry.rs"]
mod entry;
#[allow(dead_code)]
#[path = "replication/load.rs"]
mod load;
#[allow(dead_code)]
#[path = "replication/measure.rs"]
mod measure;
#[allow(dead_code)]
#[path = "replication/servers.rs"]
mod servers;

use std::time::Instant;

use couch_replicator::replication::verify::{VerifyOptions, verify};
use couch_replicator::replication::{Context, Endpoint, ReplicationSpec, replicate};
use servers::Server;

fn main() {
    // On Ctrl-C the run is dropped, which kills the servers it started.
    entry::run_main("tools", run());
}

async fn run() -> Result<(), String> {
    let n = entry::env_num("BENCH_DOCS", 100_000) as u64;
    let workers = entry::env_num("BENCH_WORKERS", 4);
    let batch = entry::env_num("BENCH_BATCH", 500);
    let http = reqwest::Client::builder()
        .no_proxy()
        .gzip(false)
        .build()
        .map_err(|e| e.to_string())?;
    let source = Server::start(&http).await?;
    source.create_db(&http, "source").await?;
    eprintln!("filling the source with {n} documents...");
    let fill = load::fill(&http, &source.db("source"), n).await?;
    eprintln!("source filled in {:.1} s", fill.as_secs_f64());
    let target = Server::start(&http).await?;
    target.create_db(&http, "target").await?;
    let mut spec = ReplicationSpec::new(
        Endpoint::parse(&source.db("source")).map_err(|e| e.to_string())?,
        Endpoint::parse(&target.db("target")).map_err(|e| e.to_string())?,
    );
    spec.options.worker_processes = workers;
    spec.options.worker_batch_size = batch;

    let t = Instant::now();
    let stats = replicate(spec.clone(), Context::default())
        .await
        .map_err(|e| format!("replication failed: {e}"))?;
    let replicate_s = t.elapsed().as_secs_f64();
    eprintln!("replicated: {} revisions written", stats.docs_written);

    let mut rows = vec![("replicate (ours)", replicate_s, stats.docs_read)];
    for (name, deep) in [("verify", false), ("verify --deep", true)] {
        let opts = VerifyOptions {
            deep,
            progress: None,
        };
        let t = Instant::now();
        let r = verify(&spec, &Context::default(), &opts)
            .await
            .map_err(|e| format!("{name} failed: {e}"))?;
        let took = t.elapsed().as_secs_f64();
        if !r.complete || r.docs_checked != n {
            return Err(format!("{name}: expected a complete target of {n} docs: {r:?}"));
        }
        rows.push((name, took, r.leaves_checked));
    }

    println!(
        "tools benchmark: {n} docs, pouchdb-server --in-memory source and target, \
         worker_processes={workers} worker_batch_size={batch}, {} cores",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!("{:<18} {:>10} {:>9} {:>12}", "run", "docs/s", "wall s", "revisions");
    for (name, wall, revs) in &rows {
        println!("{name:<18} {:>10.0} {wall:>9.2} {revs:>12}", n as f64 / wall);
    }
    let rate = |i: usize| n as f64 / rows[i].1;
    println!(
        "RESULT verify_docs_per_s_over_replicate = {:.2}",
        rate(1) / rate(0)
    );
    println!(
        "RESULT verify_deep_docs_per_s_over_replicate = {:.2}",
        rate(2) / rate(0)
    );
    Ok(())
}
