//! The proof of "never twice" (issue 40): a relay in front of an endpoint that records every
//! request with the process that sent it. Replicator processes pointed at the same URLs are
//! told apart without their help: the kernel knows which process holds the client end of each
//! connection (`/proc/net/tcp` names the socket's inode, `/proc/PID/fd` its holder).
//!
//! A job's activity is the requests naming its databases. While its sources change every
//! second, a running job sends requests at least every second or so; a request by one process
//! that falls between requests of another process for the same job ([`overlaps`]) is a
//! double run: a hand-over is clean only when the old process sent its last request before
//! the new one its first. Self-contained (the benches include it with `#[path]`).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use futures::StreamExt;
use tokio::time::Instant;

/// One request, as the relay saw it arrive.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When it arrived.
    pub at: Instant,
    /// The process that sent it (`None`: not found, e.g. it exited meanwhile).
    pub pid: Option<u32>,
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path without the query.
    pub path: String,
}

impl Seen {
    /// The database the request names (the path's first segment).
    pub fn db(&self) -> &str {
        self.path
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or("")
    }
}

#[derive(Clone)]
struct Ctx {
    upstream: String,
    http: reqwest::Client,
    seen: Arc<Mutex<Vec<Seen>>>,
    owners: Arc<Mutex<HashMap<u64, u32>>>,
    port: u16,
}

/// The running relay; stops when dropped.
pub struct RunLog {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunLog {
    /// Starts a relay to `upstream_root` (`http://[user:pass@]127.0.0.1:PORT`).
    pub async fn start(upstream_root: &str) -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("run log bind: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("run log addr: {e}"))?
            .port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ctx = Ctx {
            upstream: upstream_root.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .no_gzip()
                .no_proxy()
                .pool_idle_timeout(Duration::from_secs(4))
                .build()
                .map_err(|e| format!("run log client: {e}"))?,
            seen: seen.clone(),
            owners: Arc::default(),
            port,
        };
        let app = axum::Router::new().fallback(forward).with_state(ctx);
        let task = tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        Ok(Self { port, seen, task })
    }

    /// The URL of database `db` through the relay, with `userinfo` (`user:pass@`) if any.
    pub fn db_url(&self, userinfo: &str, db: &str) -> String {
        format!("http://{userinfo}127.0.0.1:{}/{db}", self.port)
    }

    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    State(ctx): State<Ctx>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let pid = {
        let owners = ctx.owners.clone();
        let port = ctx.port;
        tokio::task::spawn_blocking(move || owner(&owners, peer.port(), port))
            .await
            .ok()
            .flatten()
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    if let Ok(mut seen) = ctx.seen.lock() {
        seen.push(Seen {
            at: Instant::now(),
            pid,
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
        });
    }
    let mut fwd = ctx.http.request(
        parts.method.clone(),
        format!("{}{path_and_query}", ctx.upstream),
    );
    for (k, v) in &parts.headers {
        if !matches!(
            k.as_str(),
            "host" | "content-length" | "transfer-encoding" | "connection"
        ) {
            fwd = fwd.header(k, v);
        }
    }
    let fwd = fwd.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    let up = match fwd.send().await {
        Ok(r) => r,
        Err(e) => {
            let mut r = Response::new(Body::from(format!("run log upstream: {e}")));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            return r;
        }
    };
    let mut resp = Response::builder().status(up.status().as_u16());
    for (k, v) in up.headers() {
        if !matches!(k.as_str(), "transfer-encoding" | "connection") {
            resp = resp.header(k, v);
        }
    }
    let body = Body::from_stream(up.bytes_stream().map(|r| r.map_err(std::io::Error::other)));
    resp.body(body).unwrap_or_else(|_| {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r
    })
}

/// The pid holding the client socket `127.0.0.1:peer_port` -> `:relay_port`.
fn owner(owners: &Mutex<HashMap<u64, u32>>, peer_port: u16, relay_port: u16) -> Option<u32> {
    let inode = socket_inode(peer_port, relay_port)?;
    if let Some(pid) = owners.lock().ok()?.get(&inode) {
        return Some(*pid);
    }
    // Unknown socket: learn every socket of every replicator process.
    let mut found = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if !comm.starts_with("couch-replica") {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            if let Some(n) = target
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse::<u64>().ok())
            {
                found.insert(n, pid);
            }
        }
    }
    let mut owners = owners.lock().ok()?;
    owners.extend(found);
    owners.get(&inode).copied()
}

/// The inode of the socket whose local port is `local` and remote port `remote`.
fn socket_inode(local: u16, remote: u16) -> Option<u64> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = |addr: &str| {
                addr.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            if f.len() > 9 && port(f[1]) == Some(local) && port(f[2]) == Some(remote) {
                return f[9].parse().ok();
            }
        }
    }
    None
}

