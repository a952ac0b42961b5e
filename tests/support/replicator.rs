//! Helpers of the replicator integration tests: pouchdb-server endpoints on free loopback
//! ports (one process, many databases), the store a test's nodes share, and the settings of
//! real-time tests (nodes are started by [`super::nodes::Nodes`]).

use std::sync::Arc;
use std::time::Duration;

use couch_replicator::jobs::JobsConfig;
use couch_replicator::replicator::ReplicatorSettings;
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::server::{free_port, listens_on};

/// A pouchdb-server process (killed on drop) in its own temp dir.
pub struct Pouch {
    pub port: u16,
    _child: Child,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Pouch {
    /// Starts one and waits until it answers on a port of its own (up to three tries on
    /// fresh ports, 60 s each: on a loaded machine node takes a while to load pouchdb-server).
    pub async fn start() -> Pouch {
        for _ in 0..3 {
            if let Some(p) = Self::try_start().await {
                return p;
            }
        }
        panic!("pouchdb-server did not start");
    }

    async fn try_start() -> Option<Pouch> {
        let bin = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("node_modules/.bin/pouchdb-server");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut child = Command::new(bin)
            .args([
                "--in-memory",
                "--port",
                &port.to_string(),
                "--host",
                "127.0.0.1",
            ])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start pouchdb-server");
        let http = super::http_client().build().expect("test http client");
        let url = format!("http://127.0.0.1:{port}/");
        for _ in 0..600 {
            // Exited: most likely another test's server took the port first.
            if !matches!(child.try_wait(), Ok(None)) {
                return None;
            }
            if http
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
                && child.id().is_some_and(|pid| listens_on(pid, port))
            {
                return Some(Pouch {
                    port,
                    _child: child,
                    _dir: dir,
                    http,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("pouchdb-server did not start on {port} in 60 s");
        None
    }

    pub fn url(&self, db: &str) -> String {
        format!("http://127.0.0.1:{}/{db}", self.port)
    }

    pub async fn create_db(&self, db: &str) {
        let r = self.http.put(self.url(db)).send().await.unwrap();
        assert!(
            r.status().is_success() || r.status() == 412,
            "{}",
            r.status()
        );
    }

    /// Writes `n` docs `{prefix}{i}` in one `_bulk_docs`.
    pub async fn put_docs(&self, db: &str, prefix: &str, n: usize) {
        let docs: Vec<Value> = (0..n)
            .map(|i| json!({"_id": format!("{prefix}{i:05}"), "value": i}))
            .collect();
        // A pouchdb-server under load sometimes resets a connection; the write is
        // idempotent (a repeated doc is a conflict), so try again a few times.
        let mut tries = 0;
        let r = loop {
            let sent = self
                .http
                .post(format!("{}/_bulk_docs", self.url(db)))
                .json(&json!({ "docs": docs }))
                .send()
                .await;
            match sent {
                Ok(r) => break r,
                Err(e) if tries < 3 && (e.is_connect() || e.is_request()) => tries += 1,
                Err(e) => panic!("writing docs to {db}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(r.status().is_success(), "{}", r.status());
    }

    pub async fn doc_count(&self, db: &str) -> u64 {
        // Node closes idle keep-alive connections after 5 s; a request racing that close
        // fails with IncompleteMessage, so retry a few times.
        for _ in 0..5 {
            let Ok(r) = self.http.get(self.url(db)).send().await else {
                continue;
            };
            let Ok(text) = r.text().await else {
                continue;
            };
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            return v.get("doc_count").and_then(Value::as_u64).unwrap_or(0);
        }
        panic!("cannot read {db}");
    }

    /// Waits until `db` holds `n` docs.
    pub async fn wait_count(&self, db: &str, n: u64, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let c = self.doc_count(db).await;
            if c >= n {
                assert_eq!(c, n, "more docs than expected in {db}");
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{db} has {c} of {n} docs"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A store shared by the nodes of a test.
pub struct Store {
    pub dir: tempfile::TempDir,
    pub db: Db,
    /// The etcd members under `COUCH_TEST_STORE=etcd` (killed when the store drops).
    pub etcd: Option<super::etcd::EtcdCluster>,
}

impl Store {
    /// The embedded engine in a temp dir, or with `COUCH_TEST_STORE=etcd` a 3-member etcd
    /// cluster of the test's own (multi-threaded tests only: it is started in place); wrapped in
    /// the fault-injecting store where [`super::with_store_faults`] says so, so whole suites run
    /// under FDB's failure modes.
    pub fn open() -> Store {
        let dir = tempfile::tempdir().unwrap();
        if std::env::var("COUCH_TEST_STORE").as_deref() == Ok("etcd") {
            let (cluster, store) = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    let cluster = super::etcd::EtcdCluster::start(3)
                        .await
                        .expect("COUCH_TEST_STORE=etcd needs the etcd binary");
                    let config =
                        couch_replicator::store::etcd::EtcdConfig::new(cluster.endpoints());
                    let store = couch_replicator::store::etcd::EtcdStore::connect(&config)
                        .await
                        .expect("connect to etcd");
                    (cluster, store)
                })
            });
            return Store {
                db: Db::new(super::with_store_faults(Arc::new(store))),
                dir,
                etcd: Some(cluster),
            };
        }
        let store = EmbeddedStore::open(dir.path().join("replicator.redb")).unwrap();
        Store {
            db: Db::new(super::with_store_faults(Arc::new(store))),
            dir,
            etcd: None,
        }
    }
}

/// Settings for tests: short intervals, little jitter, a 3 s activity timeout.
pub fn test_settings() -> ReplicatorSettings {
    ReplicatorSettings {
        interval: Duration::from_secs(1),
        startup_jitter: Duration::from_millis(100),
        min_run_time: Duration::from_secs(1),
        stats_update_interval: Duration::from_secs(1),
        job_timeout: Duration::from_secs(3),
        cluster_quiet_period: Duration::from_secs(1),
        cluster_start_period: Duration::from_secs(1),
        ..ReplicatorSettings::default()
    }
}

pub fn jobs_config() -> JobsConfig {
    JobsConfig {
        type_check_period: Duration::from_millis(300),
        type_check_max_jitter: Duration::from_millis(100),
        activity_monitor_max_jitter: Duration::from_millis(200),
        ..JobsConfig::default()
    }
}

/// A test endpoint from its URL (the URLs here are the test servers': always valid).
pub fn ep(url: &str) -> couch_replicator::Endpoint {
    couch_replicator::Endpoint::parse(url).unwrap()
}
