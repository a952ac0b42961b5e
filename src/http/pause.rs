//! `POST /_scheduler/jobs/{id}/_pause` and `POST /_scheduler/jobs/{id}/_resume` (ours; CouchDB
//! has no pause): hold a job and release it ([`crate::replicator::Replicator::pause`]). The
//! job is named as `GET /_scheduler/jobs/{id}` names it (job id or replication id). A
//! transient job's owner or an admin may; another user's job is reported as missing, as
//! `_replicate`'s cancel does. The body, if any, is JSON: like every state change here, a
//! browser form on another site cannot send one (415). The answer names the job and its
//! state: `{"ok": true, "id": job id, "state": "paused"}` (or `"pending"` once resumed).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::AppState;
use super::auth::Caller;
use super::error::{HttpError, HttpResult};
use super::replicate::{find_job, require_json};
use super::scheduler::visible;
use crate::replicator::pause::Hold;

/// `POST /_scheduler/jobs/{id}/_pause`.
pub async fn pause(
    State(st): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> HttpResult<Json<Value>> {
    hold(st, caller, headers, id, Hold::Pause).await
}

/// `POST /_scheduler/jobs/{id}/_resume`.
pub async fn resume(
    State(st): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> HttpResult<Json<Value>> {
    hold(st, caller, headers, id, Hold::Resume).await
}

async fn hold(
    st: AppState,
    caller: Caller,
    headers: HeaderMap,
    id: String,
    what: Hold,
) -> HttpResult<Json<Value>> {
    caller.require_user()?;
    require_json(&headers)?;
    let id = id.replace(' ', "+");
    let rep = st.replicator();
    let job = find_job(rep, &id).await?;
    if !visible(&caller, &job) {
        return Err(HttpError::not_found(format!("no replication job {id}")));
    }
    let view = rep.hold(job.job_id.into(), what).await?;
    Ok(Json(
        json!({"ok": true, "id": view.job_id, "state": view.state.as_str()}),
    ))
}
