//! The `couch-replicator` command line: runs a replicator node (`serve`), one-off replications
//! (`replicate`), target checks (`verify`) and steps jobs. This file holds the clap enum and the
//! dispatch; each subcommand lives in its own file here. It is part of the library (private but
//! for [`main`]) so that the binary needs no internals public.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::telemetry::logging::LogFormat;

mod chttpd_auth_section;
mod config_file;
mod couchdb_auth_section;
mod jobs;
mod limits_section;
mod lockout_section;
mod node_client;
mod prometheus_section;
mod replicate;
mod replicator_section;
mod serve;
mod serve_http;
mod serve_steps;
mod serve_store;
mod ssl_section;
mod steps;
mod user_limits_section;
mod verify;

/// Apache CouchDB's replicator, re-implemented in Rust.
#[derive(Debug, Parser)]
#[command(name = "couch-replicator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as `text` or `json` (one object per line, carrying the fields of the
    /// enclosing spans, such as a replication job's `job_id` and `rep_id`).
    #[arg(
        long,
        global = true,
        env = "COUCH_REPLICATOR_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a replicator node with CouchDB's HTTP API.
    Serve(serve::ServeArgs),
    /// Replicate SRC into TGT (database URLs) once, or continuously.
    Replicate(replicate::ReplicateArgs),
    /// Steps jobs on a node: submit a job file (and watch it), get one, list them.
    Steps(steps::StepsArgs),
    /// Check that TGT holds every leaf revision of SRC (exit 0 only when it does).
    Verify(verify::VerifyArgs),
    /// Replication jobs on a node: pause one, resume it.
    Jobs(jobs::JobsArgs),
}

/// Runs the `couch-replicator` command line: parses the process arguments, starts a Tokio
/// runtime and dispatches to the subcommand. `src/main.rs` is this call and nothing else.
pub fn main() -> ExitCode {
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
        Command::Replicate(a) => rt.block_on(replicate::run(a)),
        Command::Steps(a) => rt.block_on(steps::run(a)),
        Command::Jobs(a) => rt.block_on(jobs::run(a)),
        Command::Verify(a) => return rt.block_on(verify::run(a)),
        Command::Serve(a) => {
            crate::telemetry::logging::init(cli.log_format);
            rt.block_on(serve::run(a))
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
