//! The doc processor's writer task: wakes when a job of this node finishes or fails (the
//! handle's events) and rescans every job now and then (a job may end on another node), then
//! writes each terminal state of a job or server job of a followed database back into its
//! document, once per update (`completed` with stats, or `failed` with the reason, through
//! `writeback.rs`), and only while the document still asks for that replication. A completed
//! document that asks for `"verify"` is verified first, apart, and written with the report.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::super::writeback::{DocStats, Terminal, write_server_state, write_state_if};
use crate::replication::http::client::HttpClient;
use crate::replication::{ReplicationSpec, verify};
use crate::replicator::job::record::RepJobRecord;
use crate::replicator::job::view::{REP_JOBS, rep_fields};
use crate::replicator::{JobView, RepState, Replicator, ReplicatorEvent};
use crate::telemetry::Series;

/// Writes terminal job states back to documents.
pub(super) struct Writer {
    rep: Arc<Replicator>,
    dbs: Vec<(String, Arc<HttpClient>)>,
    /// How often every job is rescanned.
    rescan_interval: Duration,
    /// `(job id, last_updated)` already written, so a rescan does not re-read documents.
    written: HashSet<(String, i64)>,
}

impl Writer {
    /// The writer for the followed databases `dbs` (name, client).
    pub(super) fn new(
        rep: Arc<Replicator>,
        dbs: Vec<(String, Arc<HttpClient>)>,
        rescan_interval: Duration,
    ) -> Self {
        Self {
            rep,
            dbs,
            rescan_interval,
            written: HashSet::new(),
        }
    }

    /// Runs until aborted.
    pub(super) async fn run(mut self) {
        let mut events = self.rep.subscribe();
        let mut tick = tokio::time::interval(self.rescan_interval);
        loop {
            let wake = async {
                match events.as_mut() {
                    Some(rx) => rx.recv().await.map(|e| match e {
                        ReplicatorEvent::Finished { job_id, .. }
                        | ReplicatorEvent::Failed { job_id, .. } => Some(job_id),
                        _ => None,
                    }),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = wake => match ev {
                    // A job of this node ended: write just that one.
                    Some(Some(job_id)) => {
                        if let Ok(j) = self.rep.get(&job_id).await {
                            self.write_if_ours(j).await;
                        }
                    }
                    Some(None) => {}
                    // The bus restarted: subscribe again at the next tick.
                    None => events = None,
                },
                // Jobs may end on other nodes: rescan everything now and then.
                _ = tick.tick() => {
                    if events.is_none() {
                        events = self.rep.subscribe();
                    }
                    self.scan().await;
                }
            }
        }
    }

    async fn scan(&mut self) {
        if let Ok(jobs) = self.rep.list().await {
            for j in jobs {
                self.write_if_ours(j).await;
            }
        }
        let Ok(servers) = self.rep.server_jobs().await else {
            return;
        };
        for v in servers.iter().filter(|v| v.state.is_terminal()) {
            let key = (v.id.to_string(), v.last_updated);
            let doc = self.dbs.iter().find_map(|(db, client)| {
                let doc_id = v.id.as_str().strip_prefix(db.as_str())?.strip_prefix('|')?;
                Some((client.clone(), doc_id.to_owned()))
            });
            let Some((client, doc_id)) = doc else {
                continue;
            };
            if self.written.contains(&key) {
                continue;
            }
            match write_server_state(&client, &doc_id, v).await {
                Ok(_) => {
                    self.written.insert(key);
                }
                Err(e) => {
                    tracing::warn!(job = %v.id, error = %e, "writing the server job's state failed")
                }
            }
        }
    }

    /// Writes a terminal job of one of our databases, once per (job, update).
    async fn write_if_ours(&mut self, j: JobView) {
        if !j.state.is_terminal() {
            return;
        }
        let Some((_, client)) = self
            .dbs
            .iter()
            .find(|(n, _)| j.database.as_deref() == Some(n.as_str()))
        else {
            return;
        };
        // Keyed by text: a server job and a replication job of one document share its
        // `db|doc_id`.
        let key = (j.job_id.to_string(), j.last_updated);
        if self.written.contains(&key) {
            return;
        }
        let client = client.clone();
        if self.write_job(&client, &j).await {
            self.written.insert(key);
        }
    }

    /// Writes one finished job's state; true when done (written or nothing to write).
    async fn write_job(&self, client: &Arc<HttpClient>, j: &JobView) -> bool {
        let Some(doc_id) = &j.doc_id else {
            return true;
        };
        let state = match j.state {
            RepState::Completed => Terminal::Completed(DocStats::new(
                &j.stats.clone().unwrap_or_default(),
                j.start_time,
            )),
            RepState::Failed => Terminal::Failed(crate::replicator::handle::failure(j).to_string()),
            _ => return true,
        };
        // Only if the document still asks for the replication this job ran.
        let rep = self
            .rep
            .jobs()
            .get_job_data(REP_JOBS, j.job_id.as_str())
            .await
            .ok()
            .and_then(|d| RepJobRecord::from_data(&d).ok())
            .map(|r| r.rep);
        if let (Terminal::Completed(stats), Some(rep)) = (&state, &rep)
            && let Some((spec, opts)) = verify_request(rep)
        {
            // A verification reads both databases whole: it runs apart, and writes the
            // state itself when done, so the other documents are not kept waiting.
            let (client, doc_id, rep, mut stats) =
                (client.clone(), doc_id.clone(), rep.clone(), stats.clone());
            let (metrics, job_id) = (self.rep.metrics().clone(), j.job_id.clone());
            tokio::spawn(async move {
                stats.verify = Some(verify::request::report_json(&spec, &opts).await);
                let same = |doc: &Map<String, Value>| rep == rep_fields(doc);
                match write_state_if(&client, &doc_id, Terminal::Completed(stats), same).await {
                    Ok(true) => metrics.inc(Series::DocsCompletedStateUpdates),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(job = %job_id, error = %e, "writing the verified state failed")
                    }
                }
            });
            return true;
        }
        let same = |doc: &Map<String, Value>| rep.as_ref() == Some(&rep_fields(doc));
        let written = match state {
            Terminal::Completed(_) => Series::DocsCompletedStateUpdates,
            Terminal::Failed(_) => Series::DocsFailedStateUpdates,
        };
        match write_state_if(client, doc_id, state, same).await {
            Ok(true) => {
                self.rep.metrics().inc(written);
                true
            }
            Ok(false) => true,
            Err(e) => {
                tracing::warn!(job = %j.job_id, error = %e, "writing the terminal state failed");
                false
            }
        }
    }
}

/// The verification a completed document asks for (`"verify"`), with its replication.
fn verify_request(rep: &Map<String, Value>) -> Option<(ReplicationSpec, verify::VerifyOptions)> {
    let opts = verify::request::requested(rep).ok()??;
    let spec = ReplicationSpec::from_json(&Value::Object(rep.clone())).ok()?;
    Some((spec, opts))
}
