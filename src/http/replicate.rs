//! `POST /_replicate` (CouchDB's couch_replicator_httpd.erl; CouchDB 4.x's couch_replicator.erl frontend): starts a transient replication as the caller, or
//! cancels one. The replication id is computed first (a user filter missing from the source
//! is a 404). Continuous: 202 `{"ok", "_local_id"}` as soon as the job is added. One-shot:
//! waits for completion, then 200 with CouchDB's checkpoint record, or the job's error.
//! `cancel: true`: by `id`/`_local_id`/`replication_id`, or by the same source/target/options;
//! answered once the job has stopped. A replication that another (persistent or transient)
//! job already runs is a 409. `"verify": true` (or `{"deep": true}`) on a one-shot run adds
//! the target's verification report as the reply's `verify` field (see `http::verify`).

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::auth::Caller;
use super::error::{HttpError, HttpResult};
use super::mask::masked;
use crate::replication::{Context, RepId, ReplicationError, ReplicationSpec, compute_id};
use crate::replicator::handle::failure;
use crate::replicator::job::id::transient_job_id;
use crate::replicator::replicator_db::request::{ReplicateRequest, UserCtx, parse_replicate_body};
use crate::replicator::{
    JobError, JobId, JobKind, JobView, NewJob, RepState, Replicator, ReplicatorError,
    ReplicatorResult, WaitFor,
};
use std::time::Duration;

