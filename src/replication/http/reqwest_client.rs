//! The reqwest client of an endpoint, built from its [`ClientConfig`]: timeouts, compression
//! (asked for only off this machine), the redirects followed, TLS and proxy; and the
//! [`TransportKey`] that says which endpoints can share one such client.

use super::client::ClientConfig;
use super::transport::TransportKey;
use crate::replication::endpoint::database::Endpoint;
use crate::replication::error::{ReplicationError, Result};

/// The process-wide TLS connector. Building a reqwest client otherwise sets up OpenSSL from
/// scratch (system roots, providers): ~150 ms of CPU per client, and jobs build clients at
/// every start, so a node rotating many jobs spent its time there. `None` if it cannot be
/// built (each client then sets up its own and reports the error).
#[cfg(feature = "tls")]
fn shared_tls() -> Option<native_tls::TlsConnector> {
    static TLS: std::sync::OnceLock<Option<native_tls::TlsConnector>> = std::sync::OnceLock::new();
    TLS.get_or_init(|| native_tls::TlsConnector::new().ok())
        .clone()
}

/// The reqwest client of an endpoint: everything but the pool sizing, which `b` carries.
pub(crate) fn build_http(
    ep: &Endpoint,
    cfg: &ClientConfig,
    b: reqwest::ClientBuilder,
) -> Result<reqwest::Client> {
    build(ep, cfg, b.read_timeout(cfg.connection_timeout))
}

/// The client of an endpoint for requests whose body streams in (an attachment passed from
/// source to target): without reqwest's read timeout, which also runs while the body is
/// still being sent and so cut every upload longer than `connection_timeout`; the caller
/// watches the upload's progress instead.
pub(crate) fn build_upload_http(ep: &Endpoint, cfg: &ClientConfig) -> Result<reqwest::Client> {
    build(
        ep,
        cfg,
        reqwest::Client::builder().pool_max_idle_per_host(2),
    )
}

fn build(ep: &Endpoint, cfg: &ClientConfig, b: reqwest::ClientBuilder) -> Result<reqwest::Client> {
    let mut b = b
        .gzip(asks_gzip(ep, cfg))
        .redirect(reqwest::redirect::Policy::limited(cfg.limits.max_redirects))
        .connect_timeout(cfg.connection_timeout)
        .tcp_nodelay(cfg.tcp_nodelay)
        .user_agent(concat!("CouchDB-Replicator/", env!("CARGO_PKG_VERSION")));
    #[cfg(feature = "tls")]
    if ep.parsed_url().scheme() == "https" {
        let tls = super::tls::connector(&cfg.tls)
            .map_err(|e| ReplicationError::InvalidEndpoint(format!("{ep}: {e}")))?;
        b = b.tls_backend_preconfigured(tls);
    } else if let Some(tls) = shared_tls() {
        // Only an https proxy uses it.
        b = b.tls_backend_preconfigured(tls);
    }
    b = match &cfg.proxy {
        Some(p) => b.proxy(
            reqwest::Proxy::all(p)
                .map_err(|_| ReplicationError::InvalidOptions("invalid proxy URL".into()))?,
        ),
        None => b.no_proxy(),
    };
    b.build().map_err(|e| {
        ReplicationError::InvalidEndpoint(format!("{ep}: cannot build HTTP client: {e}"))
    })
}

/// Everything [`build_http`] reads: clients with equal keys are interchangeable.
pub(crate) fn transport_key(ep: &Endpoint, cfg: &ClientConfig) -> TransportKey {
    let url = ep.parsed_url();
    TransportKey {
        scheme: url.scheme().to_owned(),
        host: url.host_str().unwrap_or("").to_owned(),
        port: url.port_or_known_default().unwrap_or(0),
        proxy: cfg.proxy.clone(),
        connection_timeout: cfg.connection_timeout,
        tcp_nodelay: cfg.tcp_nodelay,
        gzip: asks_gzip(ep, cfg),
        max_redirects: cfg.limits.max_redirects,
        tls: cfg.tls.clone(),
    }
}

/// Whether responses are asked for with gzip (decoded by reqwest: the caps count decoded
/// bytes).
fn asks_gzip(ep: &Endpoint, cfg: &ClientConfig) -> bool {
    cfg.limits.compress_loopback || !is_loopback(ep)
}

/// Whether the endpoint is on this machine. Compression is then not asked for: there is no
/// bandwidth to save, and gzip costs CPU on both ends (on a single-threaded server such as
/// pouchdb-server it is a large share of a `_bulk_get`).
fn is_loopback(ep: &Endpoint) -> bool {
    match ep.parsed_url().host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_is_asked_for_only_off_this_machine() {
        let ep = |u: &str| Endpoint::parse(u).unwrap();
        assert!(is_loopback(&ep("http://127.0.0.1:5984/db")));
        assert!(is_loopback(&ep("http://127.8.0.1:5984/db")));
        assert!(is_loopback(&ep("http://[::1]:5984/db")));
        assert!(is_loopback(&ep("http://LocalHost:5984/db")));
        assert!(!is_loopback(&ep("http://10.0.0.1:5984/db")));
        assert!(!is_loopback(&ep("https://couch.example.com/db")));
    }
}
