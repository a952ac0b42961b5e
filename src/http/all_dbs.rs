//! Whole-server replication over HTTP (our extension): `POST /_replicate` with
//! `"all_dbs": true` starts (or, with `"cancel": true`, cancels) a server job;
//! `GET /_scheduler/all_dbs` lists server jobs with their progress over all databases and
//! `GET /_scheduler/all_dbs/{id}` shows one. Copying a whole server reads `_all_dbs` and
//! writes any database, so every call is for server admins.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::auth::Caller;
use super::error::HttpResult;
use super::mask::masked;
use crate::replicator::server_job::spec::{ALL_DBS_FIELD, ServerJobId, ServerSpec, server_job_id};

/// Whether a `POST /_replicate` body asks for a whole-server replication.
pub(crate) fn is_all_dbs(body: &Value) -> bool {
    body.get(ALL_DBS_FIELD) == Some(&Value::Bool(true))
}

/// `POST /_replicate` with `"all_dbs": true`: 202 `{"ok", "id"}` once the job is added (a
/// migration can take hours, so no call waits for it); with `"cancel": true`, 200 once it and
/// its replications are removed (by `id`, or by the same specification).
pub(crate) async fn post(st: &AppState, caller: &Caller, body: Value) -> HttpResult<Response> {
    let user = caller.require_admin()?.name.clone();
    let rep = st.replicator();
    if body.get("cancel") == Some(&Value::Bool(true)) {
        let id = match body.get("id").and_then(Value::as_str) {
            Some(id) => ServerJobId::from(id),
            None => server_job_id(&ServerSpec::from_body(&body)?, user.as_deref()),
        };
        let view = rep.cancel_server_job(&id).await?;
        return Ok(Json(json!({"ok": true, "id": view.id})).into_response());
    }
    let view = rep.add_server_job(&body, user).await?;
    tracing::info!(job_id = %view.id, "server job added");
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"ok": true, "id": view.id})),
    )
        .into_response())
}

/// `GET /_scheduler/all_dbs`.
pub async fn list(State(st): State<AppState>, caller: Caller) -> HttpResult<Json<Value>> {
    caller.require_admin()?;
    let jobs = st.replicator().server_jobs().await?;
    Ok(Json(masked(
        json!({"total_rows": jobs.len(), "jobs": jobs}),
    )))
}

/// `GET /_scheduler/all_dbs/{id}`.
pub async fn get(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> HttpResult<Json<Value>> {
    caller.require_admin()?;
    let job = st.replicator().server_job(&ServerJobId::from(id)).await?;
    Ok(Json(masked(json!(job))))
}
