//! CouchDB's `[ssl]` section: whether `serve` also listens for HTTPS, and how. As in CouchDB
//! 3.4, `enable = true` (or the legacy `[daemons] httpsd = {chttpd, start_link, [https]}`)
//! adds an HTTPS listener on `[ssl] port` (default 6984) at `[chttpd] bind_address`, beside
//! the plain HTTP one on `[chttpd] port`. Applied keys: `cert_file`, `key_file`, `password`,
//! `cacert_file`, `verify_ssl_certificates`, `fail_if_no_peer_cert`,
//! `ssl_certificate_max_depth` (default 1), `tls_versions` (Erlang list such as
//! `['tlsv1.2', 'tlsv1.3']`) and `ciphers` (OpenSSL names). CouchDB's other `[ssl]` keys
//! (`secure_renegotiate`, `signature_algs`, `ecc_curves`, `verify_fun`) are Erlang-specific
//! and reported once at start as not used. Certificates and keys are loaded here, so a
//! missing file or a wrong key password stops `serve` at start with a clear message.

use std::net::{IpAddr, SocketAddr};

use super::config_file::ConfigFile;

/// The `[ssl]` keys this node applies.
pub const SSL_KEYS: &[&str] = &[
    "enable",
    "port",
    "cert_file",
    "key_file",
    "password",
    "cacert_file",
    "verify_ssl_certificates",
    "fail_if_no_peer_cert",
    "ssl_certificate_max_depth",
    "tls_versions",
    "ciphers",
];

/// CouchDB's legacy way of turning HTTPS on.
const LEGACY_HTTPSD: &str = "{chttpd, start_link, [https]}";

/// The HTTPS listener to run: where, and with what TLS settings (already loaded).
#[derive(Debug, Clone)]
pub struct Https {
    pub addr: SocketAddr,
    #[cfg(feature = "tls")]
    tls: crate::http::tls::ServerTls,
}

/// A CouchDB boolean: exactly `true` or `false` (CouchDB refuses anything else).
fn boolean(cfg: &ConfigFile, key: &str) -> Result<bool, String> {
    match cfg.get("ssl", key).map(str::trim) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(format!("[ssl] {key} must be true or false")),
    }
}

/// Whether HTTPS is on.
fn enabled(cfg: &ConfigFile) -> Result<bool, String> {
    let legacy = cfg
        .get("daemons", "httpsd")
        .is_some_and(|v| v.trim() == LEGACY_HTTPSD);
    Ok(boolean(cfg, "enable")? || legacy)
}

/// Reads `[ssl]`: `None` when HTTPS is off; otherwise the listener, with its certificates
/// loaded. `bind` is `[chttpd] bind_address`, which CouchDB's HTTPS listener shares.
pub fn read(cfg: &ConfigFile, bind: IpAddr) -> Result<Option<Https>, String> {
    if !enabled(cfg)? {
        return Ok(None);
    }
    let port: u16 = cfg
        .get("ssl", "port")
        .unwrap_or("6984")
        .trim()
        .parse()
        .map_err(|_| "[ssl] port must be a port number".to_string())?;
    let addr = SocketAddr::new(bind, port);
    build(cfg, addr).map(Some)
}

#[cfg(not(feature = "tls"))]
fn build(_cfg: &ConfigFile, _addr: SocketAddr) -> Result<Https, String> {
    Err("[ssl] enable = true, but this build has no TLS (feature `tls`)".to_string())
}

#[cfg(feature = "tls")]
fn build(cfg: &ConfigFile, addr: SocketAddr) -> Result<Https, String> {
    use crate::http::tls::{ServerTls, ServerTlsOptions};
    let path = |k: &str| {
        cfg.get("ssl", k)
            .map(|v| std::path::PathBuf::from(v.trim()))
    };
    let (Some(cert_file), Some(key_file)) = (path("cert_file"), path("key_file")) else {
        return Err("[ssl] enable = true needs cert_file and key_file".to_string());
    };
    let max_depth = match cfg.get("ssl", "ssl_certificate_max_depth") {
        None => 1,
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| "[ssl] ssl_certificate_max_depth must be a whole number".to_string())?,
    };
    let opts = ServerTlsOptions {
        cert_file,
        key_file,
        password: cfg.get("ssl", "password").map(str::to_owned),
        cacert_file: path("cacert_file"),
        verify_peer: boolean(cfg, "verify_ssl_certificates")?,
        fail_if_no_peer_cert: boolean(cfg, "fail_if_no_peer_cert")?,
        max_depth,
        versions: cfg
            .get("ssl", "tls_versions")
            .map(versions)
            .transpose()?
            .unwrap_or_default(),
        ciphers: cfg
            .get("ssl", "ciphers")
            .map(ciphers)
            .transpose()?
            .unwrap_or_default(),
    };
    let tls = ServerTls::new(&opts).map_err(|e| e.to_string())?;
    Ok(Https { addr, tls })
}

#[cfg(feature = "tls")]
/// The items of an Erlang list of atoms or strings, unquoted: `['tlsv1.2', "x"]` or a bare
/// `tlsv1.2`.
fn erlang_list(v: &str) -> Vec<String> {
    let v = v.trim();
    let inner = v
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(v);
    inner
        .split(',')
        .map(|i| i.trim().trim_matches(|c| c == '\'' || c == '"').to_owned())
        .filter(|i| !i.is_empty())
        .collect()
}

