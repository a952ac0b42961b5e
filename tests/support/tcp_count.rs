//! A TCP relay in front of a real server that counts sockets: connections accepted, open now,
//! the most ever open at once, and closed by the client side first (the replicator hung up, not the server). Tests point
//! endpoints at it to see how many connections the replicator really holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    open: AtomicUsize,
    peak: AtomicUsize,
    closed_by_client: AtomicUsize,
}

/// The relay; stops accepting when dropped.
pub struct TcpCounter {
    /// Where clients connect.
    pub port: u16,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TcpCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpCounter {
    /// Relays `127.0.0.1:{port}` to `127.0.0.1:{upstream}`.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                c.accepted.fetch_add(1, Ordering::SeqCst);
                let now = c.open.fetch_add(1, Ordering::SeqCst) + 1;
                c.peak.fetch_max(now, Ordering::SeqCst);
                tokio::spawn(relay(client, upstream, c.clone()));
            }
        });
        Self { port, counts, task }
    }

    /// `http://127.0.0.1:{port}/{db}`.
    pub fn url(&self, db: &str) -> String {
        format!("http://127.0.0.1:{}/{db}", self.port)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.counts.open.load(Ordering::SeqCst)
    }

    /// The most connections open at once so far.
    pub fn peak(&self) -> usize {
        self.counts.peak.load(Ordering::SeqCst)
    }

    /// Connections the client side closed first.
    pub fn closed_by_client(&self) -> usize {
        self.counts.closed_by_client.load(Ordering::SeqCst)
    }
}

async fn relay(client: TcpStream, upstream: u16, c: Arc<Counts>) {
    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        let up = async {
            let _ = tokio::io::copy(&mut cr, &mut sw).await;
            let _ = sw.shutdown().await;
        };
        let down = async {
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
            let _ = cw.shutdown().await;
        };
        // Whichever direction ends first says who hung up; the other half is dropped with it.
        tokio::select! {
            _ = up => { c.closed_by_client.fetch_add(1, Ordering::SeqCst); }
            _ = down => {}
        }
    }
    c.open.fetch_sub(1, Ordering::SeqCst);
}
