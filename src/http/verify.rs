//! `POST /_verify` (ours, not CouchDB's): takes `_replicate`'s body (source, target, auth,
//! `doc_ids` / `selector` / `filter` + `query_params`, `winning_revs_only`, worker options)
//! plus `"deep": true`, runs [`crate::replication::verify::verify`] and answers its report.
//! Also reads the `"verify"` option of a one-shot `_replicate` ([`requested`]); the check runs
//! once the replication completed and its report goes into the reply's `verify` field.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

use super::AppState;
use super::auth::Caller;
use super::error::{HttpError, HttpResult};
use super::mask::masked;
use super::replicate::json_body;
use crate::replication::verify::{VerifyOptions, request, verify};
use crate::replication::{Context, ReplicationError};
use crate::replicator::replicator_db::request::{ReplicateRequest, parse_replicate_body};

/// `POST /_verify`: 200 with the report (`complete` says the verdict), 400 for a bad body,
/// 404 when a database is missing, 502 when an endpoint fails otherwise.
pub async fn post_verify(
    State(st): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult<Json<Value>> {
    caller.require_user()?;
    let body = json_body(&headers, body, st.config().max_body_bytes)?;
    let deep = match body.get("deep") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(HttpError::bad_request("`deep` must be a boolean")),
    };
    let ReplicateRequest::Start(spec) = parse_replicate_body(&body)? else {
        return Err(HttpError::bad_request("`cancel` means nothing to _verify"));
    };
    let opts = VerifyOptions {
        deep,
        progress: None,
    };
    let report = verify(&spec, &Context::default(), &opts)
        .await
        .map_err(http_error)?;
    let v = serde_json::to_value(report).map_err(|e| HttpError::internal(e.to_string()))?;
    Ok(Json(masked(v)))
}

/// What a `_replicate` body's `"verify"` asks for.
pub(crate) fn requested(body: &Value) -> HttpResult<Option<VerifyOptions>> {
    match body.as_object() {
        Some(m) => request::requested(m).map_err(HttpError::bad_request),
        None => Ok(None),
    }
}

fn http_error(e: ReplicationError) -> HttpError {
    match e {
        ReplicationError::InvalidOptions(m) | ReplicationError::InvalidEndpoint(m) => {
            HttpError::bad_request(m)
        }
        e @ ReplicationError::DbNotFound(_) => HttpError::not_found(e.to_string()),
        e => HttpError::new(StatusCode::BAD_GATEWAY, "verify_failed", e.to_string()),
    }
}
