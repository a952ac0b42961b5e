//! Build script: nothing to generate. It exists so that cargo fetches and unpacks the
//! `protoc-bin-vendored` build dependency before any build script runs: etcd-client's build
//! compiles etcd's protobuf API with the protoc that scripts/protoc finds (.cargo/config.toml).

fn main() {
    // Touch the crate so the dependency is used; the path itself is found by scripts/protoc.
    let _ = protoc_bin_vendored::protoc_bin_path();
    println!("cargo:rerun-if-changed=build.rs");
}
