//! `couch-replicator jobs pause ID` and `jobs resume ID`: hold or release a replication job
//! on a running node (`POST /_scheduler/jobs/{id}/_pause` and `_resume`; docs/operations.md,
//! "Pausing a replication"). ID is the job id or the replication id, as `_scheduler/jobs`
//! shows them. Prints `ID STATE`; the node's refusal (409 for a job that cannot pause, 404
//! for an unknown one) is the error.

use reqwest::Method;
use serde_json::Value;

use super::node_client::{NodeClient, NodeUrl};

/// Replication jobs on a node.
#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    #[command(flatten)]
    node: NodeUrl,
    #[command(subcommand)]
    command: JobsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum JobsCommand {
    /// Hold the job: it stops, keeps its checkpoint, and runs nowhere until resumed.
    Pause { id: String },
    /// Let a paused job run again.
    Resume { id: String },
}

/// Runs a `jobs` subcommand.
pub async fn run(args: JobsArgs) -> Result<(), String> {
    let node = NodeClient::new(&args.node.url)?;
    let (id, action) = match &args.command {
        JobsCommand::Pause { id } => (id, "_pause"),
        JobsCommand::Resume { id } => (id, "_resume"),
    };
    let url = node.endpoint(&["_scheduler", "jobs", id, action]);
    let answer = node.call(Method::POST, url, Some(b"{}".to_vec())).await?;
    let field = |k: &str| answer.get(k).and_then(Value::as_str).map(str::to_owned);
    println!(
        "{} {}",
        field("id").unwrap_or_else(|| id.clone()),
        field("state").unwrap_or_default()
    );
    Ok(())
}
