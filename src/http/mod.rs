//! The HTTP API (axum), CouchDB-compatible: this module owns the [`Router`] and its shared
//! [`AppState`]; each endpoint group has its own file. Every reply is JSON (except the
//! status page's HTML and the Prometheus text); errors are `{"error", "reason"}`
//! ([`error::HttpError`]); callers are identified by HTTP Basic or an `AuthSession` cookie
//! ([`auth`]; a CouchDB's `_users` through [`couchdb_auth`]); bodies larger than
//! [`HttpConfig::max_body_bytes`] get 413; every JSON reply passes through `mask` so no
//! password leaves the node; every reply carries CouchDB's headers and a request id that the
//! request's log lines carry too (`couch_headers`).

pub(crate) mod active_tasks;
pub(crate) mod all_dbs;
pub mod auth;
pub mod connection_limit;
pub(crate) mod cookie;
pub(crate) mod couch_headers;
pub(crate) mod couch_json;
pub mod couchdb_auth;
pub mod error;
pub(crate) mod health;
pub mod lockout;
pub(crate) mod mask;
pub(crate) mod node_stats;
pub mod password;
pub(crate) mod pause;
pub mod peer;
pub(crate) mod rejection;
pub(crate) mod replicate;
pub(crate) mod scheduler;
pub(crate) mod session;
pub(crate) mod status_page;
pub mod steps;
#[cfg(feature = "tls")]
pub mod tls;
pub mod user_limits;
pub(crate) mod verify;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::replicator::Replicator;
use auth::{HasUsers, Users};
use error::HttpError;

/// Settings of the HTTP API.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Who may call.
    pub users: Users,
    /// Larger request bodies are refused with 413.
    pub max_body_bytes: usize,
    /// How long `POST /_replicate` waits for a one-shot job to complete.
    pub completion_timeout: Duration,
    /// The `_replicator` databases the doc processor follows (names as `_scheduler/docs`
    /// shows them).
    pub replicator_dbs: Vec<String>,
    /// What callers who are not admins may ask for.
    pub user_limits: user_limits::UserLimits,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            users: Users::default(),
            max_body_bytes: 1 << 20,
            completion_timeout: Duration::from_secs(3600),
            replicator_dbs: Vec::new(),
            user_limits: user_limits::UserLimits::default(),
        }
    }
}

/// What every handler shares: the replicator handle and the API settings (users among them).
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    replicator: Arc<Replicator>,
    config: HttpConfig,
    status_jobs: status_page::job_cache::JobCache,
    /// Held from counting a user's jobs to adding theirs: two calls of one user at once
    /// cannot both pass the count.
    user_jobs: tokio::sync::Mutex<()>,
}

impl AppState {
    /// State for a node's API.
    pub fn new(replicator: Arc<Replicator>, config: HttpConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                replicator,
                config,
                status_jobs: Default::default(),
                user_jobs: Default::default(),
            }),
        }
    }

    /// The replicator handle.
    pub fn replicator(&self) -> &Replicator {
        &self.inner.replicator
    }

    /// The API settings.
    pub fn config(&self) -> &HttpConfig {
        &self.inner.config
    }

    /// Held while a user's job count is checked and their job added.
    pub(crate) fn user_jobs(&self) -> &tokio::sync::Mutex<()> {
        &self.inner.user_jobs
    }

    /// The job listing the status page's viewers share.
    pub(crate) fn status_jobs(&self) -> &status_page::job_cache::JobCache {
        &self.inner.status_jobs
    }
}

impl HasUsers for AppState {
    fn users(&self) -> &Users {
        &self.inner.config.users
    }
}

/// The API's routes.
#[cfg(any(test, feature = "internals"))]
pub fn router(state: AppState) -> Router {
    router_with_steps(state, None)
}

