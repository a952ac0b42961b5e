//! `GET /_scheduler/jobs[/{id}]` and `GET /_scheduler/docs[/{db}[/{docid}]]` (CouchDB's couch_replicator_httpd.erl,
//! CouchDB 4.x's couch_replicator_httpd.erl): paged (`limit`, `skip`) lists of jobs and of `_replicator` documents' states, with
//! `states=` filtering for docs. Admins see everything; other users see only their own
//! transient jobs (and no documents). Database names may contain `/` (`a/_replicator`).

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde_json::{Value, json};

use super::AppState;
use super::auth::Caller;
use super::couch_json::{SchedulerDoc, SchedulerJob};
use super::error::{HttpError, HttpResult};
use super::mask::masked;
use super::replicate::find_job;
use crate::replicator::server_job::spec::is_server_group;
use crate::replicator::{JobView, NodeName, RepState};

/// CouchDB's default page size of `_scheduler/jobs` and `_scheduler/docs`.
const DEFAULT_LIMIT: usize = 100;

/// `limit` and `skip` from the query string.
fn paging(q: &HashMap<String, String>) -> HttpResult<(usize, usize)> {
    let num = |k: &str, default: usize| -> HttpResult<usize> {
        match q.get(k) {
            None => Ok(default),
            Some(v) => v.parse::<usize>().map_err(|_| {
                HttpError::bad_request(format!("`{k}` must be a non-negative integer"))
            }),
        }
    };
    Ok((num("limit", DEFAULT_LIMIT)?, num("skip", 0)?))
}

pub(crate) fn visible(caller: &Caller, j: &JobView) -> bool {
    caller.is_admin()
        || (j.is_transient() && j.user.is_some() && j.user.as_deref() == caller.name())
}

/// `GET /_scheduler/jobs`: active (pending, running, crashing) and paused jobs.
pub async fn list_jobs(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<HashMap<String, String>>,
) -> HttpResult<Json<Value>> {
    caller.require_user()?;
    let (limit, skip) = paging(&q)?;
    let jobs: Vec<JobView> = st
        .replicator()
        .list()
        .await?
        .into_iter()
        .filter(|j| !j.state.is_terminal() && visible(&caller, j))
        .collect();
    let node = st.replicator().node().to_owned();
    let page: Vec<SchedulerJob> = jobs
        .iter()
        .skip(skip)
        .take(limit)
        .map(|j| SchedulerJob::new(j, &node))
        .collect();
    Ok(Json(masked(json!({
        "total_rows": jobs.len(),
        "offset": skip,
        "jobs": page,
    }))))
}

/// `GET /_scheduler/jobs/{id}` (job id or replication id; spaces are read back as `+`).
pub async fn get_job(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> HttpResult<Json<Value>> {
    caller.require_user()?;
    let id = id.replace(' ', "+");
    let job = find_job(st.replicator(), &id).await?;
    if !visible(&caller, &job) {
        return Err(HttpError::not_found(format!("no replication job {id}")));
    }
    let entry = SchedulerJob::new(&job, st.replicator().node());
    Ok(Json(masked(json!(entry))))
}

/// `states=` as a set (unknown names are a 400).
fn states(q: &HashMap<String, String>) -> HttpResult<Option<Vec<RepState>>> {
    let Some(s) = q.get("states") else {
        return Ok(None);
    };
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            RepState::parse(p.trim()).ok_or_else(|| {
                HttpError::bad_request(format!(
                    "unknown state `{p}`; states are pending, running, crashing, completed, failed, paused"
                ))
            })
        })
        .collect::<HttpResult<Vec<_>>>()
        .map(Some)
}

async fn docs_of(st: &AppState, caller: &Caller, db: Option<&str>) -> HttpResult<Vec<JobView>> {
    caller.require_user()?;
    let all = st.replicator().list().await?;
    if let Some(db) = db {
        let known = st.config().replicator_dbs.iter().any(|d| d == db)
            || all.iter().any(|j| j.database.as_deref() == Some(db));
        if !known {
            return Err(HttpError::not_found(format!(
                "database `{db}` does not exist"
            )));
        }
    }
    if !caller.is_admin() {
        return Ok(Vec::new());
    }
    Ok(all
        .into_iter()
        .filter(|j| !j.is_transient() && (db.is_none() || j.database.as_deref() == db))
        // A whole-server job's replications come from no document.
        .filter(|j| !j.database.as_deref().is_some_and(is_server_group))
        .collect())
}

