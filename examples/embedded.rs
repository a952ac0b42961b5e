//! A host application embedding the replicator: starts a node on an embedded store in a temp
//! directory, adds one transient replication SRC → TGT (database URLs given on the command
//! line), prints the job's events and progress, and shuts the node down gracefully.
//!
//! ```sh
//! cargo run --example embedded -- http://127.0.0.1:5001/src http://127.0.0.1:5002/tgt [--continuous]
//! ```
//! A continuous replication runs until Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use couch_replicator::{
    Db, EmbeddedStore, Endpoint, NewJob, RepState, Replicator, ReplicatorConfig, ReplicatorEvent,
    job_failure,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let continuous = args.iter().any(|a| a == "--continuous");
    let urls: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let [src, tgt] = urls.as_slice() else {
        eprintln!("usage: embedded SOURCE_URL TARGET_URL [--continuous]");
        std::process::exit(2);
    };

    // The host owns the store; the replicator only needs a `Db` on it.
    let dir = tempfile_dir()?;
    let store = EmbeddedStore::open(dir.join("jobs.redb"))?;
    let mut config = ReplicatorConfig::new(Db::new(Arc::new(store)));
    config.settings.startup_jitter = Duration::from_millis(100);
    config.settings.stats_update_interval = Duration::from_secs(1);
    let node = Replicator::start(config).await?;
    let mut events = node.subscribe().ok_or("the event bus is not running")?;

    let job = node
        .add({
            let job = NewJob::transient(
                Endpoint::parse(src.as_str())?,
                Endpoint::parse(tgt.as_str())?,
            )
            .create_target()
            .user("embedded-example");
            if continuous { job.continuous() } else { job }
        })
        .await?;
    println!("added job {} ({} -> {})", job.job_id, src, tgt);

    let outcome = loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) if ev.job_id() == Some(&job.job_id) => {
                    println!("event: {ev:?}");
                    match ev {
                        ReplicatorEvent::Finished { .. } => break Ok(()),
                        ReplicatorEvent::Failed { error, .. } => break Err(error.to_string()),
                        _ => {}
                    }
                }
                Some(_) => {}
                None => break Err("the event bus stopped".to_string()),
            },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                let view = node.get(&job.job_id).await?;
                let written = view.stats.as_ref().map_or(0, |s| s.docs_written);
                println!("state {}, docs written {written}", view.state.as_str());
                if view.state == RepState::Completed {
                    break Ok(());
                }
                if view.state == RepState::Failed {
                    break Err(job_failure(&view).to_string());
                }
            }
            _ = tokio::signal::ctrl_c() => break Ok(()),
        }
    };
    // Running jobs checkpoint and go back to pending before the node stops.
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    match outcome {
        Ok(()) => {
            println!("done");
            Ok(())
        }
        Err(reason) => Err(format!("replication failed: {reason}").into()),
    }
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("couch-replicator-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
