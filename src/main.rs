//! The `couch-replicator` command line: runs a replicator node, one-off replications and job
//! administration. Subcommands live in one clap enum so `serve` and `jobs` can be added.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Subcommand implementations, one file each under `src/cli/`.
mod cli {
    pub mod replicate;
}

/// Apache CouchDB's replicator, re-implemented in Rust.
#[derive(Debug, Parser)]
#[command(name = "couch-replicator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replicate SRC into TGT (database URLs) once, or continuously.
    Replicate(cli::replicate::ReplicateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Replicate(a) => rt.block_on(cli::replicate::run(a)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
