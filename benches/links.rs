//! Links benchmark (issue 29): one real CouchDB 3.4.3 holds a source of 20,000 documents of
//! ~300 bytes (`BENCH_DOCS`); each replication runs into a fresh target on the same CouchDB
//! with source and target behind one relay that is a link of round trip 0, 50 and 200 ms
//! (`BENCH_RTTS_MS`, comma-separated), and once more at 200 ms capped at 100 Mbit/s: ours
//! (in-process, defaults) and CouchDB's own replicator (`POST /_replicate` on the same
//! CouchDB, pointed through the relay), in one run. Every target is checked to hold all the
//! documents. Then the continuous change latency: our continuous replication through the
//! 200 ms link while a writer beside the source writes `BENCH_LIVE` documents (600 by default)
//! at `BENCH_LIVE_HZ` per second (50); the time each takes to show in the target's feed, for
//! the documents after the first `BENCH_LIVE_WARM_UP` (100: the first two seconds of load,
//! while the window grows to the load, are not the steady state). Prints a
//! table and `RESULT wan200_docs_per_s_ours_over_local`, `wan200_docs_per_s_ours_over_couchdb`
//! and `wan200_change_latency_p99_rtts`.

#[allow(dead_code)] // the fill and stubs of the attachments bench
#[path = "attachments/couch.rs"]
mod couch;
#[path = "shared/entry.rs"]
mod entry;
#[path = "links/live.rs"]
mod live;
#[path = "shared/relay.rs"]
mod relay;

use std::time::{Duration, Instant};

use couch_replicator::replication::{Context, ReplicationSpec, start};
use serde_json::{Value, json};

use couch::Couch;
use relay::{Link, Relay};

/// One measured one-shot replication.
struct Row {
    who: &'static str,
    link: String,
    rtt_ms: u64,
    capped: bool,
    wall_s: f64,
    docs_per_s: f64,
    bytes: u64,
}

fn main() {
    entry::run_main("links", run());
}

fn rtts() -> Vec<u64> {
    std::env::var("BENCH_RTTS_MS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 50, 200])
}

/// Which replicators run (`BENCH_REPLICATORS=ours` while iterating on ours: the ratios
/// against CouchDB then print as NaN).
fn replicators() -> Vec<&'static str> {
    let wanted = std::env::var("BENCH_REPLICATORS").unwrap_or_default();
    ["ours", "CouchDB 3.4.3"]
        .into_iter()
        .filter(|who| wanted.is_empty() || wanted.contains(&who[..4].to_lowercase()))
        .collect()
}

async fn run() -> Result<(), String> {
    let n = entry::env_num("BENCH_DOCS", 20_000);
    let http = reqwest::Client::builder()
        .no_proxy()
        .gzip(false)
        .build()
        .map_err(|e| e.to_string())?;
    let couch = Couch::start()?;
    eprintln!("filling the source with {n} documents of ~300 bytes...");
    fill(&http, &couch, "source", n).await?;
    let mut rows = Vec::new();
    let mut cases: Vec<(u64, bool)> = rtts().into_iter().map(|r| (r, false)).collect();
    cases.push((200, true));
    for (i, (rtt, capped)) in cases.into_iter().enumerate() {
        let mut link = Link::rtt(Duration::from_millis(rtt));
        if capped {
            link = link.capped(100);
        }
        let name = format!("{rtt} ms{}", if capped { ", 100 Mbit/s" } else { "" });
        for who in replicators() {
            let target = format!("t{i}_{}", if who == "ours" { "ours" } else { "couch" });
            let relay = Relay::with_link(couch.port, link.clone()).await?;
            let url = |db: &str| format!("http://admin:admin@127.0.0.1:{}/{db}", relay.port);
            let t0 = Instant::now();
            if who == "ours" {
                ours_once(&url("source"), &url(&target)).await?;
            } else {
                couch::couch_replicate(&http, &couch, &url("source"), &url(&target)).await?;
            }
            let wall_s = t0.elapsed().as_secs_f64();
            let got = doc_count(&http, &couch, &target).await?;
            if got != n as u64 {
                return Err(format!("{who} at {name}: target holds {got} of {n} docs"));
            }
            let (up, down) = relay.bytes();
            eprintln!("{who} at {name}: {wall_s:.2} s");
            rows.push(Row {
                who,
                link: name.clone(),
                rtt_ms: rtt,
                capped,
                wall_s,
                docs_per_s: n as f64 / wall_s,
                bytes: up + down,
            });
        }
    }
    let (with_warm_up, live) = live_latency(&http, &couch).await?;
    print_table(n, &rows);
    let rate = |who: &str, rtt: u64| {
        rows.iter()
            .find(|r| r.who == who && r.rtt_ms == rtt && !r.capped)
            .map_or(f64::NAN, |r| r.docs_per_s)
    };
    println!(
        "continuous at 200 ms, steady state: {} changes, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        live.0.len(),
        live.quantile(0.5) * 1e3,
        live.quantile(0.99) * 1e3,
        live.quantile(1.0) * 1e3
    );
    println!(
        "continuous at 200 ms, all {} changes (with the warm-up): p50 {:.0} ms, p99 {:.0} ms",
        with_warm_up.0.len(),
        with_warm_up.quantile(0.5) * 1e3,
        with_warm_up.quantile(0.99) * 1e3
    );
    println!(
        "RESULT wan200_docs_per_s_ours_over_local = {:.3}",
        rate("ours", 200) / rate("ours", 0)
    );
    println!(
        "RESULT wan200_docs_per_s_ours_over_couchdb = {:.3}",
        rate("ours", 200) / rate("CouchDB 3.4.3", 200)
    );
    println!(
        "RESULT wan200_change_latency_p99_rtts = {:.2}",
        live.quantile(0.99) / 0.2
    );
    Ok(())
}

