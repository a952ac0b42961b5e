//! Shared HTTP transports: one reqwest client (and so one connection pool) per transport key
//! — scheme, host, port, proxy, TLS settings and the client-level settings (read timeout,
//! TCP_NODELAY, compression) — handed to every [`HttpClient`](super::client::HttpClient) built with the
//! same key, so jobs against the same endpoint share sockets as CouchDB's
//! `couch_replicator_connection` shares them per (host, port).
//!
//! Credentials are not part of the key (they travel per request), and the table never shows
//! proxy URLs (they may carry credentials). Idle sockets inside a client close after the
//! table's `idle_close` (reqwest's idle timeout); a client no [`HttpClient`](super::client::HttpClient) uses any more is
//! dropped by [`Transports::sweep`] once it has been unused for `idle_close`, which closes
//! whatever sockets it still had.
//!
//! Each key also has a gate on the buffered requests in flight through its client, across
//! every job ([`SharedTransport::gate`]): a client opens one socket per concurrent request,
//! so without it a rotation that starts hundreds of jobs at once (each with a few start-up
//! requests) opens a socket per request and closes most of them right after. Long-lived
//! streamed requests (continuous `_changes` feeds) do not take the gate, or the feeds of
//! running jobs would hold it shut.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::coalesce::Coalescer;
use super::response::Resp;
use super::session_cache::SessionCache;
use super::tls::TlsOptions;
use crate::replication::changes::watch::Watches;

/// What makes two clients interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransportKey {
    /// `http` or `https`.
    pub scheme: String,
    /// Host name or address.
    pub host: String,
    /// Port (the scheme's default when the URL has none).
    pub port: u16,
    /// Proxy URL, if any (never displayed).
    pub proxy: Option<String>,
    /// Read and connect timeout.
    pub connection_timeout: Duration,
    /// TCP_NODELAY.
    pub tcp_nodelay: bool,
    /// Whether responses may be compressed.
    pub gzip: bool,
    /// Redirects followed per request.
    pub max_redirects: usize,
    /// CA file, client certificate, verification (never displayed).
    pub tls: TlsOptions,
}

impl TransportKey {
    /// `scheme://host:port`, plus ` (proxied)` when a proxy is used: safe to show.
    pub fn display(&self) -> String {
        let via = if self.proxy.is_some() {
            " (proxied)"
        } else {
            ""
        };
        format!("{}://{}:{}{via}", self.scheme, self.host, self.port)
    }
}

struct Entry {
    client: Arc<reqwest::Client>,
    gate: Arc<Semaphore>,
    reads: Arc<Coalescer<Resp>>,
    watches: Arc<Watches>,
    /// Since when no [`HttpClient`](super::client::HttpClient) holds the client, if so.
    unused_since: Option<Instant>,
}

/// One shared client as the table sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TransportUse {
    /// [`TransportKey::display`].
    pub endpoint: String,
    /// HTTP clients (one per job and endpoint) holding it.
    pub users: usize,
}

/// What an HTTP client gets from the table for its key.
#[derive(Debug, Clone)]
pub struct SharedTransport {
    /// The shared reqwest client (its connection pool).
    pub http: Arc<reqwest::Client>,
    /// Permits for buffered requests in flight through `http`, shared by every job.
    pub gate: Arc<Semaphore>,
    /// Identical reads in flight through `http`, joined across jobs.
    pub reads: Arc<Coalescer<Resp>>,
    /// The databases watched through `http`, one feed each for every job reading them.
    pub watches: Arc<Watches>,
}

/// The table of shared clients.
pub struct Transports {
    idle_close: Duration,
    max_idle_per_host: usize,
    max_requests: usize,
    clients: Mutex<HashMap<TransportKey, Entry>>,
    sessions: SessionCache,
}

impl std::fmt::Debug for Transports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Transports({} clients)", self.len())
    }
}

impl Transports {
    /// A table whose idle sockets and unused clients close after `idle_close`, keeping at
    /// most `max_idle_per_host` idle sockets per client, and letting at most `max_requests`
    /// buffered requests through one client at once.
    pub fn new(idle_close: Duration, max_idle_per_host: usize, max_requests: usize) -> Self {
        Self {
            idle_close,
            max_idle_per_host: max_idle_per_host.max(1),
            max_requests: max_requests.max(1),
            clients: Mutex::new(HashMap::new()),
            sessions: SessionCache::default(),
        }
    }

    /// The `_session` cookies shared by the clients of this table.
    pub fn sessions(&self) -> &SessionCache {
        &self.sessions
    }

