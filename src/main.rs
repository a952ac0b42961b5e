//! The `couch-replicator` binary: the command line lives in the library
//! (`couch_replicator::cli`), so this file only calls it.

/// mimalloc instead of glibc's malloc (docs/decisions/2026-11-27-allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    couch_replicator::cli::main()
}
