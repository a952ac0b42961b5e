//! `POST /_replicate` (digest B.14, C.6): starts a transient replication as the caller, or
//! cancels one. Continuous: 202 `{"ok", "_local_id"}` once the job runs. One-shot: waits for
//! completion, then 200 with the checkpoint history, or the job's error. `cancel: true`: by
//! `id`/`_local_id`/`replication_id`, or by the same source/target/options.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::auth::Caller;
use super::error::{HttpError, HttpResult};
use super::mask::masked;
use crate::replicator::rep_doc::{ReplicateRequest, UserCtx, parse_replicate_body};
use crate::replicator::rep_job::transient_job_id;
use crate::replicator::{JobKind, JobView, NewJob, WaitFor};

/// Reads a JSON object body, turning size and syntax problems into 413 / 400.
pub fn json_body(body: Result<Bytes, BytesRejection>, limit: usize) -> HttpResult<Value> {
    let bytes = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::too_large(limit)
        } else {
            HttpError::bad_request(format!("cannot read the request body: {}", r.body_text()))
        }
    })?;
    if bytes.is_empty() {
        return Err(HttpError::bad_request("the request body is empty"));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| HttpError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// `POST /_replicate`.
pub async fn post_replicate(
    State(st): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult<Response> {
    let user = caller.require_user()?.clone();
    let mut body = json_body(body, st.config().max_body_bytes)?;
    match parse_replicate_body(&body)? {
        ReplicateRequest::CancelById(id) => cancel(&st, &user, &id).await,
        ReplicateRequest::CancelBySpec(spec) => {
            let id = transient_job_id(&spec, user.name.as_deref());
            cancel(&st, &user, &id).await
        }
        ReplicateRequest::Start(spec) => {
            // The job runs as the caller; a `user_ctx` in the body is not trusted.
            if let Some(m) = body.as_object_mut() {
                m.remove("user_ctx");
                m.remove("cancel");
            }
            let rep = st.replicator();
            let job = rep
                .add(NewJob {
                    kind: JobKind::Transient {
                        user: user.name.clone(),
                    },
                    rep: body,
                })
                .await?;
            if spec.options.continuous {
                let view = rep
                    .wait(&job.job_id, WaitFor::Running, st.config().start_timeout)
                    .await?;
                Ok((
                    StatusCode::ACCEPTED,
                    Json(json!({"ok": true, "_local_id": local_id(&view)})),
                )
                    .into_response())
            } else {
                let view = rep
                    .wait(
                        &job.job_id,
                        WaitFor::Completed,
                        st.config().completion_timeout,
                    )
                    .await?;
                Ok(Json(masked(completion_body(&view))).into_response())
            }
        }
    }
}

async fn cancel(st: &AppState, user: &UserCtx, id: &str) -> HttpResult<Response> {
    let rep = st.replicator();
    let view = rep.get(id).await?;
    if !view.is_transient() {
        return Err(HttpError::forbidden(
            "a persistent replication is cancelled by deleting its _replicator document",
        ));
    }
    // Another user's job is reported as missing rather than revealed.
    if !user.is_admin() && (view.user.is_none() || view.user != user.name) {
        return Err(HttpError::not_found(format!("no replication job {id}")));
    }
    let view = rep.cancel(&view.job_id).await?;
    Ok(Json(json!({"ok": true, "_local_id": local_id(&view)})).into_response())
}

/// The id CouchDB returns as `_local_id`: the replication id once known, else the job id.
fn local_id(view: &JobView) -> String {
    view.rep_id.clone().unwrap_or_else(|| view.job_id.clone())
}

/// A completed one-shot job's reply: the checkpoint history, as CouchDB's `_replicate`.
fn completion_body(view: &JobView) -> Value {
    let mut out = match &view.checkpoint_history {
        Value::Object(m) => Value::Object(m.clone()),
        Value::Array(a) => json!({"history": a}),
        _ => json!({"history": []}),
    };
    if let Some(m) = out.as_object_mut() {
        m.insert("ok".into(), json!(true));
        m.entry("replication_id")
            .or_insert_with(|| json!(local_id(view)));
        if !view.info.is_null() {
            m.entry("stats").or_insert_with(|| view.info.clone());
        }
    }
    out
}
