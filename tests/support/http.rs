//! Helpers of the HTTP API tests: a replicator node on a real on-disk embedded store with its
//! API on a free loopback port, a Basic-auth client, and JSON helpers around the shared
//! pouchdb-server launcher ([`super::server`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::http::{self, AppState, HttpConfig, auth::Users};
use couch_replicator::jobs::JobsConfig;
use couch_replicator::replicator::{NodeType, Replicator, ReplicatorConfig, ReplicatorSettings};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use serde_json::Value;

pub const ADMIN: (&str, &str) = ("adm", "adm-secret");
pub const BOB: (&str, &str) = ("bob", "bob-secret");
pub const EVE: (&str, &str) = ("eve", "eve-secret");

/// Short intervals and little jitter so jobs start within a second.
pub fn fast_settings() -> ReplicatorSettings {
    ReplicatorSettings {
        interval: Duration::from_secs(1),
        startup_jitter: Duration::from_millis(100),
        min_run_time: Duration::from_secs(1),
        stats_update_interval: Duration::from_secs(1),
        job_timeout: Duration::from_secs(3),
        ..ReplicatorSettings::default()
    }
}

/// couch_jobs discovers types and dead workers quickly.
pub fn fast_jobs() -> JobsConfig {
    JobsConfig {
        type_check_period: Duration::from_millis(300),
        type_check_max_jitter: Duration::from_millis(100),
        activity_monitor_max_jitter: Duration::from_millis(200),
        ..JobsConfig::default()
    }
}

/// One node and its API.
pub struct Node {
    pub _dir: tempfile::TempDir,
    pub replicator: Arc<Replicator>,
    pub base: String,
    pub client: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Node {
    /// A node that runs jobs (both node types).
    pub async fn start(cfg: HttpConfig) -> Node {
        Self::with_settings(cfg, fast_settings()).await
    }

    /// An `api_frontend`-only node: jobs are created but never run, so states stay put.
    pub async fn frontend(cfg: HttpConfig) -> Node {
        let settings = ReplicatorSettings {
            node_types: vec![NodeType::ApiFrontend],
            ..fast_settings()
        };
        Self::with_settings(cfg, settings).await
    }

    /// A frontend-only node that also serves `/_steps`.
    pub async fn with_steps(cfg: HttpConfig) -> Node {
        let settings = ReplicatorSettings {
            node_types: vec![NodeType::ApiFrontend],
            ..fast_settings()
        };
        Self::build(cfg, settings, true).await
    }

    pub async fn with_settings(cfg: HttpConfig, settings: ReplicatorSettings) -> Node {
        Self::build(cfg, settings, false).await
    }

    /// A node that runs jobs with the given server uuid (so its replication ids are those a
    /// CouchDB with that uuid computes).
    pub async fn with_uuid(cfg: HttpConfig, uuid: &str) -> Node {
        Self::build_on(cfg, fast_settings(), false, Some(uuid)).await
    }

    /// [`Self::with_uuid`] with other settings (e.g. CouchDB's default intervals).
    pub async fn with_uuid_and_settings(
        cfg: HttpConfig,
        uuid: &str,
        settings: ReplicatorSettings,
    ) -> Node {
        Self::build_on(cfg, settings, false, Some(uuid)).await
    }

    async fn build(cfg: HttpConfig, settings: ReplicatorSettings, with_steps: bool) -> Node {
        Self::build_on(cfg, settings, with_steps, None).await
    }

    /// A frontend-only node whose users are `cfg`'s own (not the fixed ones).
    pub async fn frontend_with_own_users(cfg: HttpConfig) -> Node {
        let settings = ReplicatorSettings {
            node_types: vec![NodeType::ApiFrontend],
            ..fast_settings()
        };
        Self::start_node(cfg, settings, false, None, true).await
    }

    async fn build_on(
        cfg: HttpConfig,
        settings: ReplicatorSettings,
        with_steps: bool,
        uuid: Option<&str>,
    ) -> Node {
        Self::start_node(cfg, settings, with_steps, uuid, false).await
    }

    async fn start_node(
        mut cfg: HttpConfig,
        settings: ReplicatorSettings,
        with_steps: bool,
        uuid: Option<&str>,
        own_users: bool,
    ) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("jobs.redb")).unwrap();
        let mut config = ReplicatorConfig::new(Db::new(Arc::new(store)));
        config.settings = settings;
        config.jobs.config = fast_jobs();
        if let Some(uuid) = uuid {
            config.server_uuid = uuid.to_owned();
        }
        // Actor names are process-wide: every node of a test binary needs its own.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        config.node = format!("http{n}@127.0.0.1").into();
        let rep = Replicator::start(config).await.unwrap();
        let replicator = Arc::new(rep);
        // The fixed users, plus the authentication CouchDB the caller configured, if any.
        let couchdb = cfg.users.couchdb().cloned();
        if !own_users {
            cfg.users = Users::new(
                [(ADMIN.0.to_string(), ADMIN.1.to_string())],
                [
                    (BOB.0.to_string(), BOB.1.to_string()),
                    (EVE.0.to_string(), EVE.1.to_string()),
                ],
            );
            if let Some(c) = couchdb {
                cfg.users = cfg.users.with_couchdb(c);
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let state = AppState::new(replicator.clone(), cfg);
        let steps = with_steps.then(|| {
            couch_replicator::steps::Steps::new(
                replicator.jobs().clone(),
                // Steps node names allow no `@`.
                &replicator.node().as_str().replace('@', "-"),
                Default::default(),
            )
            .unwrap()
        });
        let router = http::router_with_steps(state, steps);
        let server = tokio::spawn(async move {
            let _ = http::serve_router(listener, router, std::future::pending()).await;
        });
        Node {
            _dir: dir,
            replicator,
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            server,
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        who: Option<(&str, &str)>,
        body: Option<&str>,
    ) -> (u16, Value) {
        let mut r = self.client.request(method, format!("{}{path}", self.base));
        if let Some((u, p)) = who {
            r = r.basic_auth(u, Some(p));
        }
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_owned());
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v)
    }

    pub async fn get(&self, path: &str, who: Option<(&str, &str)>) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, who, None).await
    }

    pub async fn post(&self, path: &str, who: Option<(&str, &str)>, body: &str) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, who, Some(body))
            .await
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A pouchdb-server (the shared launcher of `tests/support`) with JSON helpers.
pub struct Pouch {
    _server: super::server::PouchServer,
    pub url: String,
}

impl Pouch {
    pub async fn start() -> Pouch {
        let server = super::server::PouchServer::start().await;
        let url = server.root().trim_end_matches('/').to_owned();
        Pouch {
            _server: server,
            url,
        }
    }

    pub fn db(&self, name: &str) -> String {
        format!("{}/{}", self.url, name)
    }

    pub async fn put(&self, path: &str, body: Value) -> Value {
        let r = reqwest::Client::new()
            .put(format!("{}/{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        r.json().await.unwrap()
    }

    pub async fn delete(&self, path: &str) -> Value {
        let r = reqwest::Client::new()
            .delete(format!("{}/{path}", self.url))
            .send()
            .await
            .unwrap();
        r.json().await.unwrap()
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = reqwest::Client::new()
            .get(format!("{}/{path}", self.url))
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }
}
