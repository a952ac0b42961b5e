//! An in-process fault-injecting reverse proxy (axum) in front of a real server, for faults a
//! real server cannot produce on demand. Point an endpoint at `proxy.db_url("db")`; requests
//! are forwarded (streamed both ways) unless a [`Rule`] matches (method, path substring,
//! skip the first `skip` matches, then fire `count` times). Every request is recorded
//! (method, path with query, body) so tests can assert on what the replicator sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;

/// What a matching rule does.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer this status with a CouchDB-style JSON error body.
    Status(u16),
    /// Answer this status, content type and body (e.g. a recorded multipart body).
    Respond(u16, String, Bytes),
    /// Forward, but send only the first half of the upstream body, then reset the connection.
    ResetMidBody,
    /// Forward with the upstream `Content-Length`, but end the body after half of it.
    Truncate,
    /// Wait this long before forwarding (the client's inactivity timeout should fire).
    Stall(Duration),
    /// Forward the headers and the first half of the body, then stall this long.
    StallMidBody(Duration),
    /// Hold the request until the sender's value is `true`, then forward it (a job kept
    /// mid-replication for as long as a test needs).
    Hold(tokio::sync::watch::Receiver<bool>),
}

/// When a fault fires.
#[derive(Clone, Debug)]
pub struct Rule {
    /// Only this method (any when `None`).
    pub method: Option<Method>,
    /// The path (with query) must contain this.
    pub path_contains: String,
    /// Let this many matching requests through first.
    pub skip: usize,
    /// Fire this many times (then forward again).
    pub count: usize,
    /// The fault.
    pub fault: Fault,
    seen: usize,
    fired: usize,
}

impl Rule {
    /// A rule firing `count` times on `method` requests whose path contains `path`.
    pub fn new(method: Option<Method>, path: &str, count: usize, fault: Fault) -> Self {
        Self {
            method,
            path_contains: path.to_owned(),
            skip: 0,
            count,
            fault,
            seen: 0,
            fired: 0,
        }
    }

    /// Lets the first `n` matching requests through.
    pub fn skip(mut self, n: usize) -> Self {
        self.skip = n;
        self
    }
}

/// A request the proxy saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Method.
    pub method: Method,
    /// Path with query (percent-decoded for easy matching).
    pub path: String,
    /// Request headers.
    pub headers: HeaderMap,
    /// Request body.
    pub body: Bytes,
    /// The fault applied, if any.
    pub fault: Option<String>,
}

#[derive(Default)]
struct Inner {
    rules: Vec<Rule>,
    log: Vec<Seen>,
}

#[derive(Clone)]
struct Ctx {
    upstream: String,
    http: reqwest::Client,
    inner: Arc<Mutex<Inner>>,
    /// Bumped by [`FaultProxy::cut_streams`]; forwarded bodies end when it changes.
    cut: tokio::sync::watch::Sender<u64>,
}

