//! Engines under test for the store suites: each gives a fresh, private key space and, where
//! the engine is durable, a way to close and reopen it.

use std::future::Future;
use std::sync::Arc;

use couch_replicator::store::embedded::EmbeddedStore;
use couch_replicator::store::memory::MemoryStore;
use couch_replicator::store::{Db, Store, split_versionstamp_operand, tuple};

/// One engine instance with a private key space.
pub trait Harness: Send + 'static {
    /// The engine itself (what a wrapper wraps).
    fn store(&self) -> Arc<dyn Store>;
    fn db(&self) -> Db {
        Db::new(self.store())
    }
    /// Prefix of this test's keys (empty for private engines).
    fn prefix(&self) -> &[u8];
    /// Closes and reopens a durable engine.
    fn reopen(&mut self) -> impl Future<Output = ()> + Send;
    /// Releases the key space (FoundationDB) or the store.
    fn finish(self) -> impl Future<Output = ()> + Send;

    fn key(&self, k: &str) -> Vec<u8> {
        let mut out = self.prefix().to_vec();
        out.extend_from_slice(k.as_bytes());
        out
    }

    /// The end of this test's key space.
    fn end(&self) -> Vec<u8> {
        let mut out = self.prefix().to_vec();
        out.push(0xFF);
        out
    }

    /// A versionstamped-key operand: prefix ‖ tuple(name, incomplete stamp) ‖ offset.
    fn vs_key(&self, name: &str) -> Vec<u8> {
        let packed = tuple::pack_with_versionstamp(&(name, tuple::Versionstamp::incomplete(0)));
        let (bytes, offset) = split_versionstamp_operand(&packed).expect("valid operand");
        let mut out = self.prefix().to_vec();
        out.extend_from_slice(bytes);
        out.extend_from_slice(&((offset + self.prefix().len()) as u32).to_le_bytes());
        out
    }
}

pub struct Embedded {
    pub dir: tempfile::TempDir,
    pub store: EmbeddedStore,
}

impl Embedded {
    pub fn path(dir: &tempfile::TempDir) -> std::path::PathBuf {
        dir.path().join("store.redb")
    }

    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(Self::path(&dir)).expect("open store");
        Self { dir, store }
    }
}

impl Harness for Embedded {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    fn prefix(&self) -> &[u8] {
        b""
    }

    async fn reopen(&mut self) {
        self.store.close().await.expect("close");
        self.store = EmbeddedStore::open(Self::path(&self.dir)).expect("reopen store");
    }

    async fn finish(self) {
        self.store.close().await.expect("close");
    }
}

pub struct Memory {
    pub store: MemoryStore,
}

impl Memory {
    pub async fn new() -> Self {
        Self {
            store: MemoryStore::new(),
        }
    }
}

impl Harness for Memory {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    fn prefix(&self) -> &[u8] {
        b""
    }

    async fn reopen(&mut self) {
        panic!("the memory engine is not durable");
    }

    async fn finish(self) {}
}

/// The embedded engine seen through the fault-injecting wrapper with no faults: the wrapper
/// itself must keep every promise of the contract.
pub struct Faulty {
    pub inner: Embedded,
}

impl Faulty {
    pub async fn new() -> Self {
        Self {
            inner: Embedded::new().await,
        }
    }
}

impl Harness for Faulty {
    fn store(&self) -> Arc<dyn Store> {
        let rates = couch_replicator::store::faulty::FaultRates::none();
        Arc::new(couch_replicator::store::faulty::FaultyStore::new(
            self.inner.store(),
            rates,
            1,
        ))
    }

    fn prefix(&self) -> &[u8] {
        b""
    }

    async fn reopen(&mut self) {
        self.inner.reopen().await;
    }

    async fn finish(self) {
        self.inner.finish().await;
    }
}

/// A real etcd cluster of its own (1 member unless asked), so the key space is private.
pub struct Etcd {
    pub cluster: crate::support::etcd::EtcdCluster,
    pub store: couch_replicator::store::etcd::EtcdStore,
    /// Reads served by the engine's local replica (the default) or all sent to etcd.
    local_reads: bool,
}

impl Etcd {
    /// `None` (after saying so) when etcd is not installed.
    pub async fn new() -> Option<Self> {
        Self::with_members(1).await
    }

    pub async fn with_members(n: usize) -> Option<Self> {
        let cluster = crate::support::etcd::EtcdCluster::start(n).await?;
        let store = Self::connect(&cluster).await;
        Some(Self {
            cluster,
            store,
            local_reads: true,
        })
    }

