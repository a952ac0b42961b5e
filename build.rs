//! Tells the tests whether a real CouchDB is configured: with `COUCHDB_PEER_SCRIPT` set at
//! build time the compatibility tests are compiled as normal tests; without it they are
//! compiled as ignored ones, so a run without CouchDB reports them skipped instead of passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(couchdb_peer)");
    println!("cargo::rerun-if-env-changed=COUCHDB_PEER_SCRIPT");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("COUCHDB_PEER_SCRIPT").is_some() {
        println!("cargo::rustc-cfg=couchdb_peer");
    }
}
