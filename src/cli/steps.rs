//! `couch-replicator steps ...`: submits a steps job file to a node over HTTP and watches it,
//! shows one job, or lists jobs. Talks to the node's `/_steps` routes through
//! [`super::node_client`] (which says where credentials go).

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use url::Url;

use super::node_client::{NodeClient, NodeUrl};

/// Steps jobs on a node.
#[derive(Debug, clap::Args)]
pub struct StepsArgs {
    #[command(flatten)]
    node: NodeUrl,
    #[command(subcommand)]
    command: StepsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum StepsCommand {
    /// Submit the job in FILE (JSON `{"steps": [...]}`; `-` reads standard input).
    Submit {
        file: PathBuf,
        /// Follow the job until it ends; exit status 1 if it failed.
        #[arg(long)]
        watch: bool,
        /// Milliseconds between polls while watching.
        #[arg(long, default_value_t = 500, hide = true)]
        poll_ms: u64,
    },
    /// Show one job with per-step status (JSON).
    Get { id: String },
    /// List jobs with their state.
    List {
        /// Only jobs in this state: pending, running, success or failed.
        #[arg(long)]
        state: Option<String>,
        /// At most this many jobs.
        #[arg(long)]
        limit: Option<usize>,
        /// Continue after this job id (the `next` of the previous page).
        #[arg(long)]
        start_after: Option<String>,
    },
}

/// `base/_steps[/id]`, the id escaped as one path segment.
fn steps_url(node: &NodeClient, id: Option<&str>) -> Url {
    match id {
        Some(id) => node.endpoint(&["_steps", id]),
        None => node.endpoint(&["_steps"]),
    }
}

/// Runs a `steps` subcommand.
pub async fn run(args: StepsArgs) -> Result<(), String> {
    let node = NodeClient::new(&args.node.url)?;
    match args.command {
        StepsCommand::Submit {
            file,
            watch,
            poll_ms,
        } => {
            let body = if file.as_os_str() == "-" {
                let mut buf = Vec::new();
                // A one-shot CLI: blocking on standard input here holds up nothing else.
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
                    .map_err(|e| format!("reading standard input: {e}"))?;
                buf
            } else {
                tokio::fs::read(&file)
                    .await
                    .map_err(|e| format!("reading {}: {e}", file.display()))?
            };
            let created = node
                .call(Method::POST, steps_url(&node, None), Some(body))
                .await?;
            let id = created
                .get("id")
                .and_then(Value::as_str)
                .ok_or("the node's reply has no job id")?
                .to_string();
            println!("{id}");
            if watch {
                watch_job(&node, &id, Duration::from_millis(poll_ms.max(10))).await?;
            }
            Ok(())
        }
        StepsCommand::Get { id } => {
            let v = node
                .call(Method::GET, steps_url(&node, Some(&id)), None)
                .await?;
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            Ok(())
        }
        StepsCommand::List {
            state,
            limit,
            start_after,
        } => {
            let mut url = steps_url(&node, None);
            {
                let mut q = url.query_pairs_mut();
                if let Some(s) = &state {
                    q.append_pair("state", s);
                }
                if let Some(l) = limit {
                    q.append_pair("limit", &l.to_string());
                }
                if let Some(a) = &start_after {
                    q.append_pair("start_after", a);
                }
            }
            if url.query() == Some("") {
                url.set_query(None);
            }
            let v = node.call(Method::GET, url, None).await?;
            print_list(&v);
            Ok(())
        }
    }
}

fn print_list(v: &Value) {
    println!("{:<34} {:<8} {:>9}  TARGET", "ID", "STATE", "STEP");
    for j in v
        .get("jobs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| j.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
        let n = |k: &str| j.get(k).and_then(Value::as_u64).unwrap_or(0);
        let step = format!("{}/{}", n("current_step"), n("step_count"));
        println!(
            "{:<34} {:<8} {step:>9}  {}",
            s("id"),
            s("state"),
            s("current_target")
        );
    }
    if let Some(next) = v.get("next").and_then(Value::as_str) {
        println!("(more after this page: --start-after {next})");
    }
}

/// Polls the job, printing each step's changes, until it ends; `Err` when it failed.
async fn watch_job(node: &NodeClient, id: &str, every: Duration) -> Result<(), String> {
    let mut shown: Vec<String> = Vec::new();
    loop {
        let v = node
            .call(Method::GET, steps_url(node, Some(id)), None)
            .await?;
        let steps = v
            .get("steps")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (i, s) in steps.iter().enumerate() {
            let line = step_line(i, s);
            if shown.get(i) != Some(&line) {
                if shown.len() <= i {
                    shown.resize(i + 1, String::new());
                }
                // Waiting steps are not news; everything else is printed once per change.
                if s.get("status").and_then(Value::as_str) != Some("waiting") {
                    println!("{line}");
                }
                shown[i] = line;
            }
        }
        match v.get("state").and_then(Value::as_str) {
            Some("success") => {
                println!("job {id}: success");
                return Ok(());
            }
            Some("failed") => {
                println!("job {id}: failed");
                return Err(format!("job {id} failed"));
            }
            _ => tokio::time::sleep(every).await,
        }
    }
}

fn step_line(i: usize, s: &Value) -> String {
    let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let num = |k: &str| match s.get(k) {
        Some(Value::Number(n)) => n.to_string(),
        _ => "none".to_string(),
    };
    let status = text("status");
    let mut line = format!("step {i} [{}] {status}", text("target"));
    let worker = s
        .get("executor")
        .and_then(|e| e.get("worker"))
        .and_then(Value::as_str);
    match status.as_str() {
        "running" => {
            if let Some(w) = worker {
                line.push_str(&format!(" on {w}"));
            }
        }
        "succeeded" | "failed" => {
            if let Some(w) = worker {
                line.push_str(&format!(" on {w}"));
            }
            line.push_str(&format!(
                ": exit {} after {} attempt(s)",
                num("exit_status"),
                num("attempts")
            ));
            if s.get("alt_output").is_some_and(|o| !o.is_null())
                || s.get("alt_exit_status").is_some_and(|o| !o.is_null())
            {
                line.push_str(&format!(", alternative exit {}", num("alt_exit_status")));
            }
            if let Some(e) = s.get("error").and_then(Value::as_str) {
                line.push_str(&format!(" ({e})"));
            }
        }
        _ => {}
    }
    line
}
