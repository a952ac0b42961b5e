//! The client's transport for `https://` etcd endpoints: OpenSSL over sockets with Nagle's
//! algorithm off, balanced over the endpoints.
//!
//! etcd-client's own OpenSSL transport dials with a connector that leaves Nagle on, so every
//! small gRPC request waited ~40 ms for a delayed ACK. This builds the same kind of channel
//! (tonic endpoints dialled through `hyper-openssl`, a power-of-two-choices balancer behind a
//! buffer) from a connector that sets `TCP_NODELAY`. It takes the endpoints etcd-client
//! sends (with its timeouts and keep-alive) and owns nothing else.

use std::path::PathBuf;

use etcd_client::{BalancedChannelBuilder, Channel};
use futures::StreamExt;
use hyper_openssl::client::legacy::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslConnectorBuilder, SslMethod};
use openssl::x509::X509;
use tonic::transport::channel::Change;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::Change as TowerChange;
use tower::load::Constant;
use tower::util::BoxCloneSyncService;

use crate::store::StoreError;

/// Requests waiting for a connection at most (etcd-client's own buffer size).
const BUFFER: usize = 1024;

/// The PEM files of a TLS connection to etcd.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

fn invalid(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Invalid(format!("etcd TLS {what}: {e}"))
}

fn read(path: &PathBuf) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| invalid(&format!("file {}", path.display()), e))
}

impl TlsFiles {
    /// OpenSSL's client settings: the CA (else the system's), the client certificate with
    /// any chain after it, and HTTP/2 by ALPN (gRPC has no upgrade).
    fn ssl(&self) -> Result<SslConnectorBuilder, StoreError> {
        let mut b =
            SslConnector::builder(SslMethod::tls_client()).map_err(|e| invalid("setup", e))?;
        b.set_alpn_protos(b"\x02h2")
            .map_err(|e| invalid("ALPN", e))?;
        if let Some(ca) = &self.ca {
            let certs = X509::stack_from_pem(&read(ca)?).map_err(|e| invalid("CA file", e))?;
            for cert in certs {
                let store = b.cert_store_mut();
                store.add_cert(cert).map_err(|e| invalid("CA file", e))?;
            }
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = X509::stack_from_pem(&read(cert)?)
                    .map_err(|e| invalid("client certificate", e))?;
                let mut chain = chain.into_iter();
                let leaf = chain
                    .next()
                    .ok_or_else(|| invalid("client certificate", "no certificate in the file"))?;
                b.set_certificate(&leaf)
                    .map_err(|e| invalid("client certificate", e))?;
                for extra in chain {
                    b.add_extra_chain_cert(extra)
                        .map_err(|e| invalid("client certificate chain", e))?;
                }
                let key = PKey::private_key_from_pem(&read(key)?)
                    .map_err(|e| invalid("client key", e))?;
                b.set_private_key(&key)
                    .map_err(|e| invalid("client key", e))?;
                b.check_private_key()
                    .map_err(|e| invalid("client key", e))?;
            }
            (None, None) => {}
            _ => {
                return Err(StoreError::Invalid(
                    "etcd client certificate and key must be given together".into(),
                ));
            }
        }
        Ok(b)
    }

    /// The channel builder for `Client::connect_with_balanced_channel`.
    pub(crate) fn channel(&self) -> Result<NoDelayTls, StoreError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        let https = HttpsConnector::with_connector(http, self.ssl()?)
            .map_err(|e| invalid("connector", e))?;
        Ok(NoDelayTls(https))
    }
}

/// Builds the balanced TLS channel (see the module doc).
pub(crate) struct NoDelayTls(HttpsConnector<HttpConnector>);

type EndpointUpdater =
    tokio::sync::mpsc::Sender<Change<tonic::codegen::http::Uri, tonic::transport::Endpoint>>;

impl BalancedChannelBuilder for NoDelayTls {
    /// Never returned (the fallible part is [`TlsFiles::channel`]); etcd-client needs a
    /// type it converts from.
    type Error = std::io::Error;

    fn balanced_channel(self, _: usize) -> Result<(Channel, EndpointUpdater), Self::Error> {
        type Update = Change<tonic::codegen::http::Uri, tonic::transport::Endpoint>;
        let (updates, incoming) = tokio::sync::mpsc::channel::<Update>(16);
        let connector = self.0;
        // Each endpoint etcd-client adds becomes a lazily connected tonic channel.
        let discover = futures::stream::unfold(incoming, |mut incoming| async move {
            let change = incoming.recv().await?;
            Some((change, incoming))
        })
        .map(move |change| {
            Ok::<_, tower::BoxError>(match change {
                Change::Insert(uri, endpoint) => {
                    let channel = endpoint.connect_with_connector_lazy(connector.clone());
                    TowerChange::Insert(uri, Constant::new(channel, 0))
                }
                Change::Remove(uri) => TowerChange::Remove(uri),
            })
        });
        let balanced = Buffer::new(Balance::new(Box::pin(discover)), BUFFER);
        let service = BoxCloneSyncService::new(balanced);
        Ok((Channel::Custom(service), updates))
    }
}
