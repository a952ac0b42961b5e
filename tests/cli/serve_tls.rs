//! HTTPS on `serve`'s own listener from CouchDB's `[ssl]` section, compared with a real
//! CouchDB 3.4.3 given the same keys: both serve HTTPS on the `[ssl]` port with the test CA's
//! server certificate beside plain HTTP, and both treat clients without a certificate, with
//! one from `cacert_file`'s CA and with one from another CA the same way under each
//! `verify_ssl_certificates` / `fail_if_no_peer_cert` setting, and both keep to
//! `tls_versions` and `ssl_certificate_max_depth`. Startup errors (a missing
//! certificate, a wrong key password) stop `serve` with a message that names the file.

use std::process::Stdio;

use openssl::ssl::{SslConnector, SslMethod, SslVersion};
use std::time::Duration;

use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::serve::{ServeProcess, spawn_serve_listening};
use crate::support::tls::{ClientCert, TestPki, https_get, https_raw};

/// What one server did for each kind of client: `GET /` status, or `None` if refused.
#[derive(Debug, PartialEq, Eq)]
struct Verdicts {
    no_cert: Option<u16>,
    our_ca: Option<u16>,
    other_ca: Option<u16>,
}

async fn verdicts(pki: &TestPki, other: &TestPki, port: u16) -> Verdicts {
    let get = async |c: Option<&ClientCert>| {
        https_get(&pki.path("ca.pem"), port, c, "/")
            .await
            .map(|(status, body)| {
                assert!(body.contains("\"Welcome\""), "{body}");
                status
            })
            .ok()
    };
    Verdicts {
        no_cert: get(None).await,
        our_ca: get(Some(&pki.client_cert())).await,
        other_ca: get(Some(&other.client_cert())).await,
    }
}

/// The `[ssl]` keys of one setting, besides `enable` and `port`.
fn ssl_keys(pki: &TestPki, verify: bool, fail_if_no_peer_cert: bool) -> Vec<(String, String)> {
    let p = |n: &str| pki.path(n).to_str().unwrap().to_owned();
    vec![
        ("cert_file".into(), p("server.pem")),
        ("key_file".into(), p("server-key.pem")),
        ("cacert_file".into(), p("ca.pem")),
        ("verify_ssl_certificates".into(), verify.to_string()),
        (
            "fail_if_no_peer_cert".into(),
            fail_if_no_peer_cert.to_string(),
        ),
    ]
}