/// The API's routes, plus the `/_steps` routes of a steps node when one is given (admins
/// are this node's `[admins]`).
pub fn router_with_steps(state: AppState, steps: Option<crate::steps::Steps>) -> Router {
    let limit = state.config().max_body_bytes;
    let admin = admin_check(state.config().users.clone());
    let refresh = axum::middleware::from_fn_with_state(state.clone(), session::refresh_cookie);
    let count = axum::middleware::from_fn_with_state(state.clone(), health::count_requests);
    let mut app = Router::new()
        .route("/_replicate", post(replicate::post_replicate))
        .route("/_verify", post(verify::post_verify))
        .route("/_scheduler/jobs", get(scheduler::list_jobs))
        .route("/_scheduler/jobs/{id}", get(scheduler::get_job))
        .route("/_scheduler/jobs/{id}/_pause", post(pause::pause))
        .route("/_scheduler/jobs/{id}/_resume", post(pause::resume))
        .route("/_scheduler/docs", get(scheduler::list_all_docs))
        .route("/_scheduler/docs/{*rest}", get(scheduler::docs_path))
        .route("/_active_tasks", get(active_tasks::active_tasks))
        .route("/_scheduler/all_dbs", get(all_dbs::list))
        .route("/_scheduler/all_dbs/{id}", get(all_dbs::get))
        .route(
            "/_session",
            get(session::get_session)
                .post(session::post_session)
                .delete(session::delete_session),
        )
        .route("/", get(health::welcome))
        .route("/_up", get(health::up))
        .route("/metrics", get(node_stats::metrics))
        .route("/_node/{node}/_prometheus", get(node_stats::prometheus))
        .route("/_node/{node}/_stats", get(node_stats::stats))
        .route(
            "/_node/{node}/_replicator_jobs",
            get(node_stats::local_jobs),
        )
        .route("/_node/{node}/_stats/{*path}", get(node_stats::stats_path))
        .route("/_utils/replicator", get(status_page::page))
        .route("/_utils/replicator/status.json", get(status_page::status))
        .route("/_utils/replicator/app.js", get(status_page::app_js))
        .route("/_utils/replicator/app.css", get(status_page::app_css))
        .with_state(state);
    if let Some(steps) = steps {
        app = app.merge(self::steps::router(self::steps::StepsHttp { steps, admin }));
    }
    app.fallback(|| async { HttpError::not_found("missing") })
        .method_not_allowed_fallback(|| async {
            HttpError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this method is not allowed here",
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(rejection::as_couchdb_error))
        .layer(refresh)
        .layer(count)
        .layer(axum::middleware::from_fn(couch_headers::couch_headers))
}

/// The metrics alone, without authentication, for a port of their own (`[prometheus]
/// additional_port`, as CouchDB): `/_node/_local/_prometheus` and `/metrics`.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(node_stats::metrics))
        .route("/_node/_local/_prometheus", get(node_stats::metrics))
        .with_state(state)
        .fallback(|| async { HttpError::not_found("missing") })
        .layer(axum::middleware::from_fn(couch_headers::couch_headers))
}

/// The steps routes' admin check on this node's users (and its authentication CouchDB's):
/// 401 anonymous or wrong, 403 non-admin.
pub(crate) fn admin_check(users: Users) -> self::steps::AdminCheck {
    Arc::new(
        move |headers: axum::http::HeaderMap, peer: self::peer::Peer| {
            let users = users.clone();
            Box::pin(async move {
                let (caller, _) = users.authenticate_headers(&headers, None, peer).await?;
                caller.require_admin().map(|_| ())
            })
        },
    )
}

/// How long [`bind_listener`] waits for an address still held by a previous listener.
pub const REBIND_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Binds `addr`, retrying for up to [`REBIND_PATIENCE`] while it is in use: a restarted
/// `http` child may start before the killed one's listener task has been dropped, and a
/// fast failure there would burn the tree's restart intensity.
pub async fn bind_listener(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let deadline = tokio::time::Instant::now() + REBIND_PATIENCE;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, each client address holding at
/// most [`connection_limit::DEFAULT_PER_CLIENT`] connections.
#[cfg(any(test, feature = "internals"))]
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router_within(listener, router, Arc::default(), shutdown).await
}

/// Serves `router` on `listener` until `shutdown` resolves, each client address holding at
/// most what `limit` allows.
pub async fn serve_router_within(
    listener: tokio::net::TcpListener,
    router: Router,
    limit: Arc<self::connection_limit::ConnectionLimit>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = self::connection_limit::LimitedListener::new(listener, limit);
    let service = router.into_make_service_with_connect_info::<self::peer::PeerAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves the API on `listener` until `shutdown` resolves.
#[cfg(any(test, feature = "internals"))]
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener, router(state), shutdown).await
}
