//! The test node harness: replicator nodes of one cluster on one store, started with
//! CouchDB's default intervals (`ReplicatorSettings::default()`, `JobsConfig::default()`) for
//! tests that run on paused tokio time, and a check that every node it started was shut down.
//!
//! Paused time (`#[tokio::test(start_paused = true)]`) jumps the clock to the next timer
//! whenever every task waits, so a 61 s activity timeout or a 60 s cluster quiet period costs
//! no wall time. Only waits tokio can see may be in flight then: the in-memory engine commits
//! inside the calling task, whereas the embedded engine hands commits to its own committer
//! thread (and a real HTTP peer answers from another process), during which the clock would
//! jump past the commit. So [`Nodes::paused`] runs on the in-memory engine, which the store
//! conformance tests hold to the same behaviour as the others, and the network-free tree tests
//! use it; tests with an HTTP peer use [`Nodes::on_disk`] on real time.
//!
//! Dropping the harness with a node still running fails the test (unless it is already
//! failing): a test must end every node it starts with `shutdown` or `kill`, so no actor of
//! one test outlives it and runs into the next one under plain `cargo test`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_replicator::jobs::{JobsConfig, JobsOptions, SharedClock, TokioClock};
use couch_replicator::replicator::{
    Frontend, JobId, JobView, Replicator, ReplicatorConfig, ReplicatorSettings,
};
use couch_replicator::store::Db;
use couch_replicator::store::memory::MemoryStore;
use ractor::ActorStatus;
use supervisors::SupervisorRef;

use super::replicator::{Store, jobs_config};

/// The nodes of one test and the store they share.
pub struct Nodes {
    db: Db,
    /// One clock for the whole cluster: a `TokioClock` per node would start each at the wall
    /// time of its creation, so on paused time a node started 2 virtual minutes later would
    /// run 2 minutes behind and look dead to its neighbours.
    clock: SharedClock,
    jobs: JobsConfig,
    /// The on-disk store (temp dir, etcd members) kept alive as long as the nodes.
    _store: Option<Store>,
    started: Mutex<Vec<(String, SupervisorRef)>>,
}

impl Nodes {
    /// Nodes on the in-memory engine with couch_jobs' default settings: for paused time.
    pub fn paused() -> Nodes {
        Nodes {
            // Under injected store faults where this binary runs them, as `Store::open` does.
            db: Db::new(super::with_store_faults(Arc::new(MemoryStore::new()))),
            clock: Arc::new(TokioClock::new()),
            jobs: JobsConfig::default(),
            _store: None,
            started: Mutex::new(Vec::new()),
        }
    }

    /// Nodes on the test store ([`Store::open`]: embedded, or etcd / faults from the
    /// environment) with the short couch_jobs checks of [`jobs_config`]: for real time.
    pub fn on_disk() -> Nodes {
        let store = Store::open();
        Nodes {
            db: store.db.clone(),
            clock: Arc::new(TokioClock::new()),
            jobs: jobs_config(),
            _store: Some(store),
            started: Mutex::new(Vec::new()),
        }
    }

    /// The clock the nodes share (tokio's, so paused time moves it).
    pub fn clock(&self) -> SharedClock {
        self.clock.clone()
    }

    /// The store the nodes share.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Starts node `name` of the cluster with `settings`, on the cluster's clock.
    pub async fn start(&self, name: &str, settings: ReplicatorSettings) -> Replicator {
        self.start_with(name, settings, Frontend::default()).await
    }

    /// [`Nodes::start`] with the `api_frontend` children `frontend` (HTTP API, doc processor).
    pub async fn start_with(
        &self,
        name: &str,
        settings: ReplicatorSettings,
        frontend: Frontend,
    ) -> Replicator {
        self.launch(&self.db, name, settings, frontend).await
    }

    /// [`Nodes::start`] on a store handle of the node's own (`db`), e.g. one that reaches
    /// the cluster's store through a relay that a test cuts.
    pub async fn start_on(&self, db: &Db, name: &str, settings: ReplicatorSettings) -> Replicator {
        self.launch(db, name, settings, Frontend::default()).await
    }

    async fn launch(
        &self,
        db: &Db,
        name: &str,
        settings: ReplicatorSettings,
        frontend: Frontend,
    ) -> Replicator {
        let config = ReplicatorConfig {
            db: db.clone(),
            jobs: JobsOptions {
                config: self.jobs.clone(),
                clock: self.clock.clone(),
                ..JobsOptions::default()
            },
            settings,
            node: name.into(),
            server_uuid: "test-cluster".into(),
        };
        let node = Replicator::start_with(config, frontend).await.unwrap();
        self.started
            .lock()
            .unwrap()
            .push((name.to_owned(), node.tree().clone()));
        node
    }

    /// Nodes started here whose tree still runs.
    pub fn running(&self) -> Vec<String> {
        self.started
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, tree)| tree.actor().get_status() != ActorStatus::Stopped)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let running = self.running();
        assert!(
            running.is_empty(),
            "nodes {running:?} were not shut down (end each with shutdown() or kill())"
        );
    }
}

/// Waits until job `id`'s view satisfies `ok` and returns it, panicking after `secs` with
/// `what`. Driven by `node`'s event bus: every start, crash, failure, stop and finish of a job
/// publishes an event, after which the view is read again; a stats write publishes none, so
/// the view is also read once a second without events.
pub async fn until_job(
    node: &Replicator,
    id: &JobId,
    secs: u64,
    what: &str,
    ok: impl Fn(&JobView) -> bool,
) -> JobView {
    let mut events = node.subscribe();
    super::deadline(secs, &format!("job {id} {what}"), async {
        loop {
            if let Ok(v) = node.get(id).await
                && ok(&v)
            {
                return v;
            }
            match events.as_mut() {
                Some(rx) => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await;
                }
                None => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    events = node.subscribe();
                }
            }
        }
    })
    .await
}
