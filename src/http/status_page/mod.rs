//! `GET /_utils/replicator`: a small live status page for admins. The server renders the
//! first snapshot into HTML; `app.js` polls `GET /_utils/replicator/status.json` (same
//! filter and paging parameters) every second to keep it current without reloading. Assets
//! are embedded in the binary; there is no build step. Anonymous callers get a Basic
//! challenge so a browser asks for the admin's credentials.

pub(crate) mod job_cache;
pub mod model;
pub(crate) mod render;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

use super::AppState;
use super::auth::Caller;
use super::error::{HttpError, HttpResult};
use model::{PageQuery, Status};

const APP_JS: &str = include_str!("app.js");
const APP_CSS: &str = include_str!("app.css");

fn admin(caller: Result<Caller, HttpError>) -> HttpResult<()> {
    let caller = caller.map_err(HttpError::with_basic_challenge)?;
    caller
        .require_admin()
        .map(|_| ())
        .map_err(HttpError::with_basic_challenge)
}

/// `GET /_utils/replicator`.
pub async fn page(
    State(st): State<AppState>,
    caller: Result<Caller, HttpError>,
    Query(q): Query<PageQuery>,
) -> HttpResult<Html<String>> {
    admin(caller)?;
    let status = model::status(&st, &q).await?;
    Ok(Html(render::page(&status)))
}

/// `GET /_utils/replicator/status.json`.
pub async fn status(
    State(st): State<AppState>,
    caller: Result<Caller, HttpError>,
    Query(q): Query<PageQuery>,
) -> HttpResult<Response> {
    admin(caller)?;
    let status: Status = model::status(&st, &q).await?;
    Ok(([(header::CACHE_CONTROL, "no-store")], Json(status)).into_response())
}

/// `GET /_utils/replicator/app.js`.
pub async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

/// `GET /_utils/replicator/app.css`.
pub async fn app_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}
