//! `couch-replicator replicate SRC TGT`: one replication run from the command line with an
//! `indicatif` progress bar; errors come back as one line of text for `main` to print. The
//! replication id uses this installation's server uuid (like CouchDB's `[couchdb] uuid`:
//! generated on first use and persisted), so a second run resumes from the checkpoints.

use std::path::PathBuf;

use crate::replication::{self, Endpoint, Filter, ReplicationSpec};

mod all_dbs;

#[derive(Debug, clap::Args)]
pub struct ReplicateArgs {
    /// Source database URL (a server URL with `--all-dbs`).
    source: String,
    /// Target database URL (a server URL with `--all-dbs`).
    target: String,
    /// Copy every database of the source server (see `--include`, `--exclude`).
    #[arg(long)]
    all_dbs: bool,
    /// With `--all-dbs`: database-name patterns to copy (`*`, `?`; comma separated).
    #[arg(long, value_delimiter = ',', requires = "all_dbs")]
    include: Option<Vec<String>>,
    /// With `--all-dbs`: database-name patterns to leave out.
    #[arg(long, value_delimiter = ',', requires = "all_dbs")]
    exclude: Option<Vec<String>>,
    /// With `--all-dbs --continuous`: delete a target database when its source is deleted.
    #[arg(long, requires = "all_dbs")]
    delete_target_on_source_delete: bool,
    /// Keep following the source's changes.
    #[arg(long)]
    continuous: bool,
    /// Create the target database first.
    #[arg(long)]
    create_target: bool,
    /// Which documents.
    #[command(flatten)]
    filters: FilterArgs,
    /// This replicator's server uuid (part of the replication id, so checkpoints are found
    /// again); by default generated once and kept in `$COUCH_REPLICATOR_HOME/uuid`.
    #[arg(long, env = "COUCH_REPLICATOR_UUID")]
    uuid: Option<String>,
}

fn build_spec(a: &ReplicateArgs) -> Result<ReplicationSpec, String> {
    let mut spec = ReplicationSpec::new(
        Endpoint::parse(&a.source).map_err(|e| e.to_string())?,
        Endpoint::parse(&a.target).map_err(|e| e.to_string())?,
    );
    spec.options.continuous = a.continuous;
    spec.options.create_target = a.create_target;
    spec.options.filter = a.filters.filter()?;
    Ok(spec)
}

/// The document filter options `replicate` and `verify` share.
#[derive(Debug, clap::Args)]
pub struct FilterArgs {
    /// Only these document ids (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub(crate) doc_ids: Option<Vec<String>>,
    /// A filter function `ddoc/name`.
    #[arg(long)]
    pub(crate) filter: Option<String>,
    /// Filter query parameters as a JSON object.
    #[arg(long)]
    pub(crate) query_params: Option<String>,
    /// A Mango selector as JSON.
    #[arg(long)]
    pub(crate) selector: Option<String>,
}

impl FilterArgs {
    /// The filter the options name.
    pub(crate) fn filter(&self) -> Result<Filter, String> {
        filter_of(
            &self.doc_ids,
            &self.filter,
            &self.query_params,
            &self.selector,
        )
    }
}

/// The filter the `--doc-ids`, `--filter` (+ `--query-params`) and `--selector` options name.
fn filter_of(
    doc_ids: &Option<Vec<String>>,
    filter: &Option<String>,
    query_params: &Option<String>,
    selector: &Option<String>,
) -> Result<Filter, String> {
    let json = |s: &str, what: &str| {
        serde_json::from_str::<serde_json::Value>(s).map_err(|e| format!("{what}: {e}"))
    };
    Ok(match (doc_ids, filter, selector) {
        (Some(ids), None, None) => {
            let mut ids = ids.clone();
            ids.sort();
            ids.dedup();
            Filter::DocIds(ids)
        }
        (None, Some(name), None) => {
            let qp = match query_params {
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
    })
}

pub async fn run(a: ReplicateArgs) -> Result<(), String> {
    if a.all_dbs {
        let uuid = server_uuid(a.uuid.as_deref())?;
        return all_dbs::run(a, uuid).await;
    }
    let spec = build_spec(&a)?;
    let ctx = replication::Context {
        server_uuid: server_uuid(a.uuid.as_deref())?,
        ..Default::default()
    };
    let handle = replication::start(spec, ctx);
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
        "done: replication {}: {} docs read, {} written, {} failures, through seq {}",
        s.replication_id, s.docs_read, s.docs_written, s.doc_write_failures, s.through_seq
    );
    Ok(())
}

/// Waits until the replication's stats stream closes (the replication ended).
async fn handle_wait(h: &replication::ReplicationHandle) -> Result<(), String> {
    let mut p = h.progress();
    while p.changed().await.is_ok() {}
    Ok(())
}

/// Where the persisted uuid lives: `$COUCH_REPLICATOR_HOME`, else
/// `$XDG_CONFIG_HOME/couch-replicator`, else `$HOME/.config/couch-replicator`.
fn home_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("COUCH_REPLICATOR_HOME")
        .or_else(|| var("XDG_CONFIG_HOME").map(|d| d.join("couch-replicator")))
        .or_else(|| var("HOME").map(|d| d.join(".config").join("couch-replicator")))
}

/// The server uuid: given, read from the home dir, or generated there on first use.
fn server_uuid(given: Option<&str>) -> Result<String, String> {
    if let Some(u) = given {
        return Ok(u.to_owned());
    }
    let dir = home_dir().ok_or("no home directory for the server uuid; pass --uuid")?;
    let file = dir.join("uuid");
    if let Ok(s) = std::fs::read_to_string(&file) {
        let s = s.trim();
        if !s.is_empty() {
            return Ok(s.to_owned());
        }
    }
    let uuid = uuid::Uuid::new_v4().simple().to_string();
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&file, format!("{uuid}\n")))
        .map_err(|e| format!("cannot keep the server uuid in {}: {e}", file.display()))?;
    Ok(uuid)
}
