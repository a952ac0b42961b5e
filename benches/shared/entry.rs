//! What every benchmark program starts with: numbers from the environment (`BENCH_*`, for a
//! smaller or larger run) and a tokio runtime that runs the benchmark until it ends or Ctrl-C
//! drops it (which stops the servers it started), exiting 1 with the reason on failure.

use std::future::Future;

/// `name` from the environment as a number, `default` when unset or unreadable.
pub fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `bench` on a multi-threaded runtime; `what` names it in failure messages. With
/// `RUST_LOG` set, the crate's tracing goes to stderr (e.g. `couch_replicator=trace` shows
/// every request of the replication client with its time).
pub fn run_main<F>(what: &str, bench: F)
where
    F: Future<Output = Result<(), String>>,
{
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{what} bench: cannot start tokio: {e}");
            std::process::exit(1);
        }
    };
    let outcome = rt.block_on(async {
        tokio::select! {
            r = bench => r,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
        }
    });
    if let Err(e) = outcome {
        eprintln!("{what} bench failed: {e}");
        std::process::exit(1);
    }
}
