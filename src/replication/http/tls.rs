//! TLS to `https` endpoints as CouchDB's `[replicator]` section configures it:
//! `verify_ssl_certificates` (off by default, as in CouchDB 3.4), `ssl_trusted_certificates_file`
//! (a PEM bundle that then replaces the system roots), a client certificate from `cert_file` +
//! `key_file` (the key optionally encrypted with `password`), and `ssl_certificate_max_depth`
//! (accepted and range-checked; OpenSSL's own chain limit applies because native-tls has no
//! depth setting). Connectors are built once per distinct option set and shared: building one
//! reads files and sets up OpenSSL, ~150 ms of CPU, and jobs build clients at every start.

use std::fmt;
use std::path::PathBuf;

/// The TLS settings of the node's replications. `Debug` hides the key password.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TlsOptions {
    /// Check the peer's certificate chain and host name (`verify_ssl_certificates`).
    pub verify: bool,
    /// Trust only these CAs (PEM) instead of the system's (`ssl_trusted_certificates_file`).
    pub ca_file: Option<PathBuf>,
    /// `ssl_certificate_max_depth` (CouchDB: 3).
    pub max_depth: u32,
    /// Client certificate chain, PEM (`cert_file`).
    pub cert_file: Option<PathBuf>,
    /// Client private key, PEM (`key_file`).
    pub key_file: Option<PathBuf>,
    /// Password of an encrypted `key_file` (`password`).
    pub password: Option<String>,
}

impl Default for TlsOptions {
    fn default() -> Self {
        Self {
            verify: false,
            ca_file: None,
            max_depth: 3,
            cert_file: None,
            key_file: None,
            password: None,
        }
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("verify", &self.verify)
            .field("ca_file", &self.ca_file)
            .field("max_depth", &self.max_depth)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("password", &self.password.as_ref().map(|_| "*****"))
            .finish()
    }
}

impl TlsOptions {
    /// Whether a client certificate is configured (CouchDB uses one only when both files are set).
    pub fn has_client_cert(&self) -> bool {
        self.cert_file.is_some() && self.key_file.is_some()
    }
}

/// The connector for `opts`, built on first use and then shared. Errors name the file and
/// what was wrong with it, never the password.
#[cfg(feature = "tls")]
pub fn connector(opts: &TlsOptions) -> Result<native_tls::TlsConnector, String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    // Immutable derived values keyed by their whole input: sharing them across tests in one
    // process is as correct as sharing them across jobs.
    static CACHE: OnceLock<Mutex<HashMap<TlsOptions, native_tls::TlsConnector>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache.lock().ok().and_then(|m| m.get(opts).cloned()) {
        return Ok(c);
    }
    let built = build(opts)?;
    if let Ok(mut m) = cache.lock() {
        m.insert(opts.clone(), built.clone());
    }
    Ok(built)
}

#[cfg(feature = "tls")]
fn build(opts: &TlsOptions) -> Result<native_tls::TlsConnector, String> {
    let mut b = native_tls::TlsConnector::builder();
    if opts.verify {
        if let Some(ca) = &opts.ca_file {
            let pem = read(ca, "ssl_trusted_certificates_file")?;
            let certs = native_tls::Certificate::stack_from_pem(&pem).map_err(|e| {
                format!(
                    "ssl_trusted_certificates_file {}: not PEM certificates ({e})",
                    ca.display()
                )
            })?;
            if certs.is_empty() {
                return Err(format!(
                    "ssl_trusted_certificates_file {}: no certificate in the file",
                    ca.display()
                ));
            }
            b.disable_built_in_roots(true);
            for c in certs {
                b.add_root_certificate(c);
            }
        }
    } else {
        b.danger_accept_invalid_certs(true);
        b.danger_accept_invalid_hostnames(true);
    }
    if let (Some(cert), Some(key)) = (&opts.cert_file, &opts.key_file) {
        b.identity(identity(cert, key, opts.password.as_deref())?);
    }
    b.build()
        .map_err(|e| format!("cannot set up TLS for replications: {e}"))
}

#[cfg(feature = "tls")]
fn read(path: &std::path::Path, key: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {key} {}: {e}", path.display()))
}

/// A client identity from PEM files; the key may be encrypted (PKCS#1 or PKCS#8). native-tls
/// only takes unencrypted PKCS#8 PEM or PKCS#12, so the pair is repacked as PKCS#12.
#[cfg(feature = "tls")]
fn identity(
    cert: &std::path::Path,
    key: &std::path::Path,
    password: Option<&str>,
) -> Result<native_tls::Identity, String> {
    use openssl::pkcs12::Pkcs12;
    use openssl::pkey::PKey;
    use openssl::stack::Stack;
    use openssl::x509::X509;
    let chain = X509::stack_from_pem(&read(cert, "cert_file")?)
        .map_err(|e| format!("cert_file {}: not PEM certificates ({e})", cert.display()))?;
    let mut chain = chain.into_iter();
    let leaf = chain
        .next()
        .ok_or_else(|| format!("cert_file {}: no certificate in the file", cert.display()))?;
    let key_pem = read(key, "key_file")?;
    let pkey = match password {
        Some(p) => PKey::private_key_from_pem_passphrase(&key_pem, p.as_bytes()),
        None => PKey::private_key_from_pem(&key_pem),
    }
    .map_err(|_| {
        format!(
            "key_file {}: not a PEM private key, or the password does not open it",
            key.display()
        )
    })?;
    let mut cas = Stack::new().map_err(|e| e.to_string())?;
    for c in chain {
        cas.push(c).map_err(|e| e.to_string())?;
    }
    // The PKCS#12 container only lives in memory; its password just has to match below.
    const INNER: &str = "couch-replicator";
    let p12 = Pkcs12::builder()
        .name("client")
        .pkey(&pkey)
        .cert(&leaf)
        .ca(cas)
        .build2(INNER)
        .and_then(|p| p.to_der())
        .map_err(|e| format!("cert_file/key_file: cannot combine them ({e})"))?;
    native_tls::Identity::from_pkcs12(&p12, INNER)
        .map_err(|e| format!("cert_file/key_file: cannot use them ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password() {
        let o = TlsOptions {
            password: Some("k3yp4ss".into()),
            ..TlsOptions::default()
        };
        let shown = format!("{o:?}");
        assert!(!shown.contains("k3yp4ss"), "{shown}");
        assert!(!o.has_client_cert());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn missing_files_are_named() {
        let o = TlsOptions {
            verify: true,
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsOptions::default()
        };
        let e = connector(&o).unwrap_err();
        assert!(
            e.contains("ssl_trusted_certificates_file /nonexistent/ca.pem"),
            "{e}"
        );
        let o = TlsOptions {
            cert_file: Some("/nonexistent/c.pem".into()),
            key_file: Some("/nonexistent/k.pem".into()),
            password: Some("pw".into()),
            ..TlsOptions::default()
        };
        let e = connector(&o).unwrap_err();
        assert!(e.contains("cert_file") && !e.contains("pw\""), "{e}");
    }
}