/// Reads a JSON object body, turning size and syntax problems into 413 / 400.
pub(crate) fn json_body(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> HttpResult<Value> {
    require_json(headers)?;
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

/// CouchDB's rule for a body that changes state: its media type is exactly
/// `application/json` (parameters allowed), else 415 `bad_content_type`. A browser's form
/// (`text/plain`, `application/x-www-form-urlencoded`, `multipart/form-data`) can then never
/// start or cancel a replication on an administrator's behalf: those are the only types a
/// page on another site can send without a CORS preflight.
pub(crate) fn require_json(headers: &HeaderMap) -> HttpResult<()> {
    let media = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    if media == Some("application/json") {
        return Ok(());
    }
    Err(HttpError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "bad_content_type",
        "Content-Type must be application/json",
    ))
}

/// `POST /_replicate`.
pub async fn post_replicate(
    State(st): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult<Response> {
    let user = caller.require_user()?.clone();
    let mut body = json_body(&headers, body, st.config().max_body_bytes)?;
    if super::all_dbs::is_all_dbs(&body) {
        return super::all_dbs::post(&st, &caller, body).await;
    }
    match parse_replicate_body(&body)? {
        ReplicateRequest::CancelById(id) => {
            let view = find_job(st.replicator(), &id).await?;
            cancel(&st, &user, view, &id).await
        }
        ReplicateRequest::CancelBySpec(spec) => {
            let id = job_id_by_spec(&st, &user, &spec).await?;
            let view = st.replicator().get(&id).await?;
            cancel(&st, &user, view, id.as_str()).await
        }
        ReplicateRequest::Start(spec) => {
            let check = super::verify::requested(&body)?;
            // The job runs as the caller; a `user_ctx` in the body is not trusted.
            if let Some(m) = body.as_object_mut() {
                m.remove("user_ctx");
                m.remove("cancel");
            }
            // The id first, as CouchDB does: a user filter is read from the source now, and a
            // missing one is a 404 before any job exists.
            let rep_id = rep_id_of(&st, &spec).await?;
            let rep = st.replicator();
            if spec.options.continuous {
                refuse_duplicate(&st, &spec, &user, &rep_id).await?;
            }
            let limited = match user.name.as_deref() {
                Some(name) if !user.is_admin() => {
                    let limits = &st.config().user_limits;
                    limits.check_options(&spec.options)?;
                    let held = st.user_jobs().lock().await;
                    limits.check_jobs(rep, name).await?;
                    Some(held)
                }
                _ => None,
            };
            let job = rep
                .add(NewJob::from_body(
                    JobKind::Transient {
                        user: user.name.clone(),
                    },
                    body,
                ))
                .await?;
            drop(limited);
            if job.state == RepState::Paused {
                return Err(paused(&job.job_id));
            }
            // In the request's span: its request id leads from the caller to the job.
            tracing::info!(job_id = %job.job_id, rep_id = %rep_id.full(), "replication job added");
            if spec.options.continuous {
                // Answered once the job is added, even if an endpoint is unreachable (the job
                // then shows as crashing), as CouchDB answers.
                Ok((
                    StatusCode::ACCEPTED,
                    Json(json!({"ok": true, "_local_id": rep_id.full()})),
                )
                    .into_response())
            } else {
                let view = wait(
                    &st,
                    &job.job_id,
                    WaitFor::Completed,
                    st.config().completion_timeout,
                )
                .await?;
                let mut reply = completion_body(&view);
                if let (Some(opts), Value::Object(m)) = (check, &mut reply) {
                    m.insert(
                        "verify".into(),
                        crate::replication::verify::request::report_json(&spec, &opts).await,
                    );
                }
                Ok(Json(masked(reply)).into_response())
            }
        }
    }
}

/// The replication id this node computes for `spec`. A user filter that cannot be read from
/// the source is CouchDB's 404 `not_found`.
async fn rep_id_of(st: &AppState, spec: &ReplicationSpec) -> HttpResult<RepId> {
    let ctx = Context {
        server_uuid: st.replicator().server_uuid().to_owned(),
        ..Context::default()
    };
    compute_id(spec, &ctx).await.map_err(|e| match e {
        ReplicationError::InvalidOptions(m) => HttpError::bad_request(m),
        other => HttpError::not_found(other.to_string()),
    })
}

/// A replication that another job already runs is a 409 (CouchDB would leave this one
/// crashing behind the other; answering at once tells the caller).
async fn refuse_duplicate(
    st: &AppState,
    spec: &ReplicationSpec,
    user: &UserCtx,
    rep_id: &RepId,
) -> HttpResult<()> {
    let rep = st.replicator();
    let Some(owner) = rep.rep_id_owner(rep_id).await? else {
        return Ok(());
    };
    if owner == transient_job_id(spec, user.name.as_deref()) {
        return Ok(());
    }
    match rep.get(&owner).await {
        Ok(v) if !v.state.is_terminal() => {
            Err(HttpError::from(&JobError::DuplicateJob { other: owner }))
        }
        _ => Ok(()),
    }
}

/// The answer to starting a replication an operator paused: it runs once resumed.
fn paused(job_id: &JobId) -> HttpError {
    HttpError::new(
        StatusCode::CONFLICT,
        "conflict",
        format!(
            "replication job {job_id} is paused; POST /_scheduler/jobs/{job_id}/_resume runs it again"
        ),
    )
}

/// How often a waiting `_replicate` call re-reads its job.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// Waits until the job runs or completes, like [`crate::replicator::Replicator::wait`], but
/// also ends the wait when the job is `crashing` because another job owns its replication:
/// that is a 409 the caller can act on, not something to wait out.
async fn wait(
    st: &AppState,
    job_id: &JobId,
    until: WaitFor,
    timeout: Duration,
) -> HttpResult<JobView> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let view = st.replicator().get(job_id).await?;
        match (view.state, until) {
            (RepState::Failed, _) => {
                return Err(ReplicatorError::Failed(failure(&view)).into());
            }
            (RepState::Running, WaitFor::Running) | (RepState::Completed, _) => return Ok(view),
            (RepState::Crashing, _) => {
                if let Some(e @ JobError::DuplicateJob { .. }) = &view.state_info {
                    return Err(HttpError::from(e));
                }
            }
            // Held by an operator: nothing to wait for until someone resumes it.
            (RepState::Paused, _) => return Err(paused(job_id)),
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ReplicatorError::Timeout(job_id.into()).into());
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// The transient job a cancel request's source/target/options name. Job ids include the
/// user, so an admin's request also matches the jobs of every other user.
async fn job_id_by_spec(
    st: &AppState,
    user: &UserCtx,
    spec: &ReplicationSpec,
) -> HttpResult<JobId> {
    let mine = transient_job_id(spec, user.name.as_deref());
    if !user.is_admin() || st.replicator().get(&mine).await.is_ok() {
        return Ok(mine);
    }
    let jobs = st.replicator().list().await?;
    Ok(jobs
        .iter()
        .filter(|j| j.is_transient())
        .map(|j| (j, transient_job_id(spec, j.user.as_deref())))
        .find(|(j, id)| *id == j.job_id)
        .map_or(mine, |(_, id)| id))
}

/// A job named by an id from a request, which may be either kind: its job id, else the
/// replication id it runs (a transient job's id and a replication id are both 32 hex digits,
/// so the text alone cannot tell them apart).
pub(crate) async fn find_job(rep: &Replicator, id: &str) -> ReplicatorResult<JobView> {
    match rep.get(JobId::from(id)).await {
        Err(ReplicatorError::NotFound(_)) => rep.get(RepId::from_full(id)).await,
        found => found,
    }
}

async fn cancel(st: &AppState, user: &UserCtx, view: JobView, id: &str) -> HttpResult<Response> {
    let rep = st.replicator();
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
    view.rep_id
        .as_ref()
        .map_or_else(|| view.job_id.to_string(), RepId::full)
}

/// A completed one-shot job's reply, CouchDB's: `ok` followed by the job's checkpoint record
/// (the checkpoint document written by the run: `session_id`, `source_last_seq`,
/// `replication_id_version`, `history`; or, when there was nothing to do, the existing one
/// with `no_changes: true`). Jobs that kept only stats get the same shape built from them.
fn completion_body(view: &JobView) -> Value {
    if let Value::Object(record) = &view.checkpoint_history {
        let mut reply = serde_json::Map::new();
        reply.insert("ok".into(), Value::Bool(true));
        reply.extend(record.iter().map(|(k, v)| (k.clone(), v.clone())));
        return Value::Object(reply);
    }
    let entries: Vec<Value> = match &view.checkpoint_history {
        Value::Array(a) => a.clone(),
        _ => Vec::new(),
    };
    let session_id = uuid::Uuid::new_v4().simple().to_string();
    let history: Vec<Value> = entries
        .iter()
        .map(|e| history_entry(e, &session_id))
        .collect();
    let source_last_seq = history
        .first()
        .map_or(Value::Null, |h| h["recorded_seq"].clone());
    json!({
        "ok": true,
        "session_id": session_id,
        "source_last_seq": source_last_seq,
        "replication_id_version": 4,
        "history": history,
    })
}

fn history_entry(stats: &Value, session_id: &str) -> Value {
    let n = |k: &str| stats.get(k).and_then(Value::as_u64).unwrap_or(0);
    let time = |k: &str| {
        let secs = n(k);
        httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
    };
    let seq = |k: &str| stats.get(k).cloned().unwrap_or(Value::Null);
    json!({
        "session_id": session_id,
        "start_time": time("started_on"),
        "end_time": time("updated_on"),
        "start_last_seq": seq("checkpointed_source_seq"),
        "end_last_seq": seq("through_seq"),
        "recorded_seq": seq("through_seq"),
        "missing_checked": n("revisions_checked"),
        "missing_found": n("missing_revisions_found"),
        "docs_read": n("docs_read"),
        "docs_written": n("docs_written"),
        "doc_write_failures": n("doc_write_failures"),
        "bulk_get_attempts": n("bulk_get_attempts"),
        "bulk_get_docs": n("bulk_get_docs"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_reply_uses_couchdb_names() {
        let stats = json!({"docs_read": 3, "docs_written": 3, "revisions_checked": 4,
            "missing_revisions_found": 3, "through_seq": "3-x", "checkpointed_source_seq": 0,
            "started_on": 0, "updated_on": 1});
        let data: crate::jobs::JobData = serde_json::from_value(json!({
            "state": "completed", "rep_id": "abc+create_target",
            "checkpoint_history": [stats]}))
        .unwrap();
        let view = JobView::from_data(&"j".into(), &data).unwrap();
        let body = completion_body(&view);
        assert_eq!(body["ok"], true);
        assert_eq!(body["source_last_seq"], "3-x");
        assert!(
            body.get("replication_id").is_none(),
            "CouchDB does not send it"
        );
        let h = &body["history"][0];
        assert_eq!(h["missing_checked"], 4);
        assert_eq!(h["missing_found"], 3);
        assert_eq!(h["docs_written"], 3);
        assert_eq!(h["start_time"], "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(h["session_id"], body["session_id"]);
    }

    #[test]
    fn completion_reply_is_ok_then_the_checkpoint_record() {
        let data: crate::jobs::JobData = serde_json::from_value(json!({
            "state": "completed", "rep_id": "abc",
            "checkpoint_history": {"no_changes": true, "session_id": "s", "history": []}}))
        .unwrap();
        let body = completion_body(&JobView::from_data(&"j".into(), &data).unwrap());
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["ok", "no_changes", "session_id", "history"]);
    }
}
