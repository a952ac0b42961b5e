//! Tools benchmark (issue 28): `verify` against replicating, same run, same servers. Fills a
//! source with the replication bench's data set (`BENCH_DOCS` documents, 100,000 by default:
//! ~1 KB each, some with several revisions, conflicts and attachments), then measures our
//! engine replicating it one-shot into a fresh target, `verify` of that target (`_revs_diff`
//! only) and `verify --deep` (also `_bulk_get` on both sides), with each process's CPU.
//!
//! It runs on two kinds of server, each pair in the same run: a real CouchDB 3.4.3 source and
//! target (what operators verify; needs `COUCHDB_PEER_SCRIPT`, else skipped with a message)
//! and pouchdb-server `--in-memory` ones, and prints `RESULT verify_docs_per_s_over_replicate`
//! (CouchDB) and `RESULT verify_docs_per_s_over_replicate_pouchdb`. `BENCH_SERVERS=couchdb` or
//! `pouchdb` runs one kind. Then the whole-server part (`tools/all_dbs.rs`, CouchDB only):
//! `RESULT all_dbs_seconds_ours_over_couchdb`. `BENCH_PARTS=verify` or `all_dbs` runs one part. `BENCH_WORKERS` / `BENCH_BATCH` apply to both (CouchDB's defaults
//! 4 / 500).

#[path = "tools/all_dbs.rs"]
mod all_dbs;
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
#[path = "scheduler/peers.rs"]
mod peers;
#[allow(dead_code)]
#[path = "replication/servers.rs"]
mod servers;

use std::future::Future;
use std::time::Instant;

use couch_replicator::replication::verify::{VerifyOptions, verify};
use couch_replicator::replication::{Context, Endpoint, ReplicationSpec, replicate};
use peers::Couch;
use servers::Server;

/// A source or target server of either kind.
enum Peer {
    Pouch(Server),
    Couch(Couch),
}

impl Peer {
    async fn start(kind: &str, http: &reqwest::Client) -> Result<Self, String> {
        if kind == "couchdb" {
            Ok(Self::Couch(Couch::start()?))
        } else {
            Ok(Self::Pouch(Server::start(http).await?))
        }
    }

    fn db(&self, db: &str) -> String {
        match self {
            Self::Pouch(s) => s.db(db),
            Self::Couch(c) => c.url(db),
        }
    }

    fn cpu_seconds(&self) -> f64 {
        match self {
            Self::Pouch(s) => s.cpu_seconds(),
            Self::Couch(c) => measure::proc_cpu_seconds(c.beam).unwrap_or(0.0),
        }
    }

    async fn create_db(&self, http: &reqwest::Client, db: &str) -> Result<(), String> {
        match self {
            Self::Pouch(s) => s.create_db(http, db).await,
            Self::Couch(c) => {
                let r = http
                    .put(c.url(db))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if r.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("PUT {db} answered {}", r.status()))
                }
            }
        }
    }
}

/// One measured run: wall seconds and CPU seconds of (this process, source, target).
struct Row {
    name: &'static str,
    wall_s: f64,
    cpu: [f64; 3],
    revisions: u64,
}

fn main() {
    // On Ctrl-C the run is dropped, which kills the servers it started.
    entry::run_main("tools", run());
}

/// Runs `f`, timing it and the CPU each process spent meanwhile.
async fn measured<T>(
    name: &'static str,
    src: &Peer,
    tgt: &Peer,
    f: impl Future<Output = Result<(T, u64), String>>,
) -> Result<(T, Row), String> {
    let cpu = || {
        [
            measure::self_cpu_seconds(),
            src.cpu_seconds(),
            tgt.cpu_seconds(),
        ]
    };
    let (c0, t) = (cpu(), Instant::now());
    let (v, revisions) = f.await?;
    let wall_s = t.elapsed().as_secs_f64();
    let c1 = cpu();
    let row = Row {
        name,
        wall_s,
        cpu: [c1[0] - c0[0], c1[1] - c0[1], c1[2] - c0[2]],
        revisions,
    };
    Ok((v, row))
}

