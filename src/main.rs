//! The `couch-replicator` command line: runs a replicator node, one-off replications and job
//! administration.

use clap::Parser;

/// Apache CouchDB's replicator, re-implemented in Rust.
#[derive(Debug, Parser)]
#[command(name = "couch-replicator", version, about, long_about = None)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