    /// The client (and its gate) for `key`, built by `build` (given the table's pool
    /// settings) the first time.
    pub fn client<E>(
        &self,
        key: TransportKey,
        build: impl FnOnce(reqwest::ClientBuilder) -> Result<reqwest::Client, E>,
    ) -> Result<SharedTransport, E> {
        let mut clients = self.lock();
        if let Some(e) = clients.get_mut(&key) {
            e.unused_since = None;
            return Ok(SharedTransport {
                http: e.client.clone(),
                gate: e.gate.clone(),
                reads: e.reads.clone(),
                watches: e.watches.clone(),
            });
        }
        let builder = reqwest::Client::builder()
            .pool_idle_timeout(self.idle_close)
            .pool_max_idle_per_host(self.max_idle_per_host);
        let shared = SharedTransport {
            http: Arc::new(build(builder)?),
            gate: Arc::new(Semaphore::new(self.max_requests)),
            reads: Arc::default(),
            watches: Arc::default(),
        };
        clients.insert(
            key,
            Entry {
                client: shared.http.clone(),
                gate: shared.gate.clone(),
                reads: shared.reads.clone(),
                watches: shared.watches.clone(),
                unused_since: None,
            },
        );
        Ok(shared)
    }

    /// Drops the clients nobody has used for `idle_close` (closing their sockets); returns
    /// how many were dropped.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let close = self.idle_close;
        let mut clients = self.lock();
        let before = clients.len();
        clients.retain(|_, e| {
            if Arc::strong_count(&e.client) > 1 {
                e.unused_since = None;
                return true;
            }
            let since = *e.unused_since.get_or_insert(now);
            now.duration_since(since) < close
        });
        before - clients.len()
    }

    /// Clients in the table.
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Every client and how many HTTP clients hold it, sorted.
    pub fn usage(&self) -> Vec<TransportUse> {
        let mut v: Vec<TransportUse> = self
            .lock()
            .iter()
            .map(|(k, e)| TransportUse {
                endpoint: k.display(),
                users: Arc::strong_count(&e.client) - 1,
            })
            .collect();
        v.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TransportKey, Entry>> {
        // A panic while holding the lock leaves a consistent map (every update is one insert
        // or retain), so a poisoned lock is still usable.
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(host: &str) -> TransportKey {
        TransportKey {
            scheme: "http".into(),
            host: host.into(),
            port: 5984,
            proxy: None,
            connection_timeout: Duration::from_secs(30),
            tcp_nodelay: false,
            gzip: false,
            max_redirects: 10,
            tls: TlsOptions::default(),
        }
    }

    fn build(b: reqwest::ClientBuilder) -> Result<reqwest::Client, reqwest::Error> {
        b.no_proxy().build()
    }

    #[tokio::test(start_paused = true)]
    async fn same_key_same_client_and_unused_clients_go_after_idle_close() {
        let t = Transports::new(Duration::from_secs(10), 4, 8);
        let a = t.client(key("a"), build).unwrap().http;
        let a2 = t.client(key("a"), build).unwrap().http;
        let b = t.client(key("b"), build).unwrap().http;
        assert!(Arc::ptr_eq(&a, &a2));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(t.usage()[0].users, 2);
        drop((a, a2));
        assert_eq!(t.sweep(), 0, "first seen unused: the idle time starts");
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(t.sweep(), 0);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(t.sweep(), 1, "unused for idle_close: dropped");
        assert_eq!(t.usage().len(), 1, "b is still held");
        drop(b);
        tokio::time::advance(Duration::from_secs(5)).await;
        t.sweep();
        let _b = t.client(key("b"), build).unwrap();
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(t.sweep(), 0, "used again: the idle time restarts");
    }

    #[tokio::test]
    async fn one_gate_per_key_with_the_table_s_request_bound() {
        let t = Transports::new(Duration::from_secs(10), 4, 8);
        let a = t.client(key("a"), build).unwrap().gate;
        let a2 = t.client(key("a"), build).unwrap().gate;
        let b = t.client(key("b"), build).unwrap().gate;
        assert!(Arc::ptr_eq(&a, &a2), "jobs on one endpoint share its gate");
        assert!(!Arc::ptr_eq(&a, &b));
        let _held = a.clone().try_acquire_many_owned(8).unwrap();
        assert!(a2.try_acquire().is_err(), "8 in flight: the 9th waits");
        assert_eq!(b.available_permits(), 8, "another endpoint is not held up");
    }

    #[tokio::test]
    async fn different_tls_settings_get_different_clients() {
        let t = Transports::new(Duration::from_secs(10), 4, 8);
        let plain = t.client(key("a"), build).unwrap().http;
        let mut k = key("a");
        k.tls.verify = !k.tls.verify;
        let other = t.client(k, build).unwrap().http;
        assert!(!Arc::ptr_eq(&plain, &other));
    }

    #[test]
    fn display_hides_the_proxy() {
        let mut k = key("h");
        k.proxy = Some("http://user:secret@proxy:3128".into());
        assert_eq!(k.display(), "http://h:5984 (proxied)");
    }
}