fn print_table(n: usize, rows: &[Row]) {
    println!(
        "{n} docs of ~300 bytes, one CouchDB 3.4.3, source and target through one relay, {} cores",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!(
        "{:<20} {:<15} {:>8} {:>9} {:>12} {:>10}",
        "link", "replicator", "wall s", "docs/s", "bytes", "kept"
    );
    for r in rows {
        let local = rows
            .iter()
            .find(|l| l.who == r.who && l.rtt_ms == 0 && !l.capped)
            .map_or(f64::NAN, |l| l.docs_per_s);
        println!(
            "{:<20} {:<15} {:>8.2} {:>9.0} {:>12} {:>9.0}%",
            r.link,
            r.who,
            r.wall_s,
            r.docs_per_s,
            r.bytes,
            100.0 * r.docs_per_s / local
        );
    }
}

async fn ours_once(source: &str, target: &str) -> Result<(), String> {
    let spec = ReplicationSpec::from_json(
        &json!({"source": source, "target": target, "create_target": true}),
    )
    .map_err(|e| format!("spec: {e}"))?;
    let job = start(spec, Context::default());
    let in_flight = job.in_flight();
    let stats = job
        .wait()
        .await
        .map_err(|e| format!("our replication: {e}"))?;
    if stats.doc_write_failures != 0 {
        return Err(format!("{} write failures", stats.doc_write_failures));
    }
    let w = *in_flight.lock().map_err(|_| "in-flight probe poisoned")?;
    eprintln!(
        "ours: window now {}, peak {} ({} grows, {} shrinks), peak {} batches and {} bytes in flight",
        w.limit, w.peak_limit, w.grows, w.shrinks, w.peak_in_flight, w.peak_bytes
    );
    Ok(())
}

/// Our continuous replication through a 200 ms link under a steady write load.
async fn live_latency(
    http: &reqwest::Client,
    couch: &Couch,
) -> Result<(live::Latencies, live::Latencies), String> {
    let count = entry::env_num("BENCH_LIVE", 600);
    let warm_up = entry::env_num("BENCH_LIVE_WARM_UP", 100).min(count.saturating_sub(1));
    let hz = entry::env_num("BENCH_LIVE_HZ", 50).max(1);
    fill(http, couch, "live_src", 0).await?;
    fill(http, couch, "live_tgt", 0).await?;
    let relay = Relay::with_link(couch.port, Link::rtt(Duration::from_millis(200))).await?;
    let url = |db: &str| format!("http://admin:admin@127.0.0.1:{}/{db}", relay.port);
    let spec = ReplicationSpec::from_json(
        &json!({"source": url("live_src"), "target": url("live_tgt"), "continuous": true}),
    )
    .map_err(|e| format!("spec: {e}"))?;
    let job = start(spec, Context::default());
    // Let it start up and reach the end of the (empty) feed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let period = Duration::from_secs_f64(1.0 / hz as f64);
    let out = live::measure(http, couch, "live_src", "live_tgt", count, warm_up, period).await;
    job.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), job.wait()).await;
    out
}

async fn doc_count(http: &reqwest::Client, couch: &Couch, db: &str) -> Result<u64, String> {
    let r = http
        .get(couch.url(db))
        .send()
        .await
        .map_err(|e| format!("GET {db}: {e}"))?;
    let v: Value = r.json().await.map_err(|e| format!("GET {db}: {e}"))?;
    Ok(v["doc_count"].as_u64().unwrap_or(0))
}

/// Creates `db` with `n` documents of ~300 bytes.
async fn fill(http: &reqwest::Client, couch: &Couch, db: &str, n: usize) -> Result<(), String> {
    couch::fill_with(http, couch, db, n, 1000, |i| {
        json!({
            "_id": format!("doc{i:06}"),
            "kind": "item",
            "n": i,
            "owner": format!("user{}", i % 97),
            "text": format!("{i:06} {}", "lorem ipsum dolor sit amet ".repeat(8)),
        })
    })
    .await
}
