//! doc_processor (CouchDB's couch_replicator_doc_processor.erl; CouchDB 4.x's couch_replicator.erl frontend): turns the documents of configured `_replicator`
//! databases (URLs of CouchDB/PouchDB servers) into persistent jobs, and writes terminal
//! states back to them.
//!
//! One follower task per database reads its `_changes` feed (`feed=longpoll`,
//! `include_docs=true`) and, per row, as [`request::classify_change`] decides: creates or
//! updates the job `db|doc_id` through the [`Replicator`] handle, removes it when the
//! document is deleted, or writes `failed` with the reason when the document is invalid. When
//! the database disappears (404) every job of that database is removed; when it comes back,
//! it is read again from the start. A writer task (`doc_processor/writer.rs`) watches the
//! handle's events (and rescans jobs periodically, because a job may finish on another node)
//! and writes `completed` (with stats) or `failed` (with the reason) to the document, retrying
//! on conflicts; no other state is ever written (`update_docs = false`). A completed document
//! that asks for `"verify"` is verified first, apart, and written with the report.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::replication::endpoint::database::encode_query;
use crate::replication::http::budget::{DEFAULT_RESPONSE_BUDGET_BYTES, ResponseBudget};
use crate::replication::http::client::{ClientConfig, HttpClient, Req};
use crate::replication::{Aimd, Endpoint, ReplicationError};

use super::request::{self, DocAction};
use super::validate_ddoc;
// `DocStats` is named here for the crate's tests (the writer task uses it from `writeback`).
#[cfg(any(test, feature = "internals"))]
pub use super::writeback::DocStats;
pub use super::writeback::{Terminal, write_state};
use crate::replicator::job::id::persistent_job_id;
use crate::replicator::server_job::spec::{ALL_DBS_FIELD, ServerJobId, ServerSpec};
use crate::replicator::{JobKind, NewJob, RepState, Replicator, ReplicatorError};
use crate::telemetry::Series;

mod writer;
use writer::Writer;

/// The document field that pauses (`true`) or resumes (`false`) its job. Ours: CouchDB 3.4.3
/// accepts a document carrying it and runs the replication regardless.
pub const PAUSED_FIELD: &str = "paused";

/// One `_replicator` database to follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicatorDb {
    /// The name its jobs carry (`database` in `_scheduler/docs`); ends with `_replicator`.
    pub name: String,
    /// The database URL (credentials allowed; they are never shown).
    pub url: String,
}

impl ReplicatorDb {
    /// A database named after its URL's path (`http://h/a%2F_replicator` → `a/_replicator`).
    pub fn from_url(url: &str) -> Result<Self, ReplicationError> {
        let ep = Endpoint::parse(url)?;
        let path = ep.parsed_url().path().trim_start_matches('/');
        let name = percent_encoding::percent_decode_str(path)
            .decode_utf8_lossy()
            .into_owned();
        Ok(Self {
            name,
            url: url.to_owned(),
        })
    }
}

/// How the processor polls.
#[derive(Debug, Clone)]
pub struct DocProcessorConfig {
    /// The databases to follow.
    pub dbs: Vec<ReplicatorDb>,
    /// `timeout` of each longpoll `_changes` request.
    pub poll_timeout: Duration,
    /// Wait after an error or while a database is missing.
    pub retry_delay: Duration,
    /// Period of the terminal-state rescan (jobs finished on other nodes).
    pub rescan_interval: Duration,
    /// TLS to `https` replicator databases (the node's `[replicator]` TLS settings).
    pub tls: crate::replication::http::tls::TlsOptions,
}

impl Default for DocProcessorConfig {
    fn default() -> Self {
        Self {
            dbs: Vec::new(),
            poll_timeout: Duration::from_secs(10),
            retry_delay: Duration::from_secs(2),
            rescan_interval: Duration::from_secs(5),
            tls: Default::default(),
        }
    }
}

