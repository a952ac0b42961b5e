//! A CouchDB server as a whole rather than one database: its `_all_dbs`, its `_db_updates`
//! feed and the deletion of a database, sent through the same client as replications (so the
//! endpoint's credentials, sessions, TLS settings, proxy, retries and 429 back-off apply), and
//! the URL of one database under a server URL. Whole-server jobs and `verify --all-dbs` use it.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::database::encode_query;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req};
use crate::replication::pipeline::run::{Context, clients};
use crate::replication::{Endpoint, ReplicationOptions, ReplicationSpec};

/// The URL of database `db` on the server at `server` (credentials kept, the name
/// percent-encoded: `a/b` is `a%2Fb`, as CouchDB wants a database name in a path).
pub fn db_url(server: &str, db: &str) -> String {
    format!("{}/{}", server.trim_end_matches('/'), encode_query(db))
}

/// What one `_db_updates` longpoll answered.
#[derive(Debug, Clone, PartialEq)]
pub enum DbUpdates {
    /// Something changed (or the longpoll timed out); follow on from this sequence.
    Since(Value),
    /// The server has no `_db_updates` (pouchdb-server, or CouchDB without its
    /// `_global_changes` database): poll `_all_dbs` instead.
    Missing,
}

/// The client of a server-level resource (`_all_dbs`, `_db_updates`, a database to delete):
/// the resource is addressed as if it were a database, so the endpoint's client serves it.
fn client_for(
    server: &str,
    resource: &str,
    ctx: &Context,
    options: &ReplicationOptions,
) -> Result<std::sync::Arc<HttpClient>> {
    let ep = Endpoint::parse(&db_url(server, resource))?;
    let mut spec = ReplicationSpec::new(ep.clone(), ep);
    spec.options = options.clone();
    Ok(clients(&spec, ctx)?.0)
}

fn refused(client: &HttpClient, what: &str, status: StatusCode) -> ReplicationError {
    match status {
        StatusCode::UNAUTHORIZED => client.unauthorized(),
        StatusCode::FORBIDDEN => client.forbidden(),
        s => ReplicationError::HttpRequestFailed(format!(
            "{}: {what} answered {s}",
            client.endpoint()
        )),
    }
}

/// Every database name of the server (its `_all_dbs`, system databases included).
pub async fn all_dbs(
    server: &str,
    ctx: &Context,
    options: &ReplicationOptions,
) -> Result<Vec<String>> {
    let client = client_for(server, "_all_dbs", ctx, options)?;
    let r = client.send(&Req::get("")).await?;
    if r.status != StatusCode::OK {
        return Err(refused(&client, "_all_dbs", r.status));
    }
    r.json("_all_dbs")
}

/// One `_db_updates` longpoll from `since` (`None`: from now), waiting at most `timeout`.
pub async fn db_updates(
    server: &str,
    since: Option<&Value>,
    timeout: Duration,
    ctx: &Context,
    options: &ReplicationOptions,
) -> Result<DbUpdates> {
    let mut options = options.clone();
    // The server holds a longpoll open for `timeout`: the request may take that long.
    let wait = timeout + Duration::from_secs(10);
    options.request_timeout = Some(options.request_timeout.map_or(wait, |t| t.max(wait)));
    let client = client_for(server, "_db_updates", ctx, &options)?;
    let since = match since {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "now".to_owned(),
    };
    let path = format!(
        "?feed=longpoll&timeout={}&since={}",
        timeout.as_millis(),
        encode_query(&since)
    );
    let r = client.send(&Req::get(path)).await?;
    match r.status {
        StatusCode::OK => {
            let v: Value = r.json("_db_updates")?;
            Ok(DbUpdates::Since(
                v.get("last_seq").cloned().unwrap_or(Value::Null),
            ))
        }
        StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST => Ok(DbUpdates::Missing),
        s => Err(refused(&client, "_db_updates", s)),
    }
}

/// Deletes database `db` of the server (a missing one is not an error).
pub async fn delete_db(
    server: &str,
    db: &str,
    ctx: &Context,
    options: &ReplicationOptions,
) -> Result<()> {
    let client = client_for(server, db, ctx, options)?;
    let req = Req::json(Method::DELETE, "", Vec::new());
    let r = client.send(&Req { body: None, ..req }).await?;
    match r.status {
        s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
        s => Err(refused(&client, "DELETE", s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_encoded_under_the_server() {
        assert_eq!(
            db_url("http://u:p@h:5984/", "b/c"),
            "http://u:p@h:5984/b%2Fc"
        );
        assert_eq!(db_url("http://h:5984", "a_b-c"), "http://h:5984/a_b-c");
    }
}