async fn run() -> Result<(), String> {
    let kinds = std::env::var("BENCH_SERVERS").unwrap_or_else(|_| "couchdb,pouchdb".into());
    let parts = std::env::var("BENCH_PARTS").unwrap_or_else(|_| "verify,all_dbs".into());
    let couch = std::env::var_os("COUCHDB_PEER_SCRIPT").is_some();
    for kind in kinds.split(',').filter(|_| parts.contains("verify")) {
        if kind == "couchdb" && !couch {
            println!("couchdb: skipped (set COUCHDB_PEER_SCRIPT to the CouchDB 3.4.3 peer script)");
            continue;
        }
        run_on(kind).await?;
    }
    if parts.contains("all_dbs") {
        if couch {
            all_dbs::run().await?;
        } else {
            println!("all_dbs: skipped (set COUCHDB_PEER_SCRIPT to the CouchDB 3.4.3 peer script)");
        }
    }
    Ok(())
}

async fn run_on(kind: &str) -> Result<(), String> {
    let n = entry::env_num("BENCH_DOCS", 100_000) as u64;
    let workers = entry::env_num("BENCH_WORKERS", 4);
    let batch = entry::env_num("BENCH_BATCH", 500);
    let http = reqwest::Client::builder()
        .no_proxy()
        .gzip(false)
        .build()
        .map_err(|e| e.to_string())?;
    let source = Peer::start(kind, &http).await?;
    source.create_db(&http, "source").await?;
    eprintln!("filling the source with {n} documents...");
    let fill = load::fill(&http, &source.db("source"), n).await?;
    eprintln!("source filled in {:.1} s", fill.as_secs_f64());
    let target = Peer::start(kind, &http).await?;
    target.create_db(&http, "target").await?;
    let mut spec = ReplicationSpec::new(
        Endpoint::parse(&source.db("source")).map_err(|e| e.to_string())?,
        Endpoint::parse(&target.db("target")).map_err(|e| e.to_string())?,
    );
    spec.options.worker_processes = workers;
    spec.options.worker_batch_size = batch;

    let replication = async {
        let s = replicate(spec.clone(), Context::default())
            .await
            .map_err(|e| format!("replication failed: {e}"))?;
        Ok(((), s.docs_read))
    };
    let ((), row) = measured("replicate (ours)", &source, &target, replication).await?;
    let mut rows = vec![row];
    for (name, deep) in [("verify", false), ("verify --deep", true)] {
        let opts = VerifyOptions {
            deep,
            progress: None,
        };
        let check = async {
            let r = verify(&spec, &Context::default(), &opts)
                .await
                .map_err(|e| format!("{name} failed: {e}"))?;
            if !r.complete || r.docs_checked != n {
                return Err(format!(
                    "{name}: expected a complete target of {n} docs: {r:?}"
                ));
            }
            Ok(((), r.leaves_checked))
        };
        rows.push(measured(name, &source, &target, check).await?.1);
    }
    let servers = if kind == "couchdb" {
        "CouchDB 3.4.3"
    } else {
        "pouchdb-server --in-memory"
    };
    print_table(n, servers, workers, batch, &rows);
    let rate = |i: usize| n as f64 / rows[i].wall_s;
    let suffix = if kind == "couchdb" { "" } else { "_pouchdb" };
    println!(
        "RESULT verify_docs_per_s_over_replicate{suffix} = {:.2}",
        rate(1) / rate(0)
    );
    println!(
        "RESULT verify_deep_docs_per_s_over_replicate{suffix} = {:.2}",
        rate(2) / rate(0)
    );
    Ok(())
}

fn print_table(n: u64, servers: &str, workers: usize, batch: usize, rows: &[Row]) {
    println!(
        "tools benchmark: {n} docs, {servers} source and target, \
         worker_processes={workers} worker_batch_size={batch}, {} cores",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!(
        "{:<18} {:>9} {:>8} {:>10} {:>8} {:>8} {:>8}",
        "run", "docs/s", "wall s", "revisions", "ours s", "src s", "tgt s"
    );
    for r in rows {
        println!(
            "{:<18} {:>9.0} {:>8.2} {:>10} {:>8.2} {:>8.2} {:>8.2}",
            r.name,
            n as f64 / r.wall_s,
            r.wall_s,
            r.revisions,
            r.cpu[0],
            r.cpu[1],
            r.cpu[2]
        );
    }
    println!("(ours / src / tgt s: CPU seconds of this process and of each server)");
}
