//! The HTTP client of one endpoint (CouchDB's couch_replicator_httpc.erl): pooled reqwest client with gzip and an
//! inactivity timeout of `connection_timeout`, at most `http_connections` requests in flight,
//! retries with doubling sleeps (250 ms, 500 ms, ...) for connection errors, timeouts, 408 and
//! 5xx up to `retries_per_request` (bounded by 60 s since the first failure), and 429 handled
//! through the [`RateLimiter`] hook without consuming retries (that loop is
//! `client/retry.rs`). Bodies are read whole within the endpoint's limits and the node's
//! budget; a streamed upload is sent once, unretried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use reqwest::StatusCode;
use tokio::sync::Semaphore;

use super::auth::{Auth, AuthPolicy};
use super::body::{BodyError, Bounds, collect};
use super::budget::ResponseBudget;
use super::coalesce::Coalescer;
use super::limits::EndpointLimits;
pub use super::request::{Req, ReqBody};
use super::reqwest_client::{build_http, build_upload_http, transport_key};
pub use super::response::Resp;
use super::session_cache::SessionCache;
use super::tls::TlsOptions;
use super::transport::Transports;
use super::upload::Upload;
use crate::replication::changes::watch::Watches;
use crate::replication::endpoint::database::Endpoint;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::rate_limiter::{RateKey, RateLimiter};
use crate::telemetry::{NodeMetrics, Series};

mod retry;
use retry::Outcome;

/// Client settings taken from the replication options.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Inactivity timeout per read.
    pub connection_timeout: Duration,
    /// Overall request timeout.
    pub request_timeout: Option<Duration>,
    /// Retries for retryable failures.
    pub retries_per_request: u32,
    /// Concurrent requests.
    pub http_connections: usize,
    /// Optional proxy URL.
    pub proxy: Option<String>,
    /// TCP_NODELAY.
    pub tcp_nodelay: bool,
    /// Where requests, responses and connections are counted.
    pub metrics: Arc<NodeMetrics>,
    /// TLS settings for an `https` endpoint.
    pub tls: TlsOptions,
    /// Session cookie or Basic.
    pub auth: AuthPolicy,
    /// What the endpoint may send (node configuration).
    pub limits: EndpointLimits,
    /// The node's budget of response bytes held while reading.
    pub budget: Arc<ResponseBudget>,
}

#[cfg(any(test, feature = "internals"))]
impl ClientConfig {
    /// Plain settings for tests: `connection_timeout`, one retry, four connections, no proxy,
    /// default TLS, auth and limits, metrics of its own and a 1 GiB response budget.
    pub fn for_tests(connection_timeout: Duration) -> Self {
        ClientConfig {
            connection_timeout,
            request_timeout: None,
            retries_per_request: 1,
            http_connections: 4,
            proxy: None,
            tcp_nodelay: true,
            metrics: Arc::default(),
            tls: TlsOptions::default(),
            auth: AuthPolicy::default(),
            limits: EndpointLimits::default(),
            budget: Arc::new(ResponseBudget::new(1 << 30, Arc::default())),
        }
    }
}

/// HTTP access to one endpoint.
pub struct HttpClient {
    http: Arc<reqwest::Client>,
    /// The endpoint's bound on buffered requests across jobs (shared clients only).
    gate: Option<Arc<Semaphore>>,
    /// The identical reads in flight across jobs (shared clients only).
    reads: Option<Arc<Coalescer<Resp>>>,
    /// The databases watched across jobs (shared clients only).
    watches: Option<Arc<Watches>>,
    ep: Endpoint,
    auth: Auth,
    limiter: Arc<dyn RateLimiter>,
    cfg: ClientConfig,
    slots: Semaphore,
    /// 429s, timeouts, 408/5xx and connection failures so far: the pipeline's window
    /// shrinks when this moves.
    congestion: AtomicU64,
    /// The client for streamed uploads, built at the first one.
    uploads: tokio::sync::OnceCell<reqwest::Client>,
    /// Document writes to this endpoint: shared, and exclusive for a large one
    /// ([`HttpClient::write_turn`]).
    writes: tokio::sync::RwLock<()>,
}

