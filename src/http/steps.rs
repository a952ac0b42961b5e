//! The HTTP face of steps jobs: `POST /_steps` creates a job from a JSON [`JobSpec`],
//! `GET /_steps/{id}` shows one job with per-step status, `GET /_steps` lists jobs with their
//! state (`?state=pending|running|success|failed&limit=N&start_after=ID`).
//!
//! Every route needs a server admin (steps run commands on the nodes). Who is an admin is not
//! decided here: the caller passes an [`AdminCheck`], so the node's HTTP layer plugs in its
//! own authentication; `basic_admin`, the crate's tests' check, accepts a single Basic-auth
//! admin.
//! Failures are CouchDB-style `{"error", "reason"}` bodies; reasons come from typed errors
//! and never contain credentials.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::error::HttpError;
use super::peer::Peer;
use crate::steps::{JobSpec, ListOptions, Steps, StepsError, StepsState};

/// Most jobs one `GET /_steps` returns.
pub(crate) const MAX_LIST_LIMIT: usize = 1000;

impl From<StepsError> for HttpError {
    fn from(e: StepsError) -> Self {
        match e {
            StepsError::Spec(s) => Self::bad_request(s.to_string()),
            StepsError::NotFound(_) => Self::new(StatusCode::NOT_FOUND, "not_found", "missing"),
            other => {
                tracing::error!(error = %other, "steps HTTP request failed");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_server_error",
                    other.to_string(),
                )
            }
        }
    }
}

/// What an [`AdminCheck`] answers, later: checking may ask another server.
pub type AdminVerdict = Pin<Box<dyn Future<Output = Result<(), HttpError>> + Send>>;

/// Decides whether a request (its headers, from its peer) comes from a server admin: `Ok` lets it through,
/// an error (normally 401 or 403, 503 when the server that knows cannot be asked) is
/// returned to the client as is.
pub type AdminCheck = Arc<dyn Fn(HeaderMap, Peer) -> AdminVerdict + Send + Sync>;

/// An [`AdminCheck`] accepting HTTP Basic credentials of one admin. The password is
/// compared in time independent of where it differs.
#[cfg(any(test, feature = "internals"))]
pub fn basic_admin(name: impl Into<String>, password: impl Into<String>) -> AdminCheck {
    let (name, password) = (name.into(), password.into());
    Arc::new(move |headers: HeaderMap, _: Peer| {
        let verdict = check_basic(&headers, &name, &password);
        Box::pin(std::future::ready(verdict))
    })
}

#[cfg(any(test, feature = "internals"))]
fn check_basic(headers: &HeaderMap, name: &str, password: &str) -> Result<(), HttpError> {
    use super::auth::same;
    use crate::replication::endpoint::database::decode_basic;
    use axum::http::header::AUTHORIZATION;

    let Some(value) = headers.get(AUTHORIZATION) else {
        return Err(HttpError::unauthorized(
            "authentication required: send Basic credentials",
        ));
    };
    let Some(c) = value.to_str().ok().and_then(decode_basic) else {
        return Err(HttpError::unauthorized(
            "only Basic authentication with name:password is supported",
        ));
    };
    // Both compared in full, so timing says nothing about which one differed.
    if same(&c.username, name) & same(&c.password, password) {
        Ok(())
    } else {
        Err(HttpError::unauthorized("Name or password is incorrect."))
    }
}

/// What the steps routes need: the steps API of this node and the admin check.
#[derive(Clone)]
pub struct StepsHttp {
    /// This node's steps API.
    pub steps: Steps,
    /// Decides who may use the routes (all of them need a server admin).
    pub admin: AdminCheck,
}

impl std::fmt::Debug for StepsHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepsHttp")
            .field("steps", &self.steps)
            .finish()
    }
}

/// The `/_steps` routes, ready to be merged into the node's router.
pub fn router(state: StepsHttp) -> Router {
    Router::new()
        .route("/_steps", get(list).post(create))
        .route("/_steps/{id}", get(get_one))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn create(
    State(s): State<StepsHttp>,
    headers: HeaderMap,
    peer: Peer,
    body: Result<Json<JobSpec>, JsonRejection>,
) -> Result<Response, HttpError> {
    (s.admin)(headers, peer)
        .await
        .map_err(HttpError::with_basic_challenge)?;
    let Json(spec) = body.map_err(json_rejection)?;
    let id = s.steps.submit(spec).await?;
    Ok((StatusCode::CREATED, Json(json!({"ok": true, "id": id}))).into_response())
}

async fn get_one(
    State(s): State<StepsHttp>,
    headers: HeaderMap,
    peer: Peer,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    (s.admin)(headers, peer)
        .await
        .map_err(HttpError::with_basic_challenge)?;
    Ok(Json(s.steps.get(&id).await?).into_response())
}

/// `GET /_steps` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<StepsState>,
    limit: Option<usize>,
    start_after: Option<String>,
}

async fn list(
    State(s): State<StepsHttp>,
    headers: HeaderMap,
    peer: Peer,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    (s.admin)(headers, peer)
        .await
        .map_err(HttpError::with_basic_challenge)?;
    let Query(q) = query.map_err(|e| HttpError::bad_request(e.body_text()))?;
    let limit = q.limit.unwrap_or(ListOptions::default().limit);
    if limit == 0 || limit > MAX_LIST_LIMIT {
        return Err(HttpError::bad_request(format!(
            "limit must be between 1 and {MAX_LIST_LIMIT}"
        )));
    }
    let opts = ListOptions {
        state: q.state,
        start_after: q.start_after,
        limit,
    };
    Ok(Json(s.steps.list(opts).await?).into_response())
}

async fn method_not_allowed() -> HttpError {
    HttpError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "Only GET and POST are allowed on /_steps, and only GET on /_steps/{id}",
    )
}

fn json_rejection(e: JsonRejection) -> HttpError {
    match e {
        JsonRejection::MissingJsonContentType(_) => HttpError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "bad_content_type",
            "Content-Type must be application/json",
        ),
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "the job is larger than the request body limit",
        ),
        other => HttpError::bad_request(other.body_text()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header::AUTHORIZATION;
    use base64::Engine as _;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    fn basic(u: &str, p: &str) -> String {
        let raw = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        format!("Basic {raw}")
    }

    #[test]
    fn basic_admin_accepts_only_the_admin() {
        let check = basic_admin("adm", "s3:cret");
        let check = |h: HeaderMap| futures::executor::block_on(check(h, Peer(None)));
        assert_eq!(check(headers(Some(&basic("adm", "s3:cret")))), Ok(()));
        for bad in [
            None,
            Some(basic("adm", "s3:cre")),
            Some(basic("ad", "s3:cret")),
            Some("Bearer x".to_string()),
            Some("Basic !!".to_string()),
        ] {
            let e = check(headers(bad.as_deref())).unwrap_err();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{bad:?}");
            assert!(!e.reason.contains("s3:"), "a reason echoes the password");
        }
    }
}
