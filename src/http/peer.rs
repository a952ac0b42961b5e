//! The address a request came from: the socket's peer, which the servers record for every
//! connection ([`PeerAddr`], through `into_make_service_with_connect_info`, over TCP and
//! TLS alike). What the authentication lockout (`super::lockout`) counts failures by; absent
//! only for a router served without it.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::serve::IncomingStream;

use super::connection_limit::LimitedListener;
use super::tls::TlsListener;

/// A connection's remote address, as the servers record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, LimitedListener>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, LimitedListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// The peer's address, when the server recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self::of(parts))
    }
}

impl Peer {
    /// The peer of a request's parts.
    pub fn of(parts: &Parts) -> Self {
        Self(
            parts
                .extensions
                .get::<ConnectInfo<PeerAddr>>()
                .map(|ConnectInfo(PeerAddr(a))| a.ip()),
        )
    }
}
