//! Starting one node: [`Replicator::start`] checks what the cluster agrees on (the store's
//! format, its timing: `cluster::agreement`), sets up couch_jobs (the `rep_jobs` activity
//! timeout and the background processes), starts the `replicator_sup` tree for the configured
//! node types, and hands the resulting [`Replicator`] handle to the tree's frontend services.

use std::sync::Arc;

use crate::jobs::Jobs;

use super::frontend::Frontend;
use super::tree;
use crate::replicator::cluster::agreement;
use crate::replicator::error::{ReplicatorError, ReplicatorResult};
use crate::replicator::handle::{Replicator, ReplicatorConfig};
use crate::replicator::job::view::REP_JOBS;
use crate::replicator::server_job::spec::SERVER_JOBS;

impl Replicator {
    /// Starts a node: sets the `rep_jobs` activity timeout, starts couch_jobs' background
    /// processes and the replicator tree.
    pub async fn start(config: ReplicatorConfig) -> ReplicatorResult<Replicator> {
        Self::start_with(config, Frontend::default()).await
    }

    /// [`Replicator::start`] plus the `api_frontend` children (doc_processor, HTTP API),
    /// started as the last children of the tree when the node types include `api_frontend`.
    pub async fn start_with(
        config: ReplicatorConfig,
        frontend: Frontend,
    ) -> ReplicatorResult<Replicator> {
        config
            .settings
            .validate()
            .map_err(ReplicatorError::Config)?;
        let prefix = config.jobs.prefix.clone();
        let jobs = Jobs::new(config.db, config.jobs);
        let mut settings = config.settings;
        agreement::settle(&jobs, &prefix, &mut settings).await?;
        let timeout = settings.job_timeout.as_secs() as i64;
        jobs.set_type_timeout(REP_JOBS, timeout).await?;
        // Whole-server jobs keep alive the same way (their worker updates every turn).
        jobs.set_type_timeout(SERVER_JOBS, timeout).await?;
        let background = jobs.start_background().await?;
        let (handle_tx, handle_rx) = tokio::sync::watch::channel(None);
        let tree::StartedTree {
            sup: tree,
            ctx,
            job_sup,
        } = tree::start(
            jobs,
            settings,
            config.node,
            config.server_uuid,
            prefix,
            frontend,
            handle_rx,
        )
        .await?;
        // The frontend services wait for this handle (a view without the background
        // processes, which only the host's handle stops).
        let _ = handle_tx.send(Some(Arc::new(Replicator {
            ctx: ctx.clone(),
            tree: tree.clone(),
            job_sup: job_sup.clone(),
            background: None,
        })));
        Ok(Replicator {
            ctx,
            tree,
            job_sup,
            background: Some(background),
        })
    }
}
