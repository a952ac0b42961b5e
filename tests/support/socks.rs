//! A minimal SOCKS5 proxy (RFC 1928, no authentication, CONNECT only) that counts the
//! connections it relays, to show replications really go through a `socks5://` proxy.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy; stops when dropped.
pub struct Socks5Proxy {
    addr: SocketAddr,
    relayed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

async fn handshake(c: &mut TcpStream) -> std::io::Result<TcpStream> {
    let mut head = [0u8; 2];
    c.read_exact(&mut head).await?;
    let mut methods = vec![0u8; usize::from(head[1])];
    c.read_exact(&mut methods).await?;
    c.write_all(&[5, 0]).await?;
    let mut req = [0u8; 4];
    c.read_exact(&mut req).await?;
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            c.read_exact(&mut a).await?;
            Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            c.read_exact(&mut a).await?;
            Ipv6Addr::from(a).to_string()
        }
        _ => {
            let n = c.read_u8().await?;
            let mut name = vec![0u8; usize::from(n)];
            c.read_exact(&mut name).await?;
            String::from_utf8_lossy(&name).into_owned()
        }
    };
    let port = c.read_u16().await?;
    let up = TcpStream::connect((host.as_str(), port)).await?;
    c.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
    Ok(up)
}

impl Socks5Proxy {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let relayed = Arc::new(AtomicUsize::new(0));
        let count = relayed.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut c, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    if let Ok(mut up) = handshake(&mut c).await {
                        count.fetch_add(1, Ordering::SeqCst);
                        let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
                    }
                });
            }
        });
        Self {
            addr,
            relayed,
            task,
        }
    }

    /// `socks5://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("socks5://{}", self.addr)
    }

    /// Connections relayed so far.
    pub fn relayed(&self) -> usize {
        self.relayed.load(Ordering::SeqCst)
    }
}

impl Drop for Socks5Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
