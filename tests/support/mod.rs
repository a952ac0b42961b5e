//! The one helper tree of the integration tests, declared by each test binary (`mod support;`).
//!
//! Endpoints: a real pouchdb-server per test ([`server`]), a
//! headless Chromium over WebDriver ([`browser`]), a real CouchDB 3.4.3 where CouchDB's
//! own behaviour is the oracle ([`couchdb`]), small client helpers to fill and compare databases
//! ([`couch`]), and an in-process fault-injecting proxy for faults a real server cannot produce
//! on demand ([`proxy`]), an endpoint that turns hostile at a chosen stage ([`hostile`]), a socket-counting TCP relay ([`tcp_count`]), a byte-counting relay that
//! can be a slow, capped or dropping link ([`relay`], shared with the benches). Nodes: replicator nodes on one real store ([`replicator`]), the node harness for
//! paused time with CouchDB's default intervals that fails a test leaving a node running ([`nodes`]), a node with
//! its HTTP API ([`http`]), the built binary's `serve` ([`serve`]) and N of them on one etcd
//! ([`serve_cluster`]), the failover drill of three of them ([`failover_drill`]) with its
//! recording relay ([`run_log`]), steps clusters ([`steps`]),
//! store harnesses for every engine ([`store`]), real etcd clusters ([`etcd`]). Time: one [`deadline`] and one [`wait_for`].
//! Each test binary uses only part of this, hence the dead-code allowance.
#![allow(dead_code)]

pub mod browser;
pub mod couch;
pub mod couchdb;
pub mod etcd;
pub mod failover_drill;
pub mod generated;
pub mod hostile;
pub mod hostile_attachment;
pub mod http;
pub mod nodes;
pub mod proxy;
#[path = "../../benches/shared/relay.rs"]
pub mod relay;
pub mod replicator;
pub mod run_log;
pub mod serve;
pub mod serve_cluster;
pub mod server;
pub mod socks;
pub mod steps;
pub mod store;
pub mod tcp_count;
pub mod tls;
pub mod verify;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::store::Store as StoreEngine;
use couch_replicator::store::faulty::FaultyStore;

/// The test binary that runs the replicator suites touching the store once more with the
/// store's fault injection always on (`tests/replicator_under_store_faults.rs`).
const FAULTED_BINARY: &str = "replicator_under_store_faults";

/// `inner` as this test binary's stores see it: under injected faults at 1 % (seed from
/// `STORE_FAULTS_SEED`, default 1) in [`FAULTED_BINARY`], under `COUCH_STORE_FAULTS=RATE[:SEED]`
/// in any binary, else unchanged.
pub fn with_store_faults(inner: Arc<dyn StoreEngine>) -> Arc<dyn StoreEngine> {
    if env!("CARGO_CRATE_NAME") == FAULTED_BINARY {
        let seed = std::env::var("STORE_FAULTS_SEED").unwrap_or_else(|_| "1".into());
        return FaultyStore::from_spec(inner, &format!("0.01:{seed}"));
    }
    FaultyStore::from_env(inner)
}

/// An HTTP client builder for the test endpoints. pouchdb-server (Node) closes a keep-alive
/// connection idle for 5 s, and a request sent on one just as it closes fails ("error
/// sending request"), so connections idle for 4 s are not reused.
pub fn http_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder().pool_idle_timeout(Duration::from_secs(4))
}

/// Runs `f` with a deadline; on expiry panics naming what the test was waiting for.
pub async fn deadline<T>(secs: u64, what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("deadline of {secs} s passed while waiting for: {what}"),
    }
}

/// Polls `check` every 50 ms until it yields `Some`, panicking after `secs` with `what`.
pub async fn wait_for<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    deadline(secs, what, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// A `/proc/PID/status` field in KiB (`"VmRSS:"`, `"VmHWM:"`, the peak), 0 when unreadable:
/// how the bounded-memory tests measure a real `serve` process.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
