//! The `couch-replicator` command line: runs a replicator node (`serve`), one-off replications
//! (`replicate`) and steps jobs. This file only holds the clap enum and the dispatch; each
//! subcommand lives in its own file under `src/cli/`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// Apache CouchDB's replicator, re-implemented in Rust.
#[derive(Debug, Parser)]
#[command(name = "couch-replicator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a replicator node with CouchDB's HTTP API.
    Serve(cli::serve::ServeArgs),
    /// Replicate SRC into TGT (database URLs) once, or continuously.
    Replicate(cli::replicate::ReplicateArgs),
    /// Steps jobs on a node: submit a job file (and watch it), get one, list them.
    Steps(cli::steps::StepsArgs),
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
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
        Command::Steps(a) => rt.block_on(cli::steps::run(a)),
        Command::Serve(a) => {
            init_tracing();
            rt.block_on(cli::serve::run(a))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
