//! `couch-replicator verify SRC TGT` (and `--all-dbs SRC_SERVER TGT_SERVER`): checks that the
//! target holds every leaf revision of every selected source document, with a progress bar
//! on a terminal (a spinner while the total is unknown: filtered feeds), a summary or `--json` on stdout, and the exit code saying the verdict:
//! 0 complete, 1 incomplete, 2 could not verify.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::replication::verify::{self, Progress, VerifyOptions, VerifyReport};
use crate::replication::{self, Endpoint, ReplicationSpec};
use serde_json::{Value, json};

use super::replicate::FilterArgs;

/// Exit code of a target found incomplete.
const INCOMPLETE: u8 = 1;
/// Exit code of a verification that could not run (bad options, unreachable server).
const FAILED: u8 = 2;

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Source database URL (with `--all-dbs`: source server URL). Credentials in the URL.
    source: String,
    /// Target database URL (with `--all-dbs`: target server URL).
    target: String,
    /// Verify every database of the source server (its `_all_dbs`; system databases only
    /// when named with `--include`).
    #[arg(long)]
    all_dbs: bool,
    /// With `--all-dbs`: also verify this system database (repeatable).
    #[arg(long)]
    include: Vec<String>,
    /// Also compare bodies and attachment digests and encodings (`_bulk_get` on both sides).
    #[arg(long)]
    deep: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Which documents.
    #[command(flatten)]
    filters: FilterArgs,
    /// Only the winning revision of each document (as `winning_revs_only` replicates).
    #[arg(long)]
    winning_revs_only: bool,
    /// Parallel `_revs_diff` workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Changes per `_revs_diff` request.
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
}

/// Runs the subcommand; errors are printed here, so the caller only exits.
pub async fn run(a: VerifyArgs) -> ExitCode {
    let outcome = if a.all_dbs {
        run_all(&a).await
    } else {
        run_one(&a).await
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(INCOMPLETE),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(FAILED)
        }
    }
}

fn spec_for(a: &VerifyArgs, source: &str, target: &str) -> Result<ReplicationSpec, String> {
    let mut spec = ReplicationSpec::new(
        Endpoint::parse(source).map_err(|e| e.to_string())?,
        Endpoint::parse(target).map_err(|e| e.to_string())?,
    );
    spec.options.filter = a.filters.filter()?;
    spec.options.winning_revs_only = a.winning_revs_only;
    spec.options.worker_processes = a.workers.max(1);
    spec.options.worker_batch_size = a.batch_size.max(1);
    Ok(spec)
}

async fn run_one(a: &VerifyArgs) -> Result<bool, String> {
    let spec = spec_for(a, &a.source, &a.target)?;
    let report = with_progress(&spec, a.deep).await?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", report.summary());
    }
    Ok(report.complete)
}

/// Every database of the source server, one after the other; a database that cannot be
/// verified (say, missing on the target) makes the whole run incomplete, not a failure.
async fn run_all(a: &VerifyArgs) -> Result<bool, String> {
    let ctx = replication::Context::default();
    // The options every database shares (the name is only there to make a database URL).
    let db = |server: &str| replication::endpoint::server::db_url(server, "any");
    let base = spec_for(a, &db(&a.source), &db(&a.target))?;
    let dbs = verify::all_dbs::list(&a.source, &a.include, &ctx, &base.options)
        .await
        .map_err(|e| e.to_string())?;
    let mut complete = true;
    let mut out = Vec::with_capacity(dbs.len());
    for db in &dbs {
        let src = replication::endpoint::server::db_url(&a.source, db);
        let tgt = replication::endpoint::server::db_url(&a.target, db);
        let spec = spec_for(a, &src, &tgt)?;
        let entry = match with_progress(&spec, a.deep).await {
            Ok(r) => {
                complete &= r.complete;
                if !a.json {
                    print!("{db}: {}", r.summary());
                }
                json!({"db": db, "report": r})
            }
            Err(e) => {
                complete = false;
                if !a.json {
                    println!("{db}: cannot verify: {e}");
                }
                json!({"db": db, "error": e})
            }
        };
        out.push(entry);
    }
    if a.json {
        let all = json!({"complete": complete, "databases": Value::Array(out)});
        println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
    } else {
        println!(
            "{} databases: {}",
            dbs.len(),
            if complete { "complete" } else { "INCOMPLETE" }
        );
    }
    Ok(complete)
}

/// Verifies with a spinner on stderr (drawn only on a terminal).
async fn with_progress(spec: &ReplicationSpec, deep: bool) -> Result<VerifyReport, String> {
    let progress = Arc::new(Progress::default());
    let bar = indicatif::ProgressBar::new_spinner();
    let style = |t: &str| {
        indicatif::ProgressStyle::with_template(t)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner())
    };
    bar.set_style(style("{spinner} {prefix}: {pos} docs, {msg} [{elapsed}]"));
    bar.set_prefix(spec.source.to_string());
    let ui = {
        let (bar, progress) = (bar.clone(), progress.clone());
        tokio::spawn(async move {
            loop {
                // The source's document count, once read, turns the spinner into a bar.
                let total = progress.total.load(Ordering::Relaxed);
                if total > 0 && bar.length().is_none() {
                    bar.set_length(total);
                    bar.set_style(style(
                        "{prefix}: {wide_bar} {pos}/{len} docs, {msg} [{elapsed}, {eta}]",
                    ));
                }
                bar.set_position(progress.docs.load(Ordering::Relaxed));
                bar.set_message(format!(
                    "{} leaves, {} missing or different",
                    progress.leaves.load(Ordering::Relaxed),
                    progress.problems.load(Ordering::Relaxed)
                ));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let opts = VerifyOptions {
        deep,
        progress: Some(progress),
    };
    let out = verify::verify(spec, &replication::Context::default(), &opts).await;
    ui.abort();
    bar.finish_and_clear();
    out.map_err(|e| e.to_string())
}
