//! `GET /_active_tasks`: the `active_task_info` of every running replication in the cluster
//! (CouchDB's couch_replicator_scheduler_job.erl task status). Admins see all; other users only the tasks of their own transient jobs.

use axum::Json;
use axum::extract::State;
use serde_json::Value;

use super::AppState;
use super::auth::Caller;
use super::error::{HttpError, HttpResult};
use super::mask::masked;
use crate::replicator::RepState;

/// `GET /_active_tasks`.
pub async fn active_tasks(State(st): State<AppState>, caller: Caller) -> HttpResult<Json<Value>> {
    let user = caller.require_user()?;
    let rep = st.replicator();
    let tasks = if caller.is_admin() {
        rep.active_tasks()
            .await
            .map_err(|e| HttpError::internal(e.to_string()))?
    } else {
        // Only running transient jobs the caller created.
        let jobs = rep
            .list()
            .await
            .map_err(|e| HttpError::internal(e.to_string()))?;
        jobs.into_iter()
            .filter(|j| j.state == RepState::Running && j.is_transient())
            .filter(|j| j.user.is_some() && j.user == user.name)
            .filter_map(|j| j.active_task)
            .collect()
    };
    Ok(Json(masked(Value::Array(tasks))))
}
