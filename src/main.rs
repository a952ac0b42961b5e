//! The `couch-replicator` command line: runs a replicator node, one-off replications and job
//! administration. Subcommands live in one clap enum so `serve` and `jobs` can be added.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Subcommands' code, one file each under `src/cli/`.
mod cli {
    pub mod steps;
}
use couch_replicator::replication::{self, Endpoint, Filter, ReplicationSpec};

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
    Replicate(ReplicateArgs),
    /// Steps jobs on a node: submit a job file (and watch it), get one, list them.
    Steps(cli::steps::StepsArgs),
}

#[derive(Debug, clap::Args)]
struct ReplicateArgs {
    /// Source database URL.
    source: String,
    /// Target database URL.
    target: String,
    /// Keep following the source's changes.
    #[arg(long)]
    continuous: bool,
    /// Create the target database first.
    #[arg(long)]
    create_target: bool,
    /// Only these document ids (comma separated).
    #[arg(long, value_delimiter = ',')]
    doc_ids: Option<Vec<String>>,
    /// A filter function `ddoc/name`.
    #[arg(long)]
    filter: Option<String>,
    /// Filter query parameters as a JSON object.
    #[arg(long)]
    query_params: Option<String>,
    /// A Mango selector as JSON.
    #[arg(long)]
    selector: Option<String>,
}

fn build_spec(a: &ReplicateArgs) -> Result<ReplicationSpec, String> {
    let mut spec = ReplicationSpec::new(
        Endpoint::parse(&a.source).map_err(|e| e.to_string())?,
        Endpoint::parse(&a.target).map_err(|e| e.to_string())?,
    );
    spec.options.continuous = a.continuous;
    spec.options.create_target = a.create_target;
    let json = |s: &str, what: &str| {
        serde_json::from_str::<serde_json::Value>(s).map_err(|e| format!("{what}: {e}"))
    };
    spec.options.filter = match (&a.doc_ids, &a.filter, &a.selector) {
        (Some(ids), None, None) => {
            let mut ids = ids.clone();
            ids.sort();
            ids.dedup();
            Filter::DocIds(ids)
        }
        (None, Some(name), None) => {
            let qp = match &a.query_params {
                Some(q) => match json(q, "--query-params")? {
                    serde_json::Value::Object(m) => m,
                    _ => return Err("--query-params must be a JSON object".into()),
                },
                None => Default::default(),
            };
            Filter::Named {
                name: name.clone(),
                query_params: qp,
            }
        }
        (None, None, Some(sel)) => Filter::Selector(json(sel, "--selector")?),
        (None, None, None) => Filter::None,
        _ => return Err("--doc-ids, --filter and --selector are mutually exclusive".into()),
    };
    Ok(spec)
}

async fn replicate(a: ReplicateArgs) -> Result<(), String> {
    let spec = build_spec(&a)?;
    let handle = replication::start(spec, replication::Context::default());
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {pos} docs written, {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    let mut progress = handle.progress();
    let ui = tokio::spawn(async move {
        while progress.changed().await.is_ok() {
            let s = progress.borrow().clone();
            bar.set_position(s.docs_written);
            bar.set_message(match s.changes_pending {
                Some(p) => format!("{p} changes pending"),
                None => "changes pending unknown".into(),
            });
        }
        bar.finish();
    });
    let stop = {
        let result = tokio::select! {
            r = handle_wait(&handle) => r,
            _ = tokio::signal::ctrl_c() => { handle.stop(); Ok(()) }
        };
        result
    };
    let out = handle.wait().await;
    ui.abort();
    stop?;
    let s = out.map_err(|e| e.to_string())?;
    eprintln!(
        "done: {} docs read, {} written, {} failures, through seq {}",
        s.docs_read, s.docs_written, s.doc_write_failures, s.through_seq
    );
    Ok(())
}

/// Waits until the replication's stats stream closes (the replication ended).
async fn handle_wait(h: &replication::ReplicationHandle) -> Result<(), String> {
    let mut p = h.progress();
    while p.changed().await.is_ok() {}
    Ok(())
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
        Command::Replicate(a) => rt.block_on(replicate(a)),
        Command::Steps(a) => rt.block_on(cli::steps::run(a)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
