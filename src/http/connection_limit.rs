//! Open connections per client address ([`ConnectionLimit`]): one address may hold at most
//! `[chttpd] max_connections_per_client` connections to the node's listeners at once (all of
//! them together, plain and TLS); past that, a new connection is closed as soon as it is
//! accepted, before anything is read from it. A client that opens thousands of idle
//! connections would otherwise take the process's file descriptors, which replication sockets
//! share. [`LimitedListener`] applies it to a plain TCP listener; the TLS listener takes a
//! slot before its handshake (`super::tls`).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Connections one address may hold by default: far above a browser's six or a command-line
/// client's few, far below the descriptors a process has.
pub const DEFAULT_PER_CLIENT: usize = 256;

/// The connections each client address holds.
#[derive(Debug)]
pub struct ConnectionLimit {
    per_client: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
    refused: AtomicU64,
}

impl Default for ConnectionLimit {
    fn default() -> Self {
        Self::new(DEFAULT_PER_CLIENT)
    }
}

impl ConnectionLimit {
    /// At most `per_client` connections per address (at least 1).
    pub fn new(per_client: usize) -> Self {
        Self {
            per_client: per_client.max(1),
            open: Mutex::default(),
            refused: AtomicU64::new(0),
        }
    }

    /// A slot for one more connection from `ip`, or `None` when it holds its limit.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.per_client {
            drop(open);
            let refused = self.refused.fetch_add(1, Relaxed) + 1;
            // Once per power of two: a flood does not flood the log too.
            if refused.is_power_of_two() {
                tracing::warn!(%ip, refused, limit = self.per_client,
                    "a client address holds its most connections ([chttpd] max_connections_per_client); refusing more");
            }
            return None;
        }
        *n += 1;
        Some(ConnectionSlot {
            limit: self.clone(),
            ip,
        })
    }

    /// Connections refused so far.
    #[cfg(test)]
    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    fn release(&self, ip: IpAddr) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&ip);
            }
        }
    }
}

/// One connection's place in the count, given back when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    limit: Arc<ConnectionLimit>,
    ip: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.limit.release(self.ip);
    }
}

/// A stream holding its connection slot for as long as it is open.
#[derive(Debug)]
pub struct Limited<S> {
    inner: S,
    _slot: ConnectionSlot,
}

impl<S> Limited<S> {
    /// `inner`, counted under `slot`.
    pub fn new(inner: S, slot: ConnectionSlot) -> Self {
        Self { inner, _slot: slot }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A plain TCP listener that closes connections past the limit at once.
#[derive(Debug)]
pub struct LimitedListener {
    tcp: TcpListener,
    limit: Arc<ConnectionLimit>,
}

impl LimitedListener {
    /// `tcp` under `limit`.
    pub fn new(tcp: TcpListener, limit: Arc<ConnectionLimit>) -> Self {
        Self { tcp, limit }
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = Limited<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, peer) = axum::serve::Listener::accept(&mut self.tcp).await;
            if let Some(slot) = self.limit.admit(peer.ip()) {
                return (Limited::new(stream, slot), peer);
            }
            // Dropped: closed before anything is read.
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_limit_and_gets_slots_back() {
        let limit = Arc::new(ConnectionLimit::new(2));
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let one = limit.admit(a).unwrap();
        let _two = limit.admit(a).unwrap();
        assert!(limit.admit(a).is_none());
        assert!(limit.admit(b).is_some(), "another address is counted apart");
        drop(one);
        assert!(limit.admit(a).is_some());
        assert_eq!(limit.refused(), 1);
    }
}
