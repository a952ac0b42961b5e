//! `verify --all-dbs`: the databases of a source server (its `_all_dbs`), system databases
//! (names starting with `_`) left out unless asked for by name, and the URL of one database
//! under a server URL (credentials kept, the name percent-encoded: `a/b` is `a%2Fb`).

use reqwest::StatusCode;

use crate::replication::client::Req;
use crate::replication::endpoint::encode_query;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::pipeline::{Context, clients};
use crate::replication::{Endpoint, ReplicationOptions, ReplicationSpec};

/// The URL of database `db` on the server at `server` (which may carry credentials).
pub fn db_url(server: &str, db: &str) -> String {
    format!("{}/{}", server.trim_end_matches('/'), encode_query(db))
}

/// The source server's databases to verify: every one from `_all_dbs` except system
/// databases, plus the system databases named in `include` that exist.
pub async fn list(
    server: &str,
    include: &[String],
    ctx: &Context,
    options: &ReplicationOptions,
) -> Result<Vec<String>> {
    // `_all_dbs` is addressed as if it were a database, so the endpoint's client (auth,
    // retries, TLS options) serves it unchanged.
    let ep = Endpoint::parse(&format!("{}/_all_dbs", server.trim_end_matches('/')))?;
    let mut spec = ReplicationSpec::new(ep.clone(), ep);
    spec.options = options.clone();
    let (client, _) = clients(&spec, ctx)?;
    let r = client.send(&Req::get("")).await?;
    match r.status {
        StatusCode::OK => {}
        StatusCode::UNAUTHORIZED => return Err(client.unauthorized()),
        StatusCode::FORBIDDEN => return Err(client.forbidden()),
        s => {
            return Err(ReplicationError::HttpRequestFailed(format!(
                "{}: _all_dbs answered {s}",
                client.endpoint()
            )));
        }
    }
    let all: Vec<String> = r.json("_all_dbs")?;
    Ok(select(all, include))
}

fn select(all: Vec<String>, include: &[String]) -> Vec<String> {
    all.into_iter()
        .filter(|db| !db.starts_with('_') || include.contains(db))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_databases_only_when_named() {
        let all = vec![
            "_replicator".into(),
            "_users".into(),
            "a".into(),
            "b/c".into(),
        ];
        assert_eq!(select(all.clone(), &[]), ["a", "b/c"]);
        assert_eq!(select(all, &["_users".into()]), ["_users", "a", "b/c"]);
        assert_eq!(
            db_url("http://u:p@h:5984/", "b/c"),
            "http://u:p@h:5984/b%2Fc"
        );
    }
}