/// `tls_versions`, e.g. `['tlsv1.2', 'tlsv1.3']`.
#[cfg(feature = "tls")]
fn versions(v: &str) -> Result<Vec<crate::http::tls::TlsVersion>, String> {
    use crate::http::tls::TlsVersion;
    let names = erlang_list(v);
    if names.is_empty() {
        return Err("[ssl] tls_versions names no version".to_string());
    }
    names
        .iter()
        .map(|n| {
            TlsVersion::parse(n).ok_or_else(|| {
                format!("[ssl] tls_versions: `{n}` is not one of tlsv1, tlsv1.1, tlsv1.2, tlsv1.3")
            })
        })
        .collect()
}

#[cfg(feature = "tls")]
/// `ciphers` by OpenSSL name, as a list (`["ECDHE-RSA-AES128-GCM-SHA256", ...]`) or one
/// `:`-separated string. Erlang's tuple form is not taken: it has no OpenSSL meaning.
fn ciphers(v: &str) -> Result<Vec<String>, String> {
    if v.contains('{') {
        return Err(
            "[ssl] ciphers: give OpenSSL cipher names (\"ECDHE-RSA-AES128-GCM-SHA256\"), not Erlang tuples"
                .to_string(),
        );
    }
    let names: Vec<String> = erlang_list(v)
        .iter()
        .flat_map(|i| i.split(':').map(|s| s.trim().to_owned()))
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() {
        return Err("[ssl] ciphers names no cipher".to_string());
    }
    Ok(names)
}

/// A bound HTTPS listener, ready to serve.
pub struct HttpsListener {
    #[cfg(feature = "tls")]
    inner: crate::http::tls::TlsListener,
    local: SocketAddr,
}

impl Https {
    /// Binds at `at` (the configured address, or the one first bound when the API restarts).
    #[cfg(feature = "tls")]
    pub async fn bind(
        &self,
        at: SocketAddr,
        limit: std::sync::Arc<crate::http::connection_limit::ConnectionLimit>,
    ) -> Result<HttpsListener, String> {
        let tcp = crate::http::bind_listener(at)
            .await
            .map_err(|e| format!("cannot listen for HTTPS on {at}: {e}"))?;
        let local = tcp.local_addr().map_err(|e| e.to_string())?;
        let inner = crate::http::tls::TlsListener::new(tcp, &self.tls, limit)
            .map_err(|e| format!("cannot listen for HTTPS on {at}: {e}"))?;
        Ok(HttpsListener { inner, local })
    }

    #[cfg(not(feature = "tls"))]
    pub async fn bind(
        &self,
        at: SocketAddr,
        _limit: std::sync::Arc<crate::http::connection_limit::ConnectionLimit>,
    ) -> Result<HttpsListener, String> {
        Err(format!(
            "cannot listen for HTTPS on {at}: no TLS in this build"
        ))
    }
}

impl HttpsListener {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves `router` until the server fails.
    #[cfg(feature = "tls")]
    pub async fn serve(self, router: axum::Router) -> std::io::Result<()> {
        crate::http::tls::serve_router_tls(self.inner, router, std::future::pending()).await
    }

    #[cfg(not(feature = "tls"))]
    pub async fn serve(self, _router: axum::Router) -> std::io::Result<()> {
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> ConfigFile {
        ConfigFile::parse(text).unwrap()
    }

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn off_unless_enabled() {
        assert!(read(&cfg("[ssl]\nport = 7000\n"), LOCAL).unwrap().is_none());
        assert!(
            read(&cfg("[ssl]\nenable = false\n"), LOCAL)
                .unwrap()
                .is_none()
        );
        let e = read(&cfg("[ssl]\nenable = yes\n"), LOCAL).unwrap_err();
        assert!(e.contains("enable"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn enabled_needs_the_pem_files() {
        let e = read(&cfg("[ssl]\nenable = true\n"), LOCAL).unwrap_err();
        assert!(e.contains("cert_file and key_file"), "{e}");
        let e = read(
            &cfg("[daemons]\nhttpsd = {chttpd, start_link, [https]}\n[ssl]\ncert_file = /nonexistent/c.pem\nkey_file = /nonexistent/k.pem\n"),
            LOCAL,
        )
        .unwrap_err();
        assert!(e.contains("cert_file /nonexistent/c.pem"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn erlang_lists() {
        assert_eq!(
            erlang_list("['tlsv1.2', 'tlsv1.3']"),
            vec!["tlsv1.2", "tlsv1.3"]
        );
        assert_eq!(erlang_list("tlsv1.2"), vec!["tlsv1.2"]);
        assert_eq!(
            ciphers("[\"ECDHE-ECDSA-AES128-SHA256\", \"ECDHE-ECDSA-AES128-SHA\"]").unwrap(),
            vec!["ECDHE-ECDSA-AES128-SHA256", "ECDHE-ECDSA-AES128-SHA"]
        );
        assert_eq!(ciphers("\"A:B\"").unwrap(), vec!["A", "B"]);
        assert!(ciphers("[{ecdhe_ecdsa,aes_128_cbc,sha256}]").is_err());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn versions_are_erlang_names() {
        use crate::http::tls::TlsVersion;
        assert_eq!(
            versions("['tlsv1.3', tlsv1.2]").unwrap(),
            vec![TlsVersion::Tls1_3, TlsVersion::Tls1_2]
        );
        assert!(versions("[sslv3]").unwrap_err().contains("sslv3"));
        assert!(versions("[]").is_err());
    }
}
