//! TLS for endpoint tests: a throwaway CA with a server certificate for `127.0.0.1` and a
//! client certificate (its key encrypted with a password), written as PEM files, and a
//! TLS-terminating proxy in front of a plain HTTP server that can require a client
//! certificate from that CA. Built on OpenSSL, which native-tls already links.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{Ssl, SslAcceptor, SslMethod, SslVerifyMode};
use openssl::symm::Cipher;
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509, X509NameBuilder};
use tokio::net::{TcpListener, TcpStream};

/// The password of the client key file.
pub const CLIENT_KEY_PASSWORD: &str = "k3y-p4ss";

/// PEM files of a test CA, a server certificate for 127.0.0.1/localhost and a client
/// certificate, in a temp dir that lives as long as this value.
pub struct TestPki {
    dir: tempfile::TempDir,
    ca: X509,
    ca_key: PKey<Private>,
    server: (X509, PKey<Private>),
}

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn cert(
    cn: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    client: bool,
) -> X509 {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let serial = BigNum::from_u32(rand::random::<u32>() >> 1).unwrap();
    b.set_serial_number(&serial.to_asn1_integer().unwrap())
        .unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(2).unwrap())
        .unwrap();
    match issuer {
        None => {
            b.set_issuer_name(&name).unwrap();
            ca_extensions(&mut b);
            b.sign(key, MessageDigest::sha256()).unwrap();
        }
        Some((ca, ca_key)) => {
            b.set_issuer_name(ca.subject_name()).unwrap();
            b.append_extension(BasicConstraints::new().build().unwrap())
                .unwrap();
            let eku = if client {
                ExtendedKeyUsage::new().client_auth().build().unwrap()
            } else {
                ExtendedKeyUsage::new().server_auth().build().unwrap()
            };
            b.append_extension(eku).unwrap();
            if !client {
                let san = SubjectAlternativeName::new()
                    .ip("127.0.0.1")
                    .dns("localhost")
                    .build(&b.x509v3_context(Some(ca), None))
                    .unwrap();
                b.append_extension(san).unwrap();
            }
            b.sign(ca_key, MessageDigest::sha256()).unwrap();
        }
    }
    b.build()
}

impl TestPki {
    /// A new CA and its certificates, written to `ca.pem`, `server.pem`/`server-key.pem`,
    /// `client.pem`/`client-key.pem` (encrypted with [`CLIENT_KEY_PASSWORD`]).
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = key();
        let ca = cert("couch-replicator test CA", &ca_key, None, false);
        let server_key = key();
        let server = cert("127.0.0.1", &server_key, Some((&ca, &ca_key)), false);
        let client_key = key();
        let client = cert("replicator", &client_key, Some((&ca, &ca_key)), true);
        let w = |n: &str, b: Vec<u8>| std::fs::write(dir.path().join(n), b).unwrap();
        w("ca.pem", ca.to_pem().unwrap());
        w("server.pem", server.to_pem().unwrap());
        w(
            "server-key.pem",
            server_key.private_key_to_pem_pkcs8().unwrap(),
        );
        w("client.pem", client.to_pem().unwrap());
        w(
            "client-key.pem",
            client_key
                .private_key_to_pem_pkcs8_passphrase(
                    Cipher::aes_256_cbc(),
                    CLIENT_KEY_PASSWORD.as_bytes(),
                )
                .unwrap(),
        );
        Self {
            dir,
            ca,
            ca_key,
            server: (server, server_key),
        }
    }

    /// The path of one of the PEM files.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A TLS-terminating proxy to a plain HTTP server; stops when dropped.
