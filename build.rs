//! Build script, for two things:
//! - tells the tests whether a real CouchDB is configured: with `COUCHDB_PEER_SCRIPT` set at
//!   build time the compatibility tests are compiled as normal tests; without it they are
//!   compiled as ignored ones, so a run without CouchDB reports them skipped, not passed;
//! - makes cargo fetch and unpack the `protoc-bin-vendored` build dependency before any build
//!   script runs: etcd-client's build compiles etcd's protobuf API with the protoc that
//!   scripts/protoc finds (.cargo/config.toml).

fn main() {
    // Touch the crate so the dependency is used; the path itself is found by scripts/protoc.
    let _ = protoc_bin_vendored::protoc_bin_path();
    println!("cargo::rustc-check-cfg=cfg(couchdb_peer)");
    println!("cargo::rerun-if-env-changed=COUCHDB_PEER_SCRIPT");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("COUCHDB_PEER_SCRIPT").is_some() {
        println!("cargo::rustc-cfg=couchdb_peer");
    }
}
