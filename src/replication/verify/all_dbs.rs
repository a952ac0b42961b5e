//! `verify --all-dbs`: the databases of a source server to check (its `_all_dbs`, read by
//! [`crate::replication::endpoint::server`]), system databases (names starting with `_`) left out
//! unless asked for by name.

use crate::replication::error::Result;
use crate::replication::pipeline::run::Context;
use crate::replication::{ReplicationOptions, endpoint::server};

/// The source server's databases to verify: every one from `_all_dbs` except system
/// databases, plus the system databases named in `include` that exist.
pub async fn list(
    server: &str,
    include: &[String],
    ctx: &Context,
    options: &ReplicationOptions,
) -> Result<Vec<String>> {
    let all = server::all_dbs(server, ctx, options).await?;
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
    }
}