/// The running processor; dropping it aborts its tasks (a write in flight may be lost and
/// is redone by the next processor's rescan).
pub struct DocProcessor {
    /// Held to be dropped (dropping a `JoinSet` aborts its tasks); only the crate's tests
    /// stop it explicitly.
    _tasks: JoinSet<()>,
}

impl DocProcessor {
    /// Starts one follower per database and the writer.
    pub fn start(rep: Arc<Replicator>, cfg: DocProcessorConfig) -> Result<Self, ReplicationError> {
        let mut tasks = JoinSet::new();
        let mut dbs = Vec::new();
        for db in &cfg.dbs {
            let client = Arc::new(db_client(&db.url, &cfg)?);
            dbs.push((db.name.clone(), client));
        }
        for (name, client) in &dbs {
            let f = Follower {
                rep: rep.clone(),
                name: name.clone(),
                client: client.clone(),
                cfg: cfg.clone(),
            };
            tasks.spawn(f.run());
        }
        tasks.spawn(Writer::new(rep, dbs, cfg.rescan_interval).run());
        Ok(Self { _tasks: tasks })
    }

    /// Aborts every task and waits until they are gone (dropping it does not wait).
    #[cfg(any(test, feature = "internals"))]
    pub async fn stop(mut self) {
        self._tasks.abort_all();
        while self._tasks.join_next().await.is_some() {}
    }
}

fn db_client(url: &str, cfg: &DocProcessorConfig) -> Result<HttpClient, ReplicationError> {
    let ep = Endpoint::parse(url)?;
    HttpClient::new(
        ep,
        ClientConfig {
            // The longpoll answers within `poll_timeout`; leave room for a slow server.
            connection_timeout: cfg.poll_timeout * 2 + Duration::from_secs(5),
            request_timeout: None,
            retries_per_request: 3,
            http_connections: 4,
            proxy: None,
            tcp_nodelay: true,
            // The processor's own reads and writes are not replication traffic: CouchDB's
            // `requests`/`responses` count only replications' requests.
            metrics: Arc::default(),
            tls: cfg.tls.clone(),
            auth: Default::default(),
            limits: Default::default(),
            // Its own: the processor's answers are small and must not wait for the jobs'.
            budget: Arc::new(ResponseBudget::new(
                DEFAULT_RESPONSE_BUDGET_BYTES,
                Arc::default(),
            )),
        },
        Arc::new(Aimd::new()),
    )
}

/// Follows one database's `_changes`.
struct Follower {
    rep: Arc<Replicator>,
    name: String,
    client: Arc<HttpClient>,
    cfg: DocProcessorConfig,
}

impl Follower {
    async fn run(self) {
        let mut since = Value::from(0);
        let mut seen = false;
        let mut validated = false;
        let metrics = self.rep.metrics().clone();
        loop {
            match self.poll(&since).await {
                Ok(Some((rows, last_seq))) => {
                    if !seen {
                        // Found (again): it is read from the start.
                        metrics.inc(Series::DocsDbsFound);
                        metrics.inc(Series::DbScans);
                    }
                    seen = true;
                    if !validated {
                        validated = self.install_validation().await;
                    }
                    metrics.couch.add(Series::DocsDbChanges, rows.len() as u64);
                    let mut done = true;
                    for row in rows {
                        if !self.handle_row(&row).await {
                            done = false;
                            break;
                        }
                    }
                    // A row the replicator could not take is read again (with the rows after
                    // it; handling a row twice changes nothing) after the retry delay.
                    if done {
                        since = last_seq;
                        continue;
                    }
                }
                Ok(None) => {
                    // Still `seen` until every job is gone, so a failed removal is retried.
                    if seen {
                        metrics.inc(Series::DocsDbsDeleted);
                        tracing::info!(db = %self.name, "_replicator database deleted");
                        seen = !self.remove_all().await;
                    }
                    validated = false;
                    since = Value::from(0);
                }
                Err(e) => {
                    metrics.inc(Series::ChangesManagerDeaths);
                    tracing::warn!(db = %self.name, error = %e, "reading _changes failed");
                }
            }
            tokio::time::sleep(self.cfg.retry_delay).await;
        }
    }

