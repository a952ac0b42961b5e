//! A byte-counting TCP relay in front of a server: every connection to the relay is piped to
//! the upstream port, and the bytes each way are added up, so two replicators going through
//! their own relay are measured the same way, whatever HTTP client they use.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes through a relay so far.
#[derive(Default)]
struct Counts {
    to_server: AtomicU64,
    to_client: AtomicU64,
}

/// A running relay (stops when dropped).
pub struct Relay {
    /// The port clients connect to.
    pub port: u16,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Starts a relay to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("relay bind: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("relay addr: {e}"))?
            .port();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = pipe(cr, sw, c.clone(), true);
                    let down = pipe(sr, cw, c, false);
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Ok(Self { port, counts, task })
    }

    /// `(bytes client -> server, bytes server -> client)`.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.counts.to_server.load(Ordering::Relaxed),
            self.counts.to_client.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    counts: Arc<Counts>,
    upstream: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let counter = if upstream {
            &counts.to_server
        } else {
            &counts.to_client
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
