//! One client address cannot take the node's connections (RELIABILITY.md "Inbound"): with
//! `[chttpd] max_connections_per_client = 20`, a client holding 20 idle connections gets
//! every further one closed at once, while another address is served; the slots come back
//! as its connections close.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::deadline;
use crate::support::serve::spawn_serve_with;

/// `GET /_up` on a fresh connection from `from`: the status line, or `None` when the
/// server closed the connection without answering.
async fn up_from(port: u16, from: [u8; 4]) -> Option<String> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind((from, 0).into()).unwrap();
    let mut s = socket.connect(([127, 0, 0, 1], port).into()).await.ok()?;
    s.write_all(b"GET /_up HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines()
        .next()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    deadline(60, "connections per client", async {
        let (_dir, node) = spawn_serve_with("[chttpd]\nmax_connections_per_client = 20\n").await;
        let port: u16 = node.base.rsplit(':').next().unwrap().parse().unwrap();
        let mut held = Vec::new();
        for _ in 0..20 {
            held.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
        }
        // Accepted by the kernel, then closed by the node before anything is read.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            up_from(port, [127, 0, 0, 1]).await,
            None,
            "a 21st connection"
        );
        // Another address has its own count.
        let other = up_from(port, [127, 0, 0, 2]).await;
        assert!(
            other.as_deref().is_some_and(|l| l.contains("200")),
            "{other:?}"
        );
        held.truncate(10);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = up_from(port, [127, 0, 0, 1]).await;
        assert!(
            again.as_deref().is_some_and(|l| l.contains("200")),
            "{again:?}"
        );
    })
    .await;
}