/// A write at least this large goes to the endpoint alone ([`HttpClient::write_turn`]).
pub const LARGE_WRITE_BYTES: u64 = 64 << 20;

/// The right to send one document write, held until dropped; see
/// [`HttpClient::write_turn`].
pub struct WriteTurn<'a> {
    /// Beside other ordinary writes.
    _shared: Option<tokio::sync::RwLockReadGuard<'a, ()>>,
    /// Alone: no other write of this client runs meanwhile.
    _alone: Option<tokio::sync::RwLockWriteGuard<'a, ()>>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HttpClient({})", self.ep)
    }
}

impl Drop for HttpClient {
    fn drop(&mut self) {
        self.cfg.metrics.inc(Series::ConnectionCloses);
    }
}

impl HttpClient {
    /// Waits for the turn to send a document write of `bytes` (unknown: an ordinary one).
    /// A write of [`LARGE_WRITE_BYTES`] or more waits for the writes in flight and then goes
    /// alone. CouchDB's `[fabric] request_timeout` (60 s) bounds a document's whole upload:
    /// its 1 GiB attachment alone took it 49 s on the benchmark machine, and this client's
    /// other writes beside it pushed it past 60 s, a 500 after a minute of upload (and a
    /// retry that took over 200 s more). Hold the turn only for one request: a write that
    /// waits for another turn while holding one would wait for itself.
    pub async fn write_turn(&self, bytes: Option<u64>) -> WriteTurn<'_> {
        match bytes {
            Some(n) if n >= LARGE_WRITE_BYTES => WriteTurn {
                _shared: None,
                _alone: Some(self.writes.write().await),
            },
            _ => WriteTurn {
                _shared: Some(self.writes.read().await),
                _alone: None,
            },
        }
    }

    /// Builds the client for an endpoint with its own connection pool.
    pub fn new(ep: Endpoint, cfg: ClientConfig, limiter: Arc<dyn RateLimiter>) -> Result<Self> {
        let builder = reqwest::Client::builder().pool_max_idle_per_host(cfg.http_connections);
        let http = Arc::new(build_http(&ep, &cfg, builder)?);
        Ok(Self::assemble(http, None, ep, cfg, limiter))
    }

    /// Builds the client for an endpoint on the shared client of its transport key (see
    /// `Transports`): its sockets are shared with every other client of that key, and
    /// `http_connections` only bounds this client's own requests in flight.
    pub fn shared(
        ep: Endpoint,
        cfg: ClientConfig,
        limiter: Arc<dyn RateLimiter>,
        transports: &Transports,
    ) -> Result<Self> {
        let shared = transports.client(transport_key(&ep, &cfg), |b| build_http(&ep, &cfg, b))?;
        let mut c = Self::assemble(shared.http, Some(shared.gate), ep, cfg, limiter);
        c.reads = Some(shared.reads);
        c.watches = Some(shared.watches);
        c.auth.share_through(transports.sessions());
        Ok(c)
    }

    /// Shares `_session` logins with the other clients of `cache` (same server, same
    /// credentials): a replication's source and target on one server then log in once.
    pub(crate) fn share_sessions(&mut self, cache: &SessionCache) {
        self.auth.share_through(cache);
    }

    fn assemble(
        http: Arc<reqwest::Client>,
        gate: Option<Arc<Semaphore>>,
        ep: Endpoint,
        cfg: ClientConfig,
        limiter: Arc<dyn RateLimiter>,
    ) -> Self {
        // As many connections as a replication's window starts with (half the cap, see
        // `pipeline::shared::in_flight_limits`) are opened while the first login runs.
        let auth = Auth::with_policy(&ep, cfg.auth).warming(cfg.http_connections.div_ceil(2));
        let slots = Semaphore::new(cfg.http_connections.max(1));
        cfg.metrics.inc(Series::ConnectionCreates);
        Self {
            http,
            gate,
            reads: None,
            watches: None,
            ep,
            auth,
            limiter,
            cfg,
            slots,
            congestion: AtomicU64::new(0),
            uploads: tokio::sync::OnceCell::new(),
            writes: tokio::sync::RwLock::new(()),
        }
    }

    /// How many 429s, timeouts, 408/5xx answers and connection failures this client met.
    pub(crate) fn congestion(&self) -> u64 {
        self.congestion.load(Ordering::Relaxed)
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// The error for a 401 from this endpoint: the server refused the credentials at
    /// `_session` (CouchDB's `replication_auth_error`), or the user may not open the database
    /// (CouchDB's reason, with the URL as CouchDB shows it: no credentials).
    pub fn unauthorized(&self) -> ReplicationError {
        let user = self.ep.credentials.as_ref().map(|c| c.username.as_str());
        match user {
            Some(user) if self.auth.login_refused() => ReplicationError::AuthFailed(format!(
                "{}_session refused the credentials of user {user} for {}",
                self.ep.server_root(),
                self.ep.couch_url()
            )),
            _ => ReplicationError::Unauthorized(self.ep.couch_url()),
        }
    }

    /// The error for a 403 from this endpoint (its URL as CouchDB shows it: no credentials).
    pub fn forbidden(&self) -> ReplicationError {
        ReplicationError::Forbidden(self.ep.couch_url())
    }

    /// The table of shared change watches, on a shared client (see `crate::replication::changes::watch`).
    pub fn watches(&self) -> Option<&Arc<Watches>> {
        self.watches.as_ref()
    }

    /// `GET path` like [`HttpClient::send`], but jobs of the same shared transport that read
    /// the same path with the same credentials at the same time share one request (see
    /// `super::coalesce`): for start-up reads such as the database info.
    pub async fn read_shared(&self, path: &str) -> Result<Arc<Resp>> {
        let Some(reads) = &self.reads else {
            return self.send(&Req::get(path)).await.map(Arc::new);
        };
        let req = Req::get(path);
        reads.read(&self.ep, path, || self.send(&req)).await
    }

    /// Sends a request and reads the whole body, retrying as D.6 says. Returns any status the
    /// retry rules do not consume (2xx, 3xx, 4xx other than 408/429).
    pub async fn send(&self, req: &Req) -> Result<Resp> {
        match self.run(req, true).await? {
            Outcome::Full(r) => Ok(r),
            Outcome::Stream(_) => Err(ReplicationError::BadResponse(
                "unexpected streamed response".into(),
            )),
        }
    }

    /// Sends a request and returns the response once its headers arrived (the body is read
    /// by the caller, e.g. a streamed `_changes` feed). Retries only up to the headers.
    pub(crate) async fn send_streaming(&self, req: &Req) -> Result<reqwest::Response> {
        match self.run(req, false).await? {
            Outcome::Stream(r) => Ok(r),
            Outcome::Full(_) => Err(ReplicationError::BadResponse(
                "unexpected buffered response".into(),
            )),
        }
    }

    /// Sends `req` once with a streamed body (which cannot be replayed, hence no retries):
    /// the caller falls back to a buffered, retried path when this fails. The request fails
    /// when neither the body nor the answer moves for `connection_timeout`.
    pub(crate) async fn send_once<S, E>(&self, req: &Req, body: S) -> Result<Resp>
    where
        S: futures::Stream<Item = std::result::Result<Bytes, E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
    {
        let key = RateKey::new(self.ep.url(), req.method.as_str());
        let pause = self.limiter.interval(&key);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| ReplicationError::WorkerDied("client closed".into()))?;
        let _gate = self.pass_gate().await?;
        let what = format!("{} {}/{}", req.method, self.ep, strip_query(&req.path));
        let failed = |e: String| ReplicationError::HttpRequestFailed(format!("{what}: {e}"));
        let upload = self.upload_client().await?;
        let progress = Arc::new(Upload::new());
        let (seen, ended) = (progress.clone(), progress.clone());
        let body = body
            .inspect(move |c| seen.moved(c.as_ref().map_or(0, |b| b.len())))
            .chain(futures::stream::poll_fn(move |_| {
                ended.end();
                std::task::Poll::Ready(None)
            }));
        let rb = self
            .builder_on(upload, req, &mut 0)
            .await
            .header("content-type", req.content_type.as_ref())
            .body(reqwest::Body::wrap_stream(body));
        self.cfg.metrics.inc(Series::Requests);
        let idle = self.cfg.connection_timeout;
        let resp = tokio::select! {
            r = rb.send() => r.map_err(|e| describe(&e)),
            stalled = progress.stalled(idle) => Err(stalled),
        };
        self.count_response(resp.as_ref().map(reqwest::Response::status).ok(), true);
        let resp = resp.map_err(failed)?;
        let status = resp.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            self.congestion.fetch_add(1, Ordering::Relaxed);
            self.limiter.failure(&key);
        } else {
            self.limiter.success(&key);
        }
        let headers = resp.headers().clone();
        let body = self.read_body(resp, &what).await?;
        Ok(Resp {
            status,
            headers,
            body,
            request: what,
        })
    }

    /// Waits for a permit of the endpoint's gate (none on a private client).
    async fn pass_gate(&self) -> Result<Option<tokio::sync::SemaphorePermit<'_>>> {
        match &self.gate {
            None => Ok(None),
            Some(g) => g
                .acquire()
                .await
                .map(Some)
                .map_err(|_| ReplicationError::WorkerDied("endpoint gate closed".into())),
        }
    }

    /// Counts one response as CouchDB does: 429 belongs to the rate limiter, 408 and 5xx
    /// are failures, any other status a success; a transport error (`None`) is a connection
    /// failure, and for a streamed request also a failed streaming response.
    fn count_response(&self, status: Option<StatusCode>, buffered: bool) {
        let m = &self.cfg.metrics;
        let (ok, failed) = if buffered {
            (Series::ResponsesSuccess, Series::ResponsesFailure)
        } else {
            (
                Series::StreamResponsesSuccess,
                Series::StreamResponsesFailure,
            )
        };
        match status {
            Some(StatusCode::TOO_MANY_REQUESTS) => {}
            Some(s) if s == StatusCode::REQUEST_TIMEOUT || s.is_server_error() => m.inc(failed),
            Some(_) => m.inc(ok),
            None => {
                m.inc(Series::ConnectionWorkerCrashes);
                if !buffered {
                    m.inc(failed);
                }
            }
        }
    }

    /// The request with the endpoint's headers, credentials and timeout, without a body.
    /// `credentials`: set to the generation of the credentials sent.
    async fn builder(&self, req: &Req, credentials: &mut u64) -> Result<reqwest::RequestBuilder> {
        if req.paced_by_reader {
            let untimed = self.upload_client().await?;
            return Ok(self.builder_on(untimed, req, credentials).await);
        }
        Ok(self.builder_on(&self.http, req, credentials).await)
    }

    /// The client without a read timeout (streamed uploads, answers paced by their reader),
    /// built at its first use.
    async fn upload_client(&self) -> Result<&reqwest::Client> {
        self.uploads
            .get_or_try_init(|| async { build_upload_http(&self.ep, &self.cfg) })
            .await
    }

    /// [`Self::builder`] on the reqwest client `http`.
    async fn builder_on(
        &self,
        http: &reqwest::Client,
        req: &Req,
        credentials: &mut u64,
    ) -> reqwest::RequestBuilder {
        let mut rb = http
            .request(req.method.clone(), self.ep.join(&req.path))
            .header("accept", req.accept);
        for (k, v) in &self.ep.headers {
            rb = rb.header(k.as_str(), v.as_str());
        }
        for (k, v) in &req.headers {
            rb = rb.header(*k, v.as_str());
        }
        let (header, generation) = self.auth.header(&self.http).await;
        *credentials = generation;
        if let Some((k, v)) = header {
            rb = rb.header(k, v);
        }
        if let Some(t) = self.cfg.request_timeout {
            rb = rb.timeout(t);
        }
        rb
    }

    /// The inactivity timeout of a request.
    pub(crate) fn connection_timeout(&self) -> Duration {
        self.cfg.connection_timeout
    }

    /// What this endpoint may send.
    pub(crate) fn limits(&self) -> &EndpointLimits {
        &self.cfg.limits
    }

    /// Reads `resp`'s body whole within the endpoint's limits: too large or too slow is
    /// `endpoint_response_too_large` / `_too_slow` naming `what`, a broken connection
    /// `http_request_failed`.
    pub(crate) async fn read_body(&self, resp: reqwest::Response, what: &str) -> Result<Bytes> {
        self.read_body_as(resp, what, Hold::WhileReading).await
    }

    /// [`Self::read_body`], the body holding its share of the node's budget as `hold` says.
    pub(crate) async fn read_body_as(
        &self,
        resp: reqwest::Response,
        what: &str,
        hold: Hold,
    ) -> Result<Bytes> {
        let declared = resp.content_length();
        // Without decompression the declared length is the body's; with it, reqwest drops
        // the header, and the cap counts decoded bytes as they come.
        let stream = resp.bytes_stream().map(|r| r.map_err(|e| describe(&e)));
        let cap = self.cfg.limits.max_response_bytes;
        self.collect_within_limits(stream, declared, (cap, hold), what)
            .await
    }

    /// [`collect`] with this endpoint's pace, its errors named after `what`: at most `cap`
    /// bytes, holding the node's budget as `hold` says.
    pub(crate) async fn collect_within_limits(
        &self,
        stream: impl futures::Stream<Item = std::result::Result<Bytes, String>>,
        declared: Option<u64>,
        (cap, hold): (u64, Hold),
        what: &str,
    ) -> Result<Bytes> {
        let l = &self.cfg.limits;
        let bounds = Bounds {
            cap,
            pace: l.pace(self.cfg.connection_timeout),
            budget: &self.cfg.budget,
            patience: self.cfg.connection_timeout,
            keep: matches!(hold, Hold::UntilDropped),
        };
        collect(stream, declared, bounds)
            .await
            .map_err(|e| match e {
                BodyError::TooLarge { .. } => ReplicationError::EndpointResponseTooLarge(format!(
                    "{what} answered {e}; the cap is [replicator] max_response_bytes"
                )),
                BodyError::TooSlow { .. } => ReplicationError::EndpointResponseTooSlow(format!(
                    "{what} answered {e} after connection_timeout"
                )),
                BodyError::Transport(m) => {
                    ReplicationError::HttpRequestFailed(format!("{what}: {m}"))
                }
            })
    }
}

/// How long a body read whole holds its share of the node's response budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Until read (answers parsed and dropped at once).
    WhileReading,
    /// Until its last copy is dropped (documents held until written): a worker that holds
    /// such a body must not wait for budget before giving it up.
    UntilDropped,
}

fn strip_query(p: &str) -> &str {
    p.split('?').next().unwrap_or(p)
}

/// A transport error as text, without the URL (ours carry no credentials, but keep it short).
pub fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection refused or failed"
    } else if e.is_body() || e.is_decode() {
        "connection closed while reading the body"
    } else {
        "request failed"
    };
    // The whole chain: the cause an operator needs ("certificate verify failed", "handshake
    // failure") is usually several sources down.
    let mut causes: Vec<String> = Vec::new();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(inner) = src {
        let text = inner.to_string();
        if !causes.iter().any(|c| c.contains(&text)) {
            causes.push(text);
        }
        src = inner.source();
    }
    if causes.is_empty() {
        kind.to_string()
    } else {
        format!("{kind} ({})", causes.join(": "))
    }
}