/// Our node with these `[ssl]` keys: its process, plain URL and HTTPS port.
async fn ours(dir: &std::path::Path, keys: &[(String, String)]) -> (ServeProcess, u16) {
    let mut ini = String::from("[admins]\nadmin = admin\n[ssl]\nenable = true\nport = 0\n");
    for (k, v) in keys {
        ini.push_str(&format!("{k} = {v}\n"));
    }
    let cfg = dir.join("node.ini");
    std::fs::write(&cfg, ini).unwrap();
    let (node, urls) =
        spawn_serve_listening(&dir.join("data"), &cfg, &[], "warn", Stdio::inherit(), 2).await;
    assert!(urls[0].starts_with("http://"), "{urls:?}");
    let port = urls[1]
        .strip_prefix("https://127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("second line is not https://127.0.0.1:PORT: {urls:?}"));
    (node, port)
}

/// Both servers with the same `[ssl]` keys: CouchDB (restarted with them) and a new node
/// of ours (dropped with the returned handles).
struct Pair {
    couch_port: u16,
    port: u16,
    node: ServeProcess,
    _dir: tempfile::TempDir,
}

impl Pair {
    async fn start(peer: &CouchPeer, keys: &[(String, String)]) -> Pair {
        let refs: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let couch_port = peer.enable_ssl(&refs).await;
        let dir = tempfile::tempdir().unwrap();
        let (node, port) = ours(dir.path(), keys).await;
        Pair {
            couch_port,
            port,
            node,
            _dir: dir,
        }
    }

    fn ports(&self) -> [(&'static str, u16); 2] {
        [("CouchDB", self.couch_port), ("ours", self.port)]
    }
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_and_client_certificates_like_couchdb() {
    let Some(peer) = CouchPeer::start("https_and_client_certificates_like_couchdb", None) else {
        return;
    };
    deadline(300, "HTTPS like CouchDB", async {
        let pki = TestPki::new();
        verify_modes(&peer, &pki).await;
        max_depth(&peer, &pki).await;
        tls_versions(&peer, &pki).await;
    })
    .await;
}

/// No verification, verification, verification that requires a certificate: clients with
/// none, with one from `cacert_file`'s CA and with one from another CA. A refused client
/// comes before an accepted one, so a failed handshake must leave the listener serving.
async fn verify_modes(peer: &CouchPeer, pki: &TestPki) {
    let other = TestPki::new();
    let http = reqwest::Client::new();
    // (verify_ssl_certificates, fail_if_no_peer_cert) and what CouchDB is expected to do.
    let settings = [
        ((false, false), (Some(200), Some(200), Some(200))),
        ((true, false), (Some(200), Some(200), None)),
        ((true, true), (None, Some(200), None)),
    ];
    for ((verify, fail), (no_cert, our_ca, other_ca)) in settings {
        let both = Pair::start(peer, &ssl_keys(pki, verify, fail)).await;
        let couch = verdicts(pki, &other, both.couch_port).await;
        let expected = Verdicts {
            no_cert,
            our_ca,
            other_ca,
        };
        let context = format!("verify_ssl_certificates={verify} fail_if_no_peer_cert={fail}");
        assert_eq!(couch, expected, "CouchDB with {context}");
        let mine = verdicts(pki, &other, both.port).await;
        assert_eq!(mine, couch, "ours vs CouchDB with {context}");
        if !fail {
            secure_cookies(pki, &both).await;
        }
        // Plain HTTP stays on beside HTTPS, on both.
        for base in [peer.url(), both.node.base.clone()] {
            let r = http.get(format!("{base}/_up")).send().await.unwrap();
            assert_eq!(r.status(), 200, "{base}/_up");
        }
    }
}

/// A session cookie minted over HTTPS is `Secure` on both (CouchDB marks it so on its TLS
/// port), and over plain HTTP it is not on ours.
async fn secure_cookies(pki: &TestPki, both: &Pair) {
    let body = r#"{"name":"admin","password":"admin"}"#;
    for (who, port) in both.ports() {
        let req = format!(
            "POST /_session HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (status, head, _) = https_raw(&pki.path("ca.pem"), port, None, &req)
            .await
            .unwrap();
        assert_eq!(status, 200, "{who}: {head}");
        let cookie = head
            .lines()
            .find(|l| {
                l.to_ascii_lowercase()
                    .starts_with("set-cookie: authsession=")
            })
            .unwrap_or_else(|| panic!("{who}: no session cookie in {head}"));
        assert!(cookie.contains("; Secure"), "{who}: {cookie}");
    }
    let r = reqwest::Client::new()
        .post(format!("{}/_session", both.node.base))
        .json(&serde_json::json!({"name": "admin", "password": "admin"}))
        .send()
        .await
        .unwrap();
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
}

/// A client certificate one intermediate below the CA of `cacert_file` needs
/// `ssl_certificate_max_depth` of at least 1.
async fn max_depth(peer: &CouchPeer, pki: &TestPki) {
    let via = pki.client_via_intermediate();
    for (depth, expected) in [("0", None), ("1", Some(200))] {
        let mut keys = ssl_keys(pki, true, true);
        keys.push(("ssl_certificate_max_depth".into(), depth.into()));
        let both = Pair::start(peer, &keys).await;
        for (who, port) in both.ports() {
            let got = https_get(&pki.path("ca.pem"), port, Some(&via), "/")
                .await
                .map(|(s, _)| s)
                .ok();
            assert_eq!(
                got, expected,
                "{who} with ssl_certificate_max_depth = {depth}"
            );
        }
    }
}

/// `tls_versions = ['tlsv1.3']` refuses a client that stops at TLS 1.2.
async fn tls_versions(peer: &CouchPeer, pki: &TestPki) {
    let mut keys = ssl_keys(pki, false, false);
    keys.push(("tls_versions".into(), "['tlsv1.3']".into()));
    let both = Pair::start(peer, &keys).await;
    for (who, port) in both.ports() {
        assert_eq!(
            handshakes_up_to(pki, port, SslVersion::TLS1_3).await,
            Ok(()),
            "{who}"
        );
        assert!(
            handshakes_up_to(pki, port, SslVersion::TLS1_2)
                .await
                .is_err(),
            "{who} took TLS 1.2 with tls_versions = ['tlsv1.3']"
        );
    }
}

/// Whether a TLS handshake with at most version `max` succeeds (no client certificate).
async fn handshakes_up_to(pki: &TestPki, port: u16, max: SslVersion) -> Result<(), String> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_ca_file(pki.path("ca.pem")).unwrap();
    b.set_max_proto_version(Some(max)).unwrap();
    let ssl = b
        .build()
        .configure()
        .unwrap()
        .into_ssl("127.0.0.1")
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tls = tokio_openssl::SslStream::new(ssl, tcp).unwrap();
    let hs = std::pin::Pin::new(&mut tls).connect();
    tokio::time::timeout(Duration::from_secs(30), hs)
        .await
        .expect("TLS handshake hung")
        .map_err(|e| e.to_string())
}

/// Runs `serve` with `[ssl]` keys that must stop it at start; returns its stderr.
async fn start_fails(pki: &TestPki, keys: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.ini");
    std::fs::write(
        &cfg,
        format!(
            "[ssl]\nenable = true\nport = 0\ncert_file = {}\n{keys}",
            pki.path("server.pem").display()
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&cfg)
        .args(["--port", "0"])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("serve did not stop")
        .unwrap();
    assert!(!out.status.success(), "serve started");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening on"),
        "serve listened"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ssl_files_stop_serve_at_start() {
    deadline(120, "serve refusing bad [ssl] files", async {
        let pki = TestPki::new();
        // The client key is encrypted: a wrong password, and no password, both fail clearly.
        let key = pki.path("client-key.pem");
        let err = start_fails(
            &pki,
            &format!("key_file = {}\npassword = not-the-p4ss\n", key.display()),
        )
        .await;
        assert!(
            err.contains("key_file") && err.contains("password"),
            "{err}"
        );
        assert!(!err.contains("not-the-p4ss"), "the password leaked: {err}");
        let err = start_fails(&pki, &format!("key_file = {}\n", key.display())).await;
        assert!(err.contains("key_file"), "{err}");
        // The right password for the client key, but it does not belong to server.pem.
        let err = start_fails(
            &pki,
            &format!(
                "key_file = {}\npassword = {}\n",
                key.display(),
                crate::support::tls::CLIENT_KEY_PASSWORD
            ),
        )
        .await;
        assert!(err.contains("does not belong"), "{err}");
        let missing = pki.dir().join("missing.pem");
        let err = start_fails(
            &pki,
            &format!(
                "key_file = {}\ncacert_file = {}\n",
                pki.path("server-key.pem").display(),
                missing.display()
            ),
        )
        .await;
        assert!(
            err.contains("cacert_file") && err.contains("missing.pem"),
            "{err}"
        );
    })
    .await;
}
