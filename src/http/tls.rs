//! HTTPS for the node's own API, as CouchDB's `[ssl]` section sets it up: the server
//! certificate chain (`cert_file`) and key (`key_file`, optionally encrypted with `password`),
//! the CAs of `cacert_file` (they complete the server's chain and, with
//! `verify_ssl_certificates`, are the only CAs whose client certificates are accepted),
//! `fail_if_no_peer_cert`, `ssl_certificate_max_depth`, `tls_versions` and `ciphers`. This
//! module owns the OpenSSL acceptor built from those settings and [`TlsListener`], which
//! hands TLS streams to axum. Handshakes run in their own tasks, so a slow or failing client
//! neither holds up others nor stops the listener.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{Ssl, SslAcceptor, SslMethod, SslOptions, SslVerifyMode, SslVersion};
use openssl::x509::X509;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

use super::connection_limit::{ConnectionLimit, Limited};
use tokio_openssl::SslStream;

/// How long a client may take to complete its handshake before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Handshakes in flight at most: past them, connections wait in the kernel's backlog (a
/// flood of clients that never finish their handshake holds 64 tasks for 30 s, not one per
/// connection).
pub const MAX_HANDSHAKES: usize = 64;

/// A TLS protocol version of `tls_versions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.0 (`tlsv1`).
    Tls1_0,
    /// TLS 1.1 (`tlsv1.1`).
    Tls1_1,
    /// TLS 1.2 (`tlsv1.2`).
    Tls1_2,
    /// TLS 1.3 (`tlsv1.3`).
    Tls1_3,
}

impl TlsVersion {
    /// Erlang's names: `tlsv1`, `tlsv1.1`, `tlsv1.2`, `tlsv1.3`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "tlsv1" => Some(Self::Tls1_0),
            "tlsv1.1" => Some(Self::Tls1_1),
            "tlsv1.2" => Some(Self::Tls1_2),
            "tlsv1.3" => Some(Self::Tls1_3),
            _ => None,
        }
    }

    const ALL: [Self; 4] = [Self::Tls1_0, Self::Tls1_1, Self::Tls1_2, Self::Tls1_3];

    fn openssl(self) -> SslVersion {
        match self {
            Self::Tls1_0 => SslVersion::TLS1,
            Self::Tls1_1 => SslVersion::TLS1_1,
            Self::Tls1_2 => SslVersion::TLS1_2,
            Self::Tls1_3 => SslVersion::TLS1_3,
        }
    }

    /// The option that switches this version off (to leave gaps in a non-contiguous list).
    fn disable(self) -> SslOptions {
        match self {
            Self::Tls1_0 => SslOptions::NO_TLSV1,
            Self::Tls1_1 => SslOptions::NO_TLSV1_1,
            Self::Tls1_2 => SslOptions::NO_TLSV1_2,
            Self::Tls1_3 => SslOptions::NO_TLSV1_3,
        }
    }
}

/// What the HTTPS listener serves with. `Debug` hides the key password.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerTlsOptions {
    /// PEM: the server certificate, optionally followed by its intermediates.
    pub cert_file: PathBuf,
    /// PEM private key of the certificate.
    pub key_file: PathBuf,
    /// Password of an encrypted `key_file`.
    pub password: Option<String>,
    /// PEM CA certificates: chain building, and the trusted issuers of client certificates.
    pub cacert_file: Option<PathBuf>,
    /// Ask clients for a certificate and check it (`verify_ssl_certificates`).
    pub verify_peer: bool,
    /// With `verify_peer`, refuse clients that send none (`fail_if_no_peer_cert`).
    pub fail_if_no_peer_cert: bool,
    /// Intermediate CAs allowed between a client certificate and its trusted CA
    /// (`ssl_certificate_max_depth`; CouchDB: 1). OpenSSL's verify depth counts the same way
    /// as Erlang's `depth`.
    pub max_depth: u32,
    /// Allowed versions; empty means OpenSSL's modern default (TLS 1.2 and 1.3, as Erlang/OTP
    /// 25 under CouchDB 3.4).
    pub versions: Vec<TlsVersion>,
    /// Allowed cipher suites by OpenSSL name (`TLS_*` are TLS 1.3 suites); empty means the
    /// default list.
    pub ciphers: Vec<String>,
}