/// The running proxy; stops when dropped.
pub struct FaultProxy {
    port: u16,
    inner: Arc<Mutex<Inner>>,
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy forwarding to `upstream_root` (`http://127.0.0.1:PORT/`).
    pub async fn start(upstream_root: &str) -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let cut = tokio::sync::watch::Sender::new(0);
        let ctx = Ctx {
            cut: cut.clone(),
            upstream: upstream_root.trim_end_matches('/').to_owned(),
            http: super::http_client()
                .no_gzip()
                .build()
                .expect("proxy client"),
            inner: inner.clone(),
        };
        let app = axum::Router::new().fallback(handle).with_state(ctx);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            port,
            inner,
            cut,
            task,
        }
    }

    /// Breaks every response being forwarded right now (e.g. a continuous `_changes` feed),
    /// as a server does when the database behind it is deleted.
    pub fn cut_streams(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// The proxied URL of database `db`.
    pub fn db_url(&self, db: &str) -> String {
        format!("http://127.0.0.1:{}/{db}", self.port)
    }

    /// Adds a rule (rules are checked in order; the first that fires wins).
    pub fn add(&self, rule: Rule) {
        self.inner.lock().expect("proxy lock").rules.push(rule);
    }

    /// Removes all rules.
    pub fn clear(&self) {
        self.inner.lock().expect("proxy lock").rules.clear();
    }

    /// How many times each rule fired, in order.
    pub fn fired(&self) -> Vec<usize> {
        let g = self.inner.lock().expect("proxy lock");
        g.rules.iter().map(|r| r.fired).collect()
    }

    /// Every request seen so far.
    pub fn log(&self) -> Vec<Seen> {
        self.inner.lock().expect("proxy lock").log.clone()
    }

    /// Requests whose path contains `s`.
    pub fn requests_to(&self, s: &str) -> Vec<Seen> {
        self.log()
            .into_iter()
            .filter(|r| r.path.contains(s))
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

async fn handle(State(ctx): State<Ctx>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let raw_path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let path = decode(&raw_path);
    let fault = {
        let mut g = ctx.inner.lock().expect("proxy lock");
        let mut chosen = None;
        for r in g.rules.iter_mut() {
            let m = r.method.as_ref().is_none_or(|m| *m == parts.method);
            if !m || !path.contains(&r.path_contains) {
                continue;
            }
            r.seen += 1;
            if r.seen > r.skip && r.fired < r.count {
                r.fired += 1;
                chosen = Some(r.fault.clone());
                break;
            }
        }
        g.log.push(Seen {
            method: parts.method.clone(),
            path: path.clone(),
            headers: parts.headers.clone(),
            body: body.clone(),
            fault: chosen.as_ref().map(|f| format!("{f:?}")),
        });
        chosen
    };
    match fault {
        Some(Fault::Status(s)) => {
            let code = StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body =
                format!("{{\"error\":\"injected\",\"reason\":\"fault proxy answered {s}\"}}");
            return Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("response");
        }
        Some(Fault::Respond(s, ctype, b)) => {
            return Response::builder()
                .status(StatusCode::from_u16(s).unwrap_or(StatusCode::OK))
                .header("content-type", ctype)
                .body(Body::from(b))
                .expect("response");
        }
        Some(Fault::Stall(d)) => tokio::time::sleep(d).await,
        Some(Fault::Hold(ref open)) => {
            let _ = open.clone().wait_for(|v| *v).await;
        }
        _ => {}
    }
    let mut fwd = ctx.http.request(
        parts.method.clone(),
        format!("{}{}", ctx.upstream, raw_path),
    );
    for (k, v) in parts.headers.iter() {
        if !matches!(
            k.as_str(),
            "host" | "content-length" | "transfer-encoding" | "connection"
        ) {
            fwd = fwd.header(k, v);
        }
    }
    let up = match fwd.body(body).send().await {
        Ok(r) => r,
        Err(e) => {
            return Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(Body::from(format!("upstream: {e}")))
                .expect("response");
        }
    };
    let mut resp = Response::builder().status(up.status().as_u16());
    let mut full_len = None;
    for (k, v) in up.headers() {
        if k.as_str() == "content-length" {
            full_len = Some(v.clone());
            continue;
        }
        if !matches!(k.as_str(), "transfer-encoding" | "connection") {
            resp = resp.header(k, v);
        }
    }
    match fault {
        Some(Fault::ResetMidBody) | Some(Fault::Truncate) | Some(Fault::StallMidBody(_)) => {
            let all = up.bytes().await.unwrap_or_default();
            let half = all.slice(..all.len() / 2);
            let stall = match &fault {
                Some(Fault::StallMidBody(d)) => Some(*d),
                _ => None,
            };
            if matches!(fault, Some(Fault::Truncate)) {
                let len = full_len.unwrap_or_else(|| HeaderValue::from(all.len()));
                resp = resp.header("content-length", len);
            }
            let s = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(half) }).chain(
                futures::stream::once(async move {
                    if let Some(d) = stall {
                        tokio::time::sleep(d).await;
                    }
                    Err(std::io::Error::other(
                        "fault proxy: connection reset mid-body",
                    ))
                }),
            );
            resp.body(Body::from_stream(s)).expect("response")
        }
        _ => {
            if let Some(len) = full_len {
                resp = resp.header("content-length", len);
            }
            let mut cut = ctx.cut.subscribe();
            cut.mark_unchanged();
            let mut was_cut = ctx.cut.subscribe();
            was_cut.mark_unchanged();
            // Ends with an error only when cut, so that a cut looks like a dropped connection.
            let body = up
                .bytes_stream()
                .map(|r| r.map_err(std::io::Error::other))
                .take_until(async move {
                    let _ = cut.changed().await;
                })
                .chain(
                    futures::stream::once(async move { was_cut.has_changed().unwrap_or(false) })
                        .filter_map(|cut| async move {
                            cut.then(|| Err(std::io::Error::other("fault proxy: stream cut")))
                        }),
                );
            resp.body(Body::from_stream(body)).expect("response")
        }
    }
}
