//! The `couch-replicator` binary: the command line lives in the library
//! (`couch_replicator::cli`), so this file only calls it.

fn main() -> std::process::ExitCode {
    couch_replicator::cli::main()
}
