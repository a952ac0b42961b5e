//! Attachments benchmark (issue 27 point 1): a real CouchDB 3.4.3 holds a source of documents
//! with one compressible text attachment each (2,000 docs of 6 KiB by default; `BENCH_DOCS`,
//! `BENCH_ATT_BYTES`), which CouchDB stores gzip-encoded. The same one-shot replication into a
//! fresh target on the same CouchDB is run by CouchDB's own replicator (`POST /_replicate`) and
//! by ours (in-process), each with source and target behind its own byte-counting TCP relay,
//! so the bytes on the wire are counted the same way for both. Both targets are checked against
//! the source (every document's revision and attachment stubs: `encoding`, `digest`, lengths).
//! Prints a table, then `RESULT attachment_bytes_on_wire_ours_over_couchdb` and
//! `RESULT attachment_docs_per_s_ours_over_couchdb`.

#[path = "attachments/couch.rs"]
mod couch;
#[path = "shared/entry.rs"]
mod entry;
#[path = "shared/relay.rs"]
mod relay;

use std::time::Instant;

use couch_replicator::replication::{Context, ReplicationSpec, replicate};
use serde_json::json;

use couch::Couch;
use relay::Relay;

/// One measured replication.
struct Row {
    name: &'static str,
    wall_s: f64,
    docs_per_s: f64,
    to_server: u64,
    to_client: u64,
}

impl Row {
    fn total(&self) -> u64 {
        self.to_server + self.to_client
    }
}

fn main() {
    entry::run_main("attachments", run());
}

async fn run() -> Result<(), String> {
    let n = entry::env_num("BENCH_DOCS", 2_000);
    let att_len = entry::env_num("BENCH_ATT_BYTES", 6 * 1024);
    let http = reqwest::Client::builder()
        .no_proxy()
        .gzip(false)
        .build()
        .map_err(|e| e.to_string())?;
    let couch = Couch::start()?;
    eprintln!("filling the source with {n} documents of one {att_len}-byte text attachment...");
    couch::fill(&http, &couch, "source", n, att_len).await?;
    let source = couch::stubs(&http, &couch, "source").await?;
    if source.len() != n {
        return Err(format!("source holds {} documents, not {n}", source.len()));
    }

    let theirs = {
        let relay = Relay::start(couch.port).await?;
        let url = |db: &str| format!("http://admin:admin@127.0.0.1:{}/{db}", relay.port);
        let t0 = Instant::now();
        couch::couch_replicate(&http, &couch, &url("source"), &url("theirs")).await?;
        measured("CouchDB 3.4.3 replicator", t0, n, &relay)
    };
    let ours = {
        let relay = Relay::start(couch.port).await?;
        let url = |db: &str| format!("http://admin:admin@127.0.0.1:{}/{db}", relay.port);
        let spec = ReplicationSpec::from_json(
            &json!({"source": url("source"), "target": url("ours"), "create_target": true}),
        )
        .map_err(|e| format!("spec: {e}"))?;
        let t0 = Instant::now();
        let stats = replicate(spec, Context::default())
            .await
            .map_err(|e| format!("our replication: {e}"))?;
        if stats.doc_write_failures != 0 {
            return Err(format!("{} write failures", stats.doc_write_failures));
        }
        measured("ours", t0, n, &relay)
    };
    for db in ["theirs", "ours"] {
        let got = couch::stubs(&http, &couch, db).await?;
        if got != source {
            return Err(format!(
                "target `{db}` differs from the source (revisions or stubs)"
            ));
        }
    }
    eprintln!(
        "both targets verified: {n} documents, stubs (encoding, digest, lengths) as in the source"
    );
    print_table(n, att_len, &[&theirs, &ours]);
    println!(
        "RESULT attachment_bytes_on_wire_ours_over_couchdb = {:.3}",
        ours.total() as f64 / theirs.total() as f64
    );
    println!(
        "RESULT attachment_docs_per_s_ours_over_couchdb = {:.3}",
        ours.docs_per_s / theirs.docs_per_s
    );
    Ok(())
}

fn measured(name: &'static str, t0: Instant, n: usize, relay: &Relay) -> Row {
    let wall_s = t0.elapsed().as_secs_f64();
    let (to_server, to_client) = relay.bytes();
    Row {
        name,
        wall_s,
        docs_per_s: n as f64 / wall_s,
        to_server,
        to_client,
    }
}

fn print_table(n: usize, att_len: usize, rows: &[&Row]) {
    println!("{n} docs, one {att_len}-byte text/plain attachment each (stored gzip-encoded)");
    println!(
        "{:<26} {:>8} {:>9} {:>14} {:>14} {:>14} {:>10}",
        "replicator", "wall s", "docs/s", "bytes up", "bytes down", "bytes total", "bytes/doc"
    );
    for r in rows {
        println!(
            "{:<26} {:>8.2} {:>9.0} {:>14} {:>14} {:>14} {:>10.0}",
            r.name,
            r.wall_s,
            r.docs_per_s,
            r.to_server,
            r.to_client,
            r.total(),
            r.total() as f64 / n as f64
        );
    }
}
