//! The etcd engine against an etcd that serves clients over TLS and requires a client
//! certificate (`--client-cert-auth`), as etcd operators run it: the store connects with the
//! CA and a client certificate whose chain goes through an intermediate CA, transactions
//! commit, and a small request is not held back by Nagle's algorithm (etcd-client's own
//! OpenSSL transport left it on: ~40 ms per request). Without a client certificate, or
//! without the CA, the connection is refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_replicator::store::etcd::{EtcdConfig, EtcdStore};
use couch_replicator::store::{Db, StoreError, Tx};

use crate::support::deadline;
use crate::support::etcd::EtcdCluster;
use crate::support::tls::TestPki;

const ROUNDS: u32 = 40;

async fn over_tls(pki: TestPki, cluster: EtcdCluster) {
    let endpoints = cluster.endpoints();
    assert!(endpoints[0].starts_with("https://"), "{endpoints:?}");
    let with = |ca: bool, cert: bool| {
        let mut config = EtcdConfig::new(endpoints.clone());
        config.ca_file = ca.then(|| pki.path("ca.pem"));
        if cert {
            config.cert_file = Some(pki.path("inter-client.pem"));
            config.key_file = Some(pki.path("inter-client-key.pem"));
        }
        config
    };
    let store = EtcdStore::connect(&with(true, true))
        .await
        .expect("connect over TLS");
    let db = Db::new(Arc::new(store));
    let started = Instant::now();
    for i in 0..ROUNDS {
        db.run(|tx: Tx| async move {
            let n = tx.get(b"n", false).await?.map_or(0, |v| v.len());
            assert_eq!(n, i as usize, "read what the last round wrote");
            tx.set(b"n", &vec![b'x'; n + 1]);
            Ok::<_, StoreError>(())
        })
        .await
        .expect("a transaction over TLS");
    }
    // Each round is a read-version request and a commit; with Nagle on, each waited ~40 ms.
    let per_round = started.elapsed() / ROUNDS;
    println!("over TLS: {per_round:?} per read-modify-write transaction");
    assert!(
        per_round < Duration::from_millis(60),
        "{per_round:?} per round: Nagle?"
    );

    let no_cert = EtcdStore::connect(&with(true, false)).await;
    assert!(no_cert.is_err(), "connected without a client certificate");
    let no_ca = EtcdStore::connect(&with(false, true)).await;
    assert!(
        no_ca.is_err(),
        "trusted a server certificate without its CA"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_etcd_with_client_certificates_serves_the_store() {
    let pki = TestPki::new();
    pki.client_via_intermediate();
    let Some(cluster) = EtcdCluster::start_tls(pki.dir().to_path_buf()).await else {
        return;
    };
    deadline(60, "the store over TLS", over_tls(pki, cluster)).await;
}
