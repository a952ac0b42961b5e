//! Replications over HTTPS to a pouchdb-server behind a TLS proxy whose certificate comes from
//! a CA made for the test: refused when verification is on and the CA is not trusted, working
//! with the CA file, working with verification off (CouchDB 3.4's default); a proxy that
//! requires a client certificate, served from `cert_file`/`key_file` with an encrypted key;
//! the same settings through `serve`'s `[replicator]` section; and a `socks5://` proxy.

use std::net::SocketAddr;
use std::process::Stdio;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::deadline;
use crate::support::server::PouchServer;
use crate::support::tls::{CLIENT_KEY_PASSWORD, TestPki, TlsProxy};
use couch_replicator::replication::http::tls::TlsOptions;
use couch_replicator::replication::{Context, Endpoint, ReplicationSpec, replicate};
use serde_json::{Value, json};

const DOCS: usize = 12;

async fn source_server() -> (PouchServer, SocketAddr) {
    let server = PouchServer::start().await;
    let c = Couch::new(&server.root());
    c.create_db("src").await;
    c.bulk_insert("src", &numbered_docs("d-", DOCS)).await;
    let up: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    (server, up)
}

/// A one-shot replication from `src` to a plain-HTTP `tgt`, failing fast (no retries).
async fn run(src: &str, tgt: &str, tls: TlsOptions) -> Result<u64, String> {
    let mut spec =
        ReplicationSpec::new(Endpoint::parse(src).unwrap(), Endpoint::parse(tgt).unwrap());
    spec.options.tls = tls;
    spec.options.retries_per_request = 0;
    spec.options.create_target = true;
    deadline(
        60,
        "a replication over TLS",
        replicate(spec, Context::default()),
    )
    .await
    .map(|s| s.docs_written)
    .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_certificates_are_verified_as_configured() {
    let (server, up) = source_server().await;
    let pki = TestPki::new();
    let proxy = TlsProxy::start(&pki, up, false).await;
    let src = proxy.db_url("src");

    let system_roots = TlsOptions {
        verify: true,
        ..TlsOptions::default()
    };
    let e = run(&src, &server.db_url("t1"), system_roots)
        .await
        .unwrap_err();
    assert!(e.contains("certificate"), "{e}");

    let with_ca = TlsOptions {
        verify: true,
        ca_file: Some(pki.path("ca.pem")),
        ..TlsOptions::default()
    };
    assert_eq!(
        run(&src, &server.db_url("t2"), with_ca).await,
        Ok(DOCS as u64)
    );

    // CouchDB 3.4's default: no verification.
    let off = TlsOptions::default();
    assert!(!off.verify);
    assert_eq!(run(&src, &server.db_url("t3"), off).await, Ok(DOCS as u64));

    // A CA file that trusts another CA: refused.
    let other = TestPki::new();
    let wrong_ca = TlsOptions {
        verify: true,
        ca_file: Some(other.path("ca.pem")),
        ..TlsOptions::default()
    };
    let e = run(&src, &server.db_url("t4"), wrong_ca).await.unwrap_err();
    assert!(e.contains("certificate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_with_an_encrypted_key() {
    let (server, up) = source_server().await;
    let pki = TestPki::new();
    let proxy = TlsProxy::start(&pki, up, true).await;
    let src = proxy.db_url("src");
    let verified = TlsOptions {
        verify: true,
        ca_file: Some(pki.path("ca.pem")),
        ..TlsOptions::default()
    };
    assert!(
        run(&src, &server.db_url("t1"), verified.clone())
            .await
            .is_err()
    );

    let with_cert = TlsOptions {
        cert_file: Some(pki.path("client.pem")),
        key_file: Some(pki.path("client-key.pem")),
        password: Some(CLIENT_KEY_PASSWORD.into()),
        ..verified
    };
    assert_eq!(
        run(&src, &server.db_url("t2"), with_cert.clone()).await,
        Ok(DOCS as u64)
    );

    let wrong_password = TlsOptions {
        password: Some("not-it".into()),
        ..with_cert
    };
    let e = run(&src, &server.db_url("t3"), wrong_password)
        .await
        .unwrap_err();
    assert!(e.contains("key_file") && !e.contains("not-it"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_applies_the_replicator_tls_keys() {
    let (server, up) = source_server().await;
    let pki = TestPki::new();
    let proxy = TlsProxy::start(&pki, up, true).await;
    let ini = pki.dir().join("local.ini");
    std::fs::write(
        &ini,
        format!(
            "[admins]\nadmin = pw\n[replicator]\nverify_ssl_certificates = true\n\
             ssl_trusted_certificates_file = {}\ncert_file = {}\nkey_file = {}\npassword = {}\n",
            pki.path("ca.pem").display(),
            pki.path("client.pem").display(),
            pki.path("client-key.pem").display(),
            CLIENT_KEY_PASSWORD,
        ),
    )
    .unwrap();
    let data = tempfile::tempdir().unwrap();
    let node =
        crate::support::serve::spawn_serve(data.path(), &ini, &[], "warn", Stdio::null()).await;
    let body = json!({"source": proxy.db_url("src"), "target": server.db_url("viaserve"),
        "create_target": true});
    let r = reqwest::Client::new()
        .post(format!("{}/_replicate", node.base))
        .basic_auth("admin", Some("pw"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["history"][0]["docs_written"], DOCS, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_proxy_carries_the_replication() {
    let (server, _) = source_server().await;
    let proxy = crate::support::socks::Socks5Proxy::start().await;
    let doc = json!({"source": server.db_url("src"), "target": server.db_url("bysocks"),
        "create_target": true, "proxy": proxy.url(), "retries_per_request": 0});
    let spec = ReplicationSpec::from_json(&doc).unwrap();
    let stats = deadline(
        60,
        "a replication through socks5",
        replicate(spec, Context::default()),
    )
    .await
    .unwrap();
    assert_eq!(stats.docs_written, DOCS as u64);
    assert!(proxy.relayed() >= 1, "the proxy relayed nothing");
}