    /// One member, with every read sent to etcd (`EtcdConfig::local_reads` off).
    pub async fn remote_reads() -> Option<Self> {
        let cluster = crate::support::etcd::EtcdCluster::start(1).await?;
        let store = Self::connect_with(&cluster, false).await;
        Some(Self {
            cluster,
            store,
            local_reads: false,
        })
    }

    /// A second store handle on member 0 reached through a TCP relay over `link` (to cut,
    /// block or delay that process's connection alone).
    pub async fn behind_relay(
        &self,
        link: crate::support::relay::Link,
    ) -> (
        crate::support::relay::Relay,
        couch_replicator::store::etcd::EtcdStore,
    ) {
        let endpoint = self.cluster.endpoint(0);
        let port = endpoint.rsplit(':').next().and_then(|p| p.parse().ok());
        let port: u16 = port.expect("member 0's port");
        let relay = crate::support::relay::Relay::with_link(port, link)
            .await
            .expect("relay");
        let url = relay.url("").trim_end_matches('/').to_string();
        let config = couch_replicator::store::etcd::EtcdConfig::new(vec![url]);
        let store = couch_replicator::store::etcd::EtcdStore::connect(&config)
            .await
            .expect("connect through the relay");
        (relay, store)
    }

    pub async fn connect(
        cluster: &crate::support::etcd::EtcdCluster,
    ) -> couch_replicator::store::etcd::EtcdStore {
        Self::connect_with(cluster, true).await
    }

    async fn connect_with(
        cluster: &crate::support::etcd::EtcdCluster,
        local_reads: bool,
    ) -> couch_replicator::store::etcd::EtcdStore {
        let config = couch_replicator::store::etcd::EtcdConfig {
            local_reads,
            ..couch_replicator::store::etcd::EtcdConfig::new(cluster.endpoints())
        };
        couch_replicator::store::etcd::EtcdStore::connect(&config)
            .await
            .expect("connect to etcd")
    }
}

impl Harness for Etcd {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    fn prefix(&self) -> &[u8] {
        b""
    }

    async fn reopen(&mut self) {
        // etcd is durable by itself: a new client on the same cluster.
        self.store = Self::connect_with(&self.cluster, self.local_reads).await;
    }

    async fn finish(self) {}
}

// Only the conformance suite uses it; the other store tests share this module.
#[cfg(feature = "fdb")]
#[allow(unused_imports)]
pub use fdb_harness::Fdb;

#[cfg(feature = "fdb")]
mod fdb_harness {
    use super::*;
    use couch_replicator::store::StoreError;
    use couch_replicator::store::fdb::{FdbStore, boot_network};

    /// FoundationDB at `FDB_CLUSTER_FILE`, each test in its own random subspace.
    pub struct Fdb {
        store: FdbStore,
        prefix: Vec<u8>,
    }

    impl Fdb {
        /// `None` (after saying so) when no cluster is configured.
        pub async fn new() -> Option<Self> {
            let Ok(cluster_file) = std::env::var("FDB_CLUSTER_FILE") else {
                println!("skipping FoundationDB conformance: FDB_CLUSTER_FILE not set");
                return None;
            };
            boot_network().expect("boot the FoundationDB network");
            let store = FdbStore::open(Some(&cluster_file)).expect("open FoundationDB");
            let prefix = format!("couch-replicator-conformance/{}/", uuid::Uuid::new_v4());
            Some(Self {
                store,
                prefix: prefix.into_bytes(),
            })
        }
    }

    impl Harness for Fdb {
        fn store(&self) -> Arc<dyn Store> {
            Arc::new(self.store.clone())
        }

        fn db(&self) -> Db {
            // Transaction ids inside the test's subspace, so `finish` clears them too.
            Db::new(self.store()).with_txid_prefix(&self.prefix)
        }

        fn prefix(&self) -> &[u8] {
            &self.prefix
        }

        async fn reopen(&mut self) {
            // FoundationDB is durable by itself: a new handle on the same cluster.
            let cluster_file = std::env::var("FDB_CLUSTER_FILE").ok();
            self.store = FdbStore::open(cluster_file.as_deref()).expect("reopen FoundationDB");
        }

        async fn finish(self) {
            let (begin, end) = (self.prefix.clone(), self.end());
            let _ = self
                .db()
                .run(|tx| {
                    let (begin, end) = (begin.clone(), end.clone());
                    async move {
                        tx.clear_range(&begin, &end);
                        Ok::<_, StoreError>(())
                    }
                })
                .await;
        }
    }
}
