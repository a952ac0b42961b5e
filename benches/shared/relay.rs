//! A TCP relay on loopback in front of a server, shared by the benches and the tests (the
//! tests include this file from `tests/support`): every connection is piped to the upstream
//! port and the bytes each way are counted, so two replicators behind their own relay are
//! measured the same way whatever HTTP client they use. A [`Link`] makes it a slow network:
//! a delay per direction (a delay line: every chunk leaves `delay` after it came, chunks in
//! order, none waiting for the one before), a new connection's handshake (one round trip
//! before its first byte moves), an optional bandwidth cap per direction shared by all
//! connections (bytes queue behind the link as on a bottleneck router), and optional
//! connection drops (after so many bytes, or all open ones at once with [`Relay::cut`]).
#![allow(dead_code)] // each bench or test binary uses part of it

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the relay's network looks like; the default is loopback (no delay, no cap).
#[derive(Clone, Debug, Default)]
pub struct Link {
    /// Delay client -> server.
    pub up: Duration,
    /// Delay server -> client.
    pub down: Duration,
    /// Bandwidth per direction in bytes per second, shared by all connections.
    pub bytes_per_s: Option<u64>,
    /// Reset a connection once this many bytes went through it (both ways together).
    pub drop_after_bytes: Option<u64>,
}

impl Link {
    /// A symmetric link with round trip `rtt` (half of it each way).
    pub fn rtt(rtt: Duration) -> Self {
        Self {
            up: rtt / 2,
            down: rtt / 2,
            ..Self::default()
        }
    }

    /// The same link capped at `mbit_per_s` megabits per second each way.
    pub fn capped(mut self, mbit_per_s: u64) -> Self {
        self.bytes_per_s = Some(mbit_per_s * 1_000_000 / 8);
        self
    }
}

/// Bytes and connections through a relay so far.
#[derive(Default)]
struct Counts {
    to_server: AtomicU64,
    to_client: AtomicU64,
    accepted: AtomicU64,
    dropped: AtomicU64,
    /// While set, new connections are closed at once (a partition, see [`Relay::block`]).
    blocked: AtomicBool,
    /// A round trip added to the link's own, in milliseconds (see [`Relay::add_rtt`]).
    added_rtt_ms: AtomicU64,
}

/// One direction's bottleneck: when it is next free to send (the bandwidth cap).
type Bottleneck = Arc<Mutex<Option<Instant>>>;

/// A running relay (stops when dropped).
pub struct Relay {
    /// The port clients connect to.
    pub port: u16,
    counts: Arc<Counts>,
    cut: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Starts a plain relay to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Result<Self, String> {
        Self::with_link(upstream, Link::default()).await
    }

