//! The [`Replicator`] handle's calls for whole-server jobs: add (idempotent) or replace one,
//! read one or all, cancel one with every replication it added, and hand this node's running
//! ones back to the queue at shutdown. What a server job is (spec, record, id, view) is
//! `server_job/spec.rs`.

use serde_json::Value;

use super::spec::{
    SERVER_JOBS, ServerJobId, ServerJobView, ServerRecord, ServerSpec, ServerState, group_of,
    server_job_id,
};
use crate::jobs::JobsError;
use crate::replicator::error::{ReplicatorError, ReplicatorResult};
use crate::replicator::handle::Replicator;

impl Replicator {
    /// Adds a whole-server replication (idempotent: the same spec and user give the same
    /// job, and an active one is left alone) and returns its view.
    pub async fn add_server_job(
        &self,
        body: &Value,
        user: Option<String>,
    ) -> ReplicatorResult<ServerJobView> {
        let spec = ServerSpec::from_body(body)?;
        let id = server_job_id(&spec, user.as_deref());
        self.put_server_job(&id, spec, user, true).await
    }

    /// Adds or replaces the server job `id` (a `_replicator` document's: `db|doc_id`). An
    /// active job with the same spec is left alone, and so is a finished one unless
    /// `rerun_finished` (a document read again after a restart must not copy again); one with
    /// another spec is cancelled with its replications first (an edited document asks for
    /// another copy).
    pub async fn put_server_job(
        &self,
        id: &ServerJobId,
        spec: ServerSpec,
        user: Option<String>,
        rerun_finished: bool,
    ) -> ReplicatorResult<ServerJobView> {
        match self.ctx.jobs().get_job_data(SERVER_JOBS, id.as_str()).await {
            Ok(old) => {
                let old = ServerRecord::from_data(&old)?;
                let active = matches!(old.state, ServerState::Pending | ServerState::Running);
                let same = old.spec.as_ref() == Some(&spec) && old.user == user;
                if same && (active || !rerun_finished) {
                    return Ok(ServerJobView::from_record(id, &old));
                }
                if old.spec.as_ref() != Some(&spec) {
                    self.cancel_server_job(id).await?;
                }
            }
            Err(JobsError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        let now = self.ctx.now_secs();
        let record = ServerRecord {
            spec: Some(spec),
            user,
            start_time: now,
            last_updated: now,
            ..ServerRecord::default()
        };
        let jobs = self.ctx.jobs();
        jobs.db()
            .run(|tx| {
                let record = record.clone();
                async move {
                    match jobs.remove_tx(&tx, SERVER_JOBS, id.as_str()).await {
                        Ok(()) | Err(JobsError::NotFound) => {}
                        Err(e) => return Err(e),
                    }
                    jobs.add_tx(&tx, SERVER_JOBS, id.as_str(), record.to_data(), now)
                        .await
                }
            })
            .await?;
        Ok(ServerJobView::from_record(id, &record))
    }

    /// One server job.
    pub async fn server_job(&self, id: &ServerJobId) -> ReplicatorResult<ServerJobView> {
        match self.ctx.jobs().get_job_data(SERVER_JOBS, id.as_str()).await {
            Ok(d) => Ok(ServerJobView::from_record(
                id,
                &ServerRecord::from_data(&d)?,
            )),
            Err(JobsError::NotFound) => Err(ReplicatorError::ServerJobNotFound(id.clone())),
            Err(e) => Err(e.into()),
        }
    }

    /// Every server job.
    pub async fn server_jobs(&self) -> ReplicatorResult<Vec<ServerJobView>> {
        Ok(self
            .ctx
            .jobs()
            .fold_jobs(SERVER_JOBS, Vec::new(), |mut acc, j| {
                if let Ok(r) = ServerRecord::from_data(&j.data) {
                    acc.push(ServerJobView::from_record(&ServerJobId::from(&j.id), &r));
                }
                acc
            })
            .await?)
    }

    /// Removes a server job and every replication it owns (its worker stops at its next
    /// update, when it finds its lock gone).
    pub async fn cancel_server_job(&self, id: &ServerJobId) -> ReplicatorResult<ServerJobView> {
        let view = self.server_job(id).await?;
        match self.ctx.jobs().remove(SERVER_JOBS, id.as_str()).await {
            Ok(()) | Err(JobsError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        self.cancel_server_replications(id).await?;
        Ok(view)
    }

    /// Hands the server jobs this node was running back to the queue (after a graceful
    /// stop of the tree, so this node cannot accept them again): another replication node
    /// takes them at once instead of after the activity timeout. Returns how many.
    pub(crate) async fn release_server_jobs(&self) -> ReplicatorResult<usize> {
        let mine: Vec<ServerJobId> = self
            .server_jobs()
            .await?
            .into_iter()
            .filter(|v| v.state == ServerState::Running && v.node.as_ref() == Some(self.node()))
            .map(|v| v.id)
            .collect();
        let jobs = self.ctx.jobs();
        let mut released = 0;
        for id in &mine {
            let requeued =
                jobs.db()
                    .run(|tx| async move {
                        jobs.requeue_running_tx(&tx, SERVER_JOBS, id.as_str()).await
                    })
                    .await?;
            released += usize::from(requeued);
        }
        Ok(released)
    }

    /// Cancels every replication server job `id` added.
    pub(crate) async fn cancel_server_replications(
        &self,
        id: &ServerJobId,
    ) -> ReplicatorResult<()> {
        let group = group_of(id);
        for j in self.list().await? {
            if j.database.as_deref() == Some(group.as_str()) {
                match self.cancel(&j.job_id).await {
                    Ok(_) | Err(ReplicatorError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}