impl std::fmt::Debug for ServerTlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTlsOptions")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("password", &self.password.as_ref().map(|_| "*****"))
            .field("cacert_file", &self.cacert_file)
            .field("verify_peer", &self.verify_peer)
            .field("fail_if_no_peer_cert", &self.fail_if_no_peer_cert)
            .field("max_depth", &self.max_depth)
            .field("versions", &self.versions)
            .field("ciphers", &self.ciphers)
            .finish()
    }
}

/// Why the HTTPS listener cannot be set up. Never carries the key password.
#[derive(Debug, thiserror::Error)]
pub enum ServerTlsError {
    /// A file named by a key cannot be read or used.
    #[error("[ssl] {key} {}: {reason}", path.display())]
    File {
        /// The `[ssl]` key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting OpenSSL refuses.
    #[error("[ssl] {key}: {reason}")]
    Setting {
        /// The `[ssl]` key.
        key: &'static str,
        /// OpenSSL's complaint.
        reason: String,
    },
}

fn file_err(key: &'static str, path: &Path, reason: impl ToString) -> ServerTlsError {
    ServerTlsError::File {
        key,
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn setting_err(key: &'static str) -> impl Fn(openssl::error::ErrorStack) -> ServerTlsError {
    move |e| ServerTlsError::Setting {
        key,
        reason: e.to_string(),
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, ServerTlsError> {
    std::fs::read(path).map_err(|e| file_err(key, path, e))
}

fn certs(key: &'static str, path: &Path) -> Result<Vec<X509>, ServerTlsError> {
    let certs = X509::stack_from_pem(&read(key, path)?)
        .map_err(|e| file_err(key, path, format!("not PEM certificates ({e})")))?;
    if certs.is_empty() {
        return Err(file_err(key, path, "no certificate in the file"));
    }
    Ok(certs)
}

/// The private key; without a password an encrypted key is an error, never a prompt on
/// the terminal (OpenSSL's default when no password callback is given).
fn private_key(opts: &ServerTlsOptions) -> Result<PKey<Private>, ServerTlsError> {
    let pem = read("key_file", &opts.key_file)?;
    let key = match &opts.password {
        Some(p) => PKey::private_key_from_pem_passphrase(&pem, p.as_bytes()),
        None => PKey::private_key_from_pem_callback(&pem, |_| Ok(0)),
    };
    key.map_err(|_| {
        file_err(
            "key_file",
            &opts.key_file,
            "not a PEM private key, or [ssl] password does not open it",
        )
    })
}

/// A built acceptor, shared by every connection (and every restart of the listener).
#[derive(Clone)]
pub struct ServerTls {
    acceptor: Arc<SslAcceptor>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    /// Reads the files and sets up OpenSSL; every problem is reported here, at start.
    pub fn new(opts: &ServerTlsOptions) -> Result<Self, ServerTlsError> {
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(setting_err("enable"))?;
        let mut chain = certs("cert_file", &opts.cert_file)?.into_iter();
        if let Some(leaf) = chain.next() {
            b.set_certificate(&leaf)
                .map_err(|e| file_err("cert_file", &opts.cert_file, e))?;
        }
        for c in chain {
            b.add_extra_chain_cert(c)
                .map_err(|e| file_err("cert_file", &opts.cert_file, e))?;
        }
        let key = private_key(opts)?;
        // OpenSSL checks here that the key matches the certificate.
        let mismatch = |_| {
            file_err(
                "key_file",
                &opts.key_file,
                "does not belong to the certificate of cert_file",
            )
        };
        b.set_private_key(&key).map_err(mismatch)?;
        b.check_private_key().map_err(mismatch)?;
        if let Some(ca_file) = &opts.cacert_file {
            for ca in certs("cacert_file", ca_file)? {
                // In the store, OpenSSL completes the server's chain from these CAs and
                // trusts them for client certificates; the client CA list tells clients
                // which certificate to send.
                b.add_client_ca(&ca)
                    .map_err(|e| file_err("cacert_file", ca_file, e))?;
                b.cert_store_mut()
                    .add_cert(ca)
                    .map_err(|e| file_err("cacert_file", ca_file, e))?;
            }
        }
        if opts.verify_peer {
            let mut mode = SslVerifyMode::PEER;
            if opts.fail_if_no_peer_cert {
                mode |= SslVerifyMode::FAIL_IF_NO_PEER_CERT;
            }
            b.set_verify(mode);
            b.set_verify_depth(opts.max_depth);
            // OpenSSL refuses to resume a verified session without one.
            b.set_session_id_context(b"couch-replicator")
                .map_err(setting_err("verify_ssl_certificates"))?;
        }
        set_versions(&mut b, &opts.versions)?;
        set_ciphers(&mut b, &opts.ciphers)?;
        Ok(Self {
            acceptor: Arc::new(b.build()),
        })
    }
}

fn set_versions(
    b: &mut openssl::ssl::SslAcceptorBuilder,
    versions: &[TlsVersion],
) -> Result<(), ServerTlsError> {
    let (Some(min), Some(max)) = (versions.iter().min(), versions.iter().max()) else {
        return Ok(());
    };
    b.set_min_proto_version(Some(min.openssl()))
        .map_err(setting_err("tls_versions"))?;
    b.set_max_proto_version(Some(max.openssl()))
        .map_err(setting_err("tls_versions"))?;
    for v in TlsVersion::ALL {
        if v > *min && v < *max && !versions.contains(&v) {
            b.set_options(v.disable());
        }
    }
    Ok(())
}

fn set_ciphers(
    b: &mut openssl::ssl::SslAcceptorBuilder,
    ciphers: &[String],
) -> Result<(), ServerTlsError> {
    let (tls13, tls12): (Vec<&str>, Vec<&str>) = ciphers
        .iter()
        .map(String::as_str)
        .partition(|c| c.starts_with("TLS_"));
    if !tls12.is_empty() {
        b.set_cipher_list(&tls12.join(":"))
            .map_err(setting_err("ciphers"))?;
    }
    if !tls13.is_empty() {
        b.set_ciphersuites(&tls13.join(":"))
            .map_err(setting_err("ciphers"))?;
    }
    Ok(())
}

type Accepted = (Limited<SslStream<TcpStream>>, SocketAddr);

/// A TCP listener whose connections come out TLS-terminated, for [`axum::serve()`]. The accept
/// loop runs in a task of its own, stopped when this value is dropped.
pub struct TlsListener {
    ready: mpsc::Receiver<Accepted>,
    local: SocketAddr,
    accept_loop: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `tcp` with `tls`, each client address within `limit`.
    pub fn new(tcp: TcpListener, tls: &ServerTls, limit: Arc<ConnectionLimit>) -> io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let accept_loop = tokio::spawn(accept_loop(tcp, tls.acceptor.clone(), tx, limit));
        Ok(Self {
            ready,
            local,
            accept_loop,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Limited<SslStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // Only if the accept loop is gone (it never returns while we hold the receiver).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: Arc<SslAcceptor>,
    tx: mpsc::Sender<Accepted>,
    limit: Arc<ConnectionLimit>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match tcp.accept().await {
            Ok(c) => c,
            // A client that gave up before we took its connection.
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin (as axum does).
                tracing::warn!("HTTPS listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(slot) = limit.admit(peer.ip()) else {
            continue;
        };
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let done = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&acceptor, stream)).await;
            drop(permit);
            match done {
                Ok(Ok(tls)) => {
                    let _ = tx.send((Limited::new(tls, slot), peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

async fn handshake(acceptor: &SslAcceptor, tcp: TcpStream) -> Result<SslStream<TcpStream>, String> {
    let ssl = Ssl::new(acceptor.context()).map_err(|e| e.to_string())?;
    let mut tls = SslStream::new(ssl, tcp).map_err(|e| e.to_string())?;
    Pin::new(&mut tls)
        .accept()
        .await
        .map_err(|e| e.to_string())?;
    Ok(tls)
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves.
pub async fn serve_router_tls(
    listener: TlsListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let service = router.into_make_service_with_connect_info::<super::peer::PeerAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await
}