    /// Starts a relay to `127.0.0.1:upstream` over `link`.
    pub async fn with_link(upstream: u16, link: Link) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("relay bind: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("relay addr: {e}"))?
            .port();
        let counts = Arc::new(Counts::default());
        let (cut, _) = watch::channel(0u64);
        let (c, cut_tx) = (counts.clone(), cut.clone());
        let links: [Bottleneck; 2] = Default::default();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if c.blocked.load(Ordering::Relaxed) {
                    c.dropped.fetch_add(1, Ordering::Relaxed);
                    drop(client);
                    continue;
                }
                c.accepted.fetch_add(1, Ordering::Relaxed);
                let conn = Conn {
                    counts: c.clone(),
                    link: link.clone(),
                    links: links.clone(),
                    cut: cut_tx.subscribe(),
                };
                tokio::spawn(conn.run(client, upstream));
            }
        });
        Ok(Self {
            port,
            counts,
            cut,
            task,
        })
    }

    /// `(bytes client -> server, bytes server -> client)`.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.counts.to_server.load(Ordering::Relaxed),
            self.counts.to_client.load(Ordering::Relaxed),
        )
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.counts.accepted.load(Ordering::Relaxed)
    }

    /// Connections the relay dropped (by `drop_after_bytes` or [`Relay::cut`]).
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }

    /// Drops every connection open now (new ones are accepted as before).
    pub fn cut(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// A partition: drops every open connection and closes new ones at once until
    /// [`Relay::unblock`].
    pub fn block(&self) {
        self.counts.blocked.store(true, Ordering::Relaxed);
        self.cut();
    }

    /// Ends [`Relay::block`]: new connections are relayed again.
    pub fn unblock(&self) {
        self.counts.blocked.store(false, Ordering::Relaxed);
    }

    /// Adds a round trip of `rtt` (half each way) to every chunk relayed from now on, on
    /// open connections too: a link that turns slow under a running client (zero: back to
    /// the link's own delay).
    pub fn add_rtt(&self, rtt: Duration) {
        self.counts
            .added_rtt_ms
            .store(rtt.as_millis() as u64, Ordering::Relaxed);
    }

    /// `http://127.0.0.1:{port}/{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One relayed connection.
struct Conn {
    counts: Arc<Counts>,
    link: Link,
    links: [Bottleneck; 2],
    cut: watch::Receiver<u64>,
}

impl Conn {
    async fn run(mut self, client: TcpStream, upstream: u16) {
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        // The handshake: nothing moves before one round trip has passed.
        let open_at = Instant::now() + self.link.up + self.link.down;
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        let up = Pipe {
            delay: self.link.up,
            link: self.links[0].clone(),
            counter: Arc::clone(&self.counts),
            to_server: true,
            through: Arc::new(AtomicU64::new(0)),
            bytes_per_s: self.link.bytes_per_s,
            drop_after: self.link.drop_after_bytes,
        };
        let down = Pipe {
            delay: self.link.down,
            link: self.links[1].clone(),
            to_server: false,
            ..up.clone()
        };
        self.cut.mark_unchanged();
        let both = async {
            let (a, b) = (up.run(cr, sw, open_at), down.run(sr, cw, open_at));
            tokio::pin!(a);
            tokio::pin!(b);
            let (mut a_done, mut b_done) = (false, false);
            // Either direction dropping ends both; a clean end waits for the other one.
            while !(a_done && b_done) {
                let dropped = tokio::select! {
                    d = &mut a, if !a_done => { a_done = true; d }
                    d = &mut b, if !b_done => { b_done = true; d }
                };
                if dropped {
                    return true;
                }
            }
            false
        };
        let dropped = tokio::select! {
            d = both => d,
            _ = self.cut.changed() => true,
        };
        if dropped {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
        // Dropping both halves here closes the sockets.
    }
}

/// One direction of a connection.
#[derive(Clone)]
struct Pipe {
    delay: Duration,
    link: Bottleneck,
    counter: Arc<Counts>,
    to_server: bool,
    through: Arc<AtomicU64>,
    bytes_per_s: Option<u64>,
    drop_after: Option<u64>,
}

impl Pipe {
    /// When a chunk of `n` bytes read now arrives on the other side: after the bottleneck
    /// has sent the chunks before it and this one, plus the delay.
    fn arrival(&self, n: usize, open_at: Instant) -> Instant {
        let now = Instant::now().max(open_at);
        let added = Duration::from_millis(self.counter.added_rtt_ms.load(Ordering::Relaxed) / 2);
        let Some(rate) = self.bytes_per_s.filter(|r| *r > 0) else {
            return now + self.delay + added;
        };
        let mut free = self.link.lock().unwrap_or_else(|p| p.into_inner());
        let start = free.map_or(now, |f| f.max(now));
        let sent = start + Duration::from_secs_f64(n as f64 / rate as f64);
        *free = Some(sent);
        sent + self.delay + added
    }

    async fn run(
        self,
        mut from: impl AsyncRead + Unpin,
        mut to: impl AsyncWrite + Unpin + Send + 'static,
        open_at: Instant,
    ) -> bool {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        // The far side: writes each chunk when it is due, in order.
        let writer = async move {
            while let Some((due, chunk)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if to.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            let _ = to.shutdown().await;
        };
        let reader = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let counter = if self.to_server {
                    &self.counter.to_server
                } else {
                    &self.counter.to_client
                };
                counter.fetch_add(n as u64, Ordering::Relaxed);
                let total = self.through.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
                if self.drop_after.is_some_and(|limit| total >= limit) {
                    return true;
                }
                if tx
                    .send((self.arrival(n, open_at), buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
            drop(tx);
            false
        };
        tokio::pin!(writer);
        tokio::pin!(reader);
        // A drop ends the connection at once; a clean end lets the queued chunks arrive.
        tokio::select! {
            dropped = &mut reader => {
                if !dropped {
                    writer.await;
                }
                dropped
            }
            _ = &mut writer => false,
        }
    }
}