pub struct TlsProxy {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    /// Listens on a free loopback port with the PKI's server certificate and forwards each
    /// connection to `upstream`; with `require_client_cert`, handshakes without a client
    /// certificate from the PKI's CA fail.
    pub async fn start(pki: &TestPki, upstream: SocketAddr, require_client_cert: bool) -> Self {
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
        b.set_certificate(&pki.server.0).unwrap();
        b.set_private_key(&pki.server.1).unwrap();
        b.add_extra_chain_cert(pki.ca.clone()).unwrap();
        if require_client_cert {
            b.cert_store_mut().add_cert(pki.ca.clone()).unwrap();
            b.add_client_ca(&pki.ca).unwrap();
            b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        let acceptor = b.build();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let ssl = Ssl::new(acceptor.context()).unwrap();
                tokio::spawn(async move {
                    let Ok(mut tls) = tokio_openssl::SslStream::new(ssl, tcp) else {
                        return;
                    };
                    if Pin::new(&mut tls).accept().await.is_err() {
                        return;
                    }
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
        Self { addr, task }
    }

    /// `https://127.0.0.1:PORT/db`.
    pub fn db_url(&self, db: &str) -> String {
        format!("https://127.0.0.1:{}/{db}", self.addr.port())
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A CA certificate issued by `ca` (an intermediate).
/// The extensions of a certificate that signs others (a CA or an intermediate).
fn ca_extensions(b: &mut openssl::x509::X509Builder) {
    b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
        .unwrap();
    b.append_extension(
        KeyUsage::new()
            .critical()
            .key_cert_sign()
            .crl_sign()
            .build()
            .unwrap(),
    )
    .unwrap();
}

fn intermediate(key: &PKey<Private>, ca: &X509, ca_key: &PKey<Private>) -> X509 {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "couch-replicator test intermediate CA")
        .unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let serial = BigNum::from_u32(rand::random::<u32>() >> 1).unwrap();
    b.set_serial_number(&serial.to_asn1_integer().unwrap())
        .unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(ca.subject_name()).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(2).unwrap())
        .unwrap();
    ca_extensions(&mut b);
    b.sign(ca_key, MessageDigest::sha256()).unwrap();
    b.build()
}

/// A client certificate for [`https_get`]: PEM chain, PEM key, and the key's password.
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub password: Option<String>,
}

impl TestPki {
    /// A client certificate issued by an intermediate CA under this PKI's CA, written as
    /// `inter-client.pem` (the certificate, then the intermediate) and an unencrypted
    /// `inter-client-key.pem`: a chain one intermediate deep.
    pub fn client_via_intermediate(&self) -> ClientCert {
        let inter_key = key();
        let inter = intermediate(&inter_key, &self.ca, &self.ca_key);
        let client_key = key();
        let client = cert(
            "replicator via intermediate",
            &client_key,
            Some((&inter, &inter_key)),
            true,
        );
        let mut chain = client.to_pem().unwrap();
        chain.extend(inter.to_pem().unwrap());
        std::fs::write(self.path("inter-client.pem"), chain).unwrap();
        std::fs::write(
            self.path("inter-client-key.pem"),
            client_key.private_key_to_pem_pkcs8().unwrap(),
        )
        .unwrap();
        ClientCert {
            cert: self.path("inter-client.pem"),
            key: self.path("inter-client-key.pem"),
            password: None,
        }
    }

    /// The PKI's client certificate (signed by its CA).
    pub fn client_cert(&self) -> ClientCert {
        ClientCert {
            cert: self.path("client.pem"),
            key: self.path("client-key.pem"),
            password: Some(CLIENT_KEY_PASSWORD.to_owned()),
        }
    }
}

/// `GET path` over HTTPS on `127.0.0.1:port` (HTTP/1.0, so the body is not chunked),
/// trusting only `ca` and checking the server certificate names 127.0.0.1, optionally
/// presenting `client`. `Err` says where it failed: a refused handshake, or (TLS 1.3 sends
/// the server's verdict on the client certificate after the client's handshake ends) a
/// connection closed before any reply.
///
/// Panics if the exchange takes over 30 s: a hang is a failure of its own, not a refusal.
pub async fn https_get(
    ca: &Path,
    port: u16,
    client: Option<&ClientCert>,
    path: &str,
) -> Result<(u16, String), String> {
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    https_raw(ca, port, client, &req)
        .await
        .map(|(status, _, body)| (status, body))
}

/// One raw HTTP/1.0 `request` over TLS: the status, the head and the body.
pub async fn https_raw(
    ca: &Path,
    port: u16,
    client: Option<&ClientCert>,
    request: &str,
) -> Result<(u16, String, String), String> {
    let exchange = https_exchange(ca, port, client, request);
    match tokio::time::timeout(std::time::Duration::from_secs(30), exchange).await {
        Ok(r) => r,
        Err(_) => panic!("https://127.0.0.1:{port}: {request:?} hung for 30 s"),
    }
}

async fn https_exchange(
    ca: &Path,
    port: u16,
    client: Option<&ClientCert>,
    req: &str,
) -> Result<(u16, String, String), String> {
    use openssl::ssl::SslConnector;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_ca_file(ca).unwrap();
    if let Some(c) = client {
        b.set_certificate_chain_file(&c.cert).unwrap();
        let pem = std::fs::read(&c.key).unwrap();
        let key = match &c.password {
            Some(p) => PKey::private_key_from_pem_passphrase(&pem, p.as_bytes()).unwrap(),
            None => PKey::private_key_from_pem(&pem).unwrap(),
        };
        b.set_private_key(&key).unwrap();
    }
    let ssl = b
        .build()
        .configure()
        .unwrap()
        .into_ssl("127.0.0.1")
        .unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut tls = tokio_openssl::SslStream::new(ssl, tcp).unwrap();
    Pin::new(&mut tls)
        .connect()
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = Vec::new();
    tls.read_to_end(&mut reply)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP reply: {text:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, head.to_owned(), body.to_owned()))
}