    /// Installs the validate design document; true when there is nothing more to try (done,
    /// or refused by the server, which is logged).
    async fn install_validation(&self) -> bool {
        match validate_ddoc::install(&self.client).await {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(db = %self.name, "the validate design document was refused");
                true
            }
            Err(e) => {
                tracing::warn!(db = %self.name, error = %e, "installing the validate design document failed");
                false
            }
        }
    }

    /// One longpoll; `None` when the database does not exist.
    async fn poll(&self, since: &Value) -> Result<Option<(Vec<Value>, Value)>, ReplicationError> {
        let since = match since {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let path = format!(
            "_changes?feed=longpoll&include_docs=true&style=main_only&timeout={}&since={}",
            self.cfg.poll_timeout.as_millis(),
            encode_query(&since)
        );
        let r = self.client.send(&Req::get(path)).await?;
        match r.status {
            StatusCode::OK => {
                let v: Value = r.json("_changes")?;
                let rows = v
                    .get("results")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let last = v.get("last_seq").cloned().unwrap_or(Value::from(0));
                Ok(Some((rows, last)))
            }
            StatusCode::NOT_FOUND => Ok(None),
            s => Err(ReplicationError::BadResponse(format!(
                "{}: _changes answered {s}",
                self.client.endpoint()
            ))),
        }
    }

    /// Handles one row; false when the replicator could not take it (retry later).
    async fn handle_row(&self, row: &Value) -> bool {
        let deleted = row.get("deleted").and_then(Value::as_bool) == Some(true);
        let doc = match (row.get("doc"), row.get("id")) {
            (_, Some(id)) if deleted => json!({"_id": id, "_deleted": true}),
            (Some(d @ Value::Object(_)), _) => d.clone(),
            _ => return true,
        };
        if let Some(done) = self.server_doc(&doc).await {
            return done;
        }
        match request::classify_change(&doc) {
            DocAction::Skip | DocAction::Terminal { .. } => true,
            DocAction::Remove { doc_id } => self.remove(&doc_id).await,
            DocAction::Schedule(d) => {
                let mut body = doc.clone();
                let mut hold = None;
                if let Some(m) = body.as_object_mut() {
                    // Fields older replicators (or `update_docs`) wrote are not options.
                    m.retain(|k, _| !k.starts_with("_replication_"));
                    // Not part of the replication either: toggling it keeps the job.
                    hold = m.remove(PAUSED_FIELD).and_then(|v| v.as_bool());
                }
                let mut job = NewJob::from_body(
                    JobKind::Persistent {
                        db_name: self.name.clone(),
                        doc_id: d.doc_id.clone(),
                    },
                    body,
                );
                if hold == Some(true) {
                    job = job.paused();
                }
                match self.rep.add(job).await {
                    Ok(v) => {
                        tracing::debug!(job = %v.job_id, "replication document scheduled");
                        match hold {
                            Some(paused) => self.hold(v, paused).await,
                            None => true,
                        }
                    }
                    Err(e) => match e.bad_request_reason() {
                        Some(reason) => {
                            self.write_failed(&d.doc_id, reason).await;
                            true
                        }
                        None => {
                            tracing::warn!(db = %self.name, doc = %d.doc_id, error = %e,
                                "adding the replication job failed; will retry");
                            false
                        }
                    },
                }
            }
            DocAction::Fail { doc_id, reason, .. } => {
                // The document was edited into something invalid: its old job goes too.
                if !self.remove(&doc_id).await {
                    return false;
                }
                self.write_failed(&doc_id, reason.0).await;
                true
            }
        }
    }

    /// Pauses or resumes a document's job as its `paused` field says (present only; a job
    /// paused through the API stays paused while the document says nothing). False when
    /// the store failed (the row is read again).
    async fn hold(&self, job: crate::replicator::JobView, paused: bool) -> bool {
        let is_paused = job.state == RepState::Paused;
        if paused == is_paused || (paused && job.state.is_terminal()) {
            return true;
        }
        let done = if paused {
            self.rep.pause(job.job_id.clone()).await
        } else {
            self.rep.resume(job.job_id.clone()).await
        };
        match done {
            Ok(_) | Err(ReplicatorError::NotPausable { .. } | ReplicatorError::NotFound(_)) => true,
            Err(e) => {
                tracing::warn!(job = %job.job_id, error = %e, "could not pause or resume a document's job; will retry");
                false
            }
        }
    }

    async fn write_failed(&self, doc_id: &str, reason: String) {
        match write_state(&self.client, doc_id, Terminal::Failed(reason)).await {
            Ok(true) => self.rep.metrics().inc(Series::DocsFailedStateUpdates),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(db = %self.name, doc = %doc_id, error = %e, "writing `failed` failed")
            }
        }
    }

    /// A whole-server document (`"all_dbs": true`) becomes the server job `db|doc_id`
    /// (`Some(handled)`); `None` for any other document. Its progress is shown by
    /// `_scheduler/all_dbs`; its outcome is written back by the writer's rescan.
    async fn server_doc(&self, doc: &Value) -> Option<bool> {
        if doc.get(ALL_DBS_FIELD) != Some(&Value::Bool(true)) {
            return None;
        }
        let doc_id = doc.get("_id").and_then(Value::as_str)?;
        let id = persistent_job_id(&self.name, doc_id);
        let owner = doc.get("owner").and_then(Value::as_str).map(str::to_owned);
        let added = match ServerSpec::from_body(doc) {
            Ok(spec) => {
                self.rep
                    .put_server_job(&ServerJobId::from(id.as_str()), spec, owner, false)
                    .await
            }
            Err(e) => Err(e),
        };
        Some(match added {
            Ok(_) => true,
            Err(e) => match e.bad_request_reason() {
                Some(reason) => {
                    self.write_failed(doc_id, reason).await;
                    true
                }
                None => {
                    tracing::warn!(job = %id, error = %e, "adding the server job failed; will retry");
                    false
                }
            },
        })
    }

    /// Removes a document's job; false when the replicator could not be asked.
    async fn remove(&self, doc_id: &str) -> bool {
        let id = persistent_job_id(&self.name, doc_id);
        // The document may have asked for a whole-server copy.
        match self
            .rep
            .cancel_server_job(&ServerJobId::from(id.as_str()))
            .await
        {
            Ok(_) | Err(ReplicatorError::ServerJobNotFound(_)) => {}
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "removing the server job failed; will retry");
                return false;
            }
        }
        match self.rep.cancel(&id).await {
            Ok(_) | Err(ReplicatorError::NotFound(_)) => true,
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "removing the job failed; will retry");
                false
            }
        }
    }

    /// Removes every job of this database; false if some could not be removed yet.
    async fn remove_all(&self) -> bool {
        let Ok(jobs) = self.rep.list().await else {
            return false;
        };
        let mut all = true;
        for j in jobs
            .iter()
            .filter(|j| j.database.as_deref() == Some(self.name.as_str()))
        {
            if let Some(doc_id) = &j.doc_id {
                all &= self.remove(doc_id).await;
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_names_come_from_the_url_path() {
        let d = ReplicatorDb::from_url("http://u:p@127.0.0.1:5984/a%2F_replicator").unwrap();
        assert_eq!(d.name, "a/_replicator");
        assert_eq!(
            ReplicatorDb::from_url("http://127.0.0.1:1/_replicator")
                .unwrap()
                .name,
            "_replicator"
        );
        assert!(ReplicatorDb::from_url("http://127.0.0.1:1/").is_err());
    }
}