fn docs_page(
    docs: Vec<JobView>,
    q: &HashMap<String, String>,
    node: &NodeName,
) -> HttpResult<Value> {
    let (limit, skip) = paging(q)?;
    let wanted = states(q)?;
    // CouchDB 3.4.3 counts every document in `total_rows`, whatever `states` keeps.
    let total_rows = docs.len();
    let docs: Vec<JobView> = docs
        .into_iter()
        .filter(|j| wanted.as_ref().is_none_or(|w| w.contains(&j.state)))
        .collect();
    let page: Vec<SchedulerDoc> = docs
        .iter()
        .skip(skip)
        .take(limit)
        .map(|j| SchedulerDoc::new(j, node))
        .collect();
    Ok(masked(json!({
        "total_rows": total_rows,
        "offset": skip,
        "docs": page,
    })))
}

/// `GET /_scheduler/docs`: the documents of every `_replicator` database.
pub async fn list_all_docs(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<HashMap<String, String>>,
) -> HttpResult<Json<Value>> {
    let docs = docs_of(&st, &caller, None).await?;
    Ok(Json(docs_page(docs, &q, st.replicator().node())?))
}

/// `GET /_scheduler/docs/{db}` and `GET /_scheduler/docs/{db}/{docid}`, where `db` ends in
/// `_replicator` and may contain slashes.
pub async fn docs_path(
    State(st): State<AppState>,
    caller: Caller,
    Path(rest): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> HttpResult<Json<Value>> {
    let rest = rest.trim_end_matches('/');
    let (db, doc_id) = split_db_path(rest)?;
    let docs = docs_of(&st, &caller, Some(db)).await?;
    match doc_id {
        None => Ok(Json(docs_page(docs, &q, st.replicator().node())?)),
        Some(id) => {
            let j = docs
                .iter()
                .find(|j| j.doc_id.as_deref() == Some(id))
                .ok_or_else(|| HttpError::not_found(format!("no replication document {id}")))?;
            Ok(Json(masked(json!(SchedulerDoc::new(
                j,
                st.replicator().node()
            )))))
        }
    }
}

/// Splits `a/b/_replicator/doc` into the database (up to the last `_replicator` segment) and
/// the document id (the rest).
pub fn split_db_path(rest: &str) -> HttpResult<(&str, Option<&str>)> {
    let mut end = None;
    let mut pos = 0;
    for seg in rest.split('/') {
        pos += seg.len();
        if seg.ends_with("_replicator") {
            end = Some(pos);
        }
        pos += 1;
    }
    let Some(end) = end else {
        return Err(HttpError::bad_request(format!(
            "`{rest}` is not a _replicator database: its name must end with `_replicator`"
        )));
    };
    let db = &rest[..end];
    let doc = rest.get(end + 1..).filter(|d| !d.is_empty());
    Ok((db, doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_paths_split_at_the_last_replicator_segment() {
        assert_eq!(split_db_path("_replicator").unwrap(), ("_replicator", None));
        assert_eq!(
            split_db_path("a/_replicator/doc1").unwrap(),
            ("a/_replicator", Some("doc1"))
        );
        assert_eq!(
            split_db_path("x_replicator/d/_replicator").unwrap(),
            ("x_replicator/d/_replicator", None)
        );
        assert!(split_db_path("mydb").is_err());
        let mut q = HashMap::new();
        q.insert("states".to_string(), "running,bogus".to_string());
        assert!(states(&q).unwrap_err().reason.contains("bogus"));
        q.insert("states".to_string(), "running,failed".to_string());
        assert_eq!(
            states(&q).unwrap(),
            Some(vec![RepState::Running, RepState::Failed])
        );
        q.insert("limit".to_string(), "-1".to_string());
        assert!(paging(&q).is_err());
    }
}
