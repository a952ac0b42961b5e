//! `GET /_active_tasks`: every running replication in the cluster, in CouchDB's task shape
//! ([`ActiveTask`]). Admins see all; other users only the tasks of their own transient jobs.

use axum::Json;
use axum::extract::State;
use serde_json::Value;

use super::AppState;
use super::auth::Caller;
use super::couch_json::ActiveTask;
use super::error::{HttpError, HttpResult};
use super::mask::masked;

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
        rep.active_tasks()
            .await
            .map_err(|e| HttpError::internal(e.to_string()))?
            .into_iter()
            .filter(|j| j.is_transient() && j.user.is_some() && j.user == user.name)
            .collect()
    };
    let tasks: Vec<ActiveTask> = tasks
        .iter()
        .filter_map(|j| ActiveTask::new(j, rep.node()))
        .collect();
    Ok(Json(masked(serde_json::json!(tasks))))
}