/// One process sending a job's requests while another was running it.
#[derive(Clone, Debug)]
pub struct Overlap {
    /// The job (as named by the caller's `job_of`).
    pub job: String,
    /// The process that sent requests for the job within the window before and after.
    pub running: u32,
    /// The process whose request fell between them.
    pub intruder: u32,
    /// When the intruder's request arrived.
    pub at: Instant,
}

/// Whether a request opens a run of its job: a replication starts by reading its databases'
/// roots (`GET /source`, `GET`/`PUT /target`) and its checkpoints (`GET .../_local/...`),
/// which a running one does not send again (it only writes checkpoints). Sent at once, they
/// reach the relay in any order: a run that began with a checkpoint read was taken for the
/// old run going on (a false double run, 2026-11-29).
fn opens_run(s: &Seen) -> bool {
    s.path.trim_matches('/').split('/').count() == 1
        || (s.method == "GET" && s.path.contains("/_local/"))
}

/// The double runs in `seen`: a request by one process for a job while another process
/// sent requests for the same job within `window` before it and, in the same run (no
/// database root read between), within `window` after it. A running job sends requests at
/// least every `window` (its sources change that often), so two processes running it at
/// once interleave; a clean hand-over does not, since the old process sends its last request
/// before the new one its first (and a job handed straight back starts a new run). Each
/// (job, running, intruder) is reported once, at its first request.
pub fn overlaps(
    seen: &[Seen],
    job_of: impl Fn(&str) -> Option<String>,
    window: Duration,
) -> Vec<Overlap> {
    let mut per_job: BTreeMap<String, Vec<(Instant, u32, bool)>> = BTreeMap::new();
    for s in seen {
        if let (Some(job), Some(pid)) = (job_of(s.db()), s.pid) {
            per_job
                .entry(job)
                .or_default()
                .push((s.at, pid, opens_run(s)));
        }
    }
    let mut out: Vec<Overlap> = Vec::new();
    for (job, list) in per_job {
        for (i, &(at, intruder, _)) in list.iter().enumerate() {
            let before = list[..i]
                .iter()
                .rev()
                .take_while(|(t, _, _)| at.duration_since(*t) <= window)
                .map(|(_, p, _)| *p);
            for running in before.filter(|p| *p != intruder) {
                // The running process's next request, unless a new run of it came first.
                let next = list[i + 1..]
                    .iter()
                    .take_while(|(t, _, _)| t.duration_since(at) <= window)
                    .find(|(_, p, _)| *p == running);
                let same_run = next.is_some_and(|(_, _, opens)| !opens);
                let known = out
                    .iter()
                    .any(|o| o.job == job && o.running == running && o.intruder == intruder);
                if same_run && !known {
                    out.push(Overlap {
                        job: job.clone(),
                        running,
                        intruder,
                        at,
                    });
                }
            }
        }
    }
    out
}

/// Per job, the process that sent its last request before `at`.
pub fn last_senders(
    seen: &[Seen],
    job_of: impl Fn(&str) -> Option<String>,
    at: Instant,
) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for s in seen.iter().filter(|s| s.at < at) {
        if let (Some(job), Some(pid)) = (job_of(s.db()), s.pid) {
            out.insert(job, pid);
        }
    }
    out
}

/// When a process other than `pid` first sent a request for `job` after `after`.
pub fn first_by_another(
    seen: &[Seen],
    job_of: impl Fn(&str) -> Option<String>,
    job: &str,
    pid: u32,
    after: Instant,
) -> Option<Instant> {
    seen.iter()
        .filter(|s| s.at > after && s.pid.is_some_and(|p| p != pid))
        .find(|s| job_of(s.db()).as_deref() == Some(job))
        .map(|s| s.at)
}

/// Per job, the longest time between two requests matching `is_progress` within
/// `[from, to]` (the window's edges count as requests, so a job silent throughout has the
/// whole window), and when that pause ended.
pub fn longest_pauses(
    seen: &[Seen],
    job_of: impl Fn(&str) -> Option<String>,
    is_progress: impl Fn(&Seen) -> bool,
    from: Instant,
    to: Instant,
) -> BTreeMap<String, (Duration, Instant)> {
    // Per job: the last progress, and the longest pause so far with its end.
    let mut last: BTreeMap<String, (Instant, (Duration, Instant))> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.at >= from && s.at <= to) {
        let Some(job) = job_of(s.db()).filter(|_| is_progress(s)) else {
            continue;
        };
        let (prev, worst) = last.entry(job).or_insert((from, (Duration::ZERO, from)));
        let gap = s.at.duration_since(*prev);
        if gap > worst.0 {
            *worst = (gap, s.at);
        }
        *prev = s.at;
    }
    last.into_iter()
        .map(|(job, (prev, worst))| {
            let tail = to.duration_since(prev);
            (job, if tail > worst.0 { (tail, to) } else { worst })
        })
        .collect()
}
