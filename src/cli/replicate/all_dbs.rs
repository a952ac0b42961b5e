//! `couch-replicator replicate --all-dbs SRC TGT`: a whole-server replication from the
//! command line. It starts a replicator node in this process on an in-memory store, adds one
//! server job (the same job type `serve` runs, so the same include/exclude rules and
//! per-database options apply), and draws a progress bar per running database and one for
//! the total until every database's replication ended (or Ctrl-C). Checkpoints live on the
//! servers and replication ids use the persisted server uuid, so a second run resumes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::replicator::{
    RepState, Replicator, ReplicatorConfig, ReplicatorSettings, ServerJobView, ServerState,
};
use crate::store::{Db, memory::MemoryStore};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use super::ReplicateArgs;

/// How often the progress is read back.
const REFRESH: Duration = Duration::from_millis(300);

/// The server-level body of the arguments.
fn body(a: &ReplicateArgs) -> Result<Value, String> {
    let mut b = json!({
        "all_dbs": true,
        "source": a.source,
        "target": a.target,
        "continuous": a.continuous,
        "create_target": a.create_target,
        "include": a.include.clone().unwrap_or_default(),
        "exclude": a.exclude.clone().unwrap_or_default(),
        "delete_target_on_source_delete": a.delete_target_on_source_delete,
    });
    if let Some(sel) = &a.filters.selector {
        b["selector"] = serde_json::from_str(sel).map_err(|e| format!("--selector: {e}"))?;
    }
    Ok(b)
}

pub(super) async fn run(a: ReplicateArgs, server_uuid: String) -> Result<(), String> {
    if a.filters.doc_ids.is_some() || a.filters.filter.is_some() {
        return Err("--doc-ids and --filter cannot be used with --all-dbs".into());
    }
    let settings = ReplicatorSettings {
        // One process, one user: start jobs at once rather than spreading a cluster's load.
        startup_jitter: Duration::from_millis(100),
        ..ReplicatorSettings::default()
    };
    let config = ReplicatorConfig {
        settings,
        server_uuid,
        ..ReplicatorConfig::new(Db::new(Arc::new(MemoryStore::new())))
    };
    let node = Replicator::start(config).await.map_err(|e| e.to_string())?;
    let out = tokio::select! {
        r = copy(&node, &a) => r,
        // A continuous copy runs until interrupted; a one-shot one stopped early failed.
        _ = tokio::signal::ctrl_c() => match a.continuous {
            true => last_view(&node).await,
            false => Err("interrupted".into()),
        },
    };
    node.shutdown().await;
    let v = out?;
    eprintln!(
        "done: {} databases, {} completed, {} failed, {} docs written",
        v.total, v.completed, v.failed, v.docs_written
    );
    if v.failed > 0 {
        let failed: Vec<&str> = v
            .dbs
            .iter()
            .filter(|(_, p)| p.state == RepState::Failed)
            .map(|(n, _)| n.as_str())
            .collect();
        return Err(format!("replication failed for {}", failed.join(", ")));
    }
    Ok(())
}

/// The progress of the (only) server job of this process.
async fn last_view(node: &Replicator) -> Result<ServerJobView, String> {
    let jobs = node.server_jobs().await.map_err(|e| e.to_string())?;
    jobs.into_iter()
        .next()
        .ok_or_else(|| "no server job".into())
}

/// Adds the server job and draws its progress until it completes.
async fn copy(node: &Replicator, a: &ReplicateArgs) -> Result<ServerJobView, String> {
    let job = node
        .add_server_job(&body(a)?, None)
        .await
        .map_err(|e| e.to_string())?;
    let bars = Bars::new();
    loop {
        tokio::time::sleep(REFRESH).await;
        let v = node.server_job(&job.id).await.map_err(|e| e.to_string())?;
        bars.draw(&v);
        match v.state {
            ServerState::Completed => {
                bars.total.finish();
                return Ok(v);
            }
            ServerState::Failed => return Err(v.error.unwrap_or_else(|| "failed".into())),
            _ => {}
        }
    }
}

/// The total bar and one bar per running database.
struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    dbs: std::sync::Mutex<BTreeMap<String, ProgressBar>>,
}

impl Bars {
    fn new() -> Self {
        let multi = MultiProgress::new();
        let total = multi.add(ProgressBar::new(0));
        total.set_style(style(
            "{bar:30} {pos}/{len} databases done, {msg} docs written",
        ));
        Self {
            multi,
            total,
            dbs: Default::default(),
        }
    }

    fn draw(&self, v: &ServerJobView) {
        self.total.set_length(v.total as u64);
        self.total.set_position((v.completed + v.failed) as u64);
        self.total.set_message(v.docs_written.to_string());
        let Ok(mut dbs) = self.dbs.lock() else {
            return;
        };
        for (name, p) in &v.dbs {
            let ended = matches!(p.state, RepState::Completed | RepState::Failed);
            match dbs.get(name) {
                Some(bar) if ended => {
                    bar.finish_and_clear();
                    self.multi.remove(bar);
                    dbs.remove(name);
                }
                Some(bar) => {
                    bar.set_position(p.docs_written);
                    bar.set_message(p.state.as_str());
                }
                None if !ended && p.state == RepState::Running => {
                    let bar = self.multi.add(ProgressBar::new_spinner());
                    bar.set_style(style("{spinner} {prefix}: {pos} docs written ({msg})"));
                    bar.set_prefix(name.clone());
                    dbs.insert(name.clone(), bar);
                }
                None => {}
            }
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}
