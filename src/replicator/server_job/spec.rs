//! Whole-server replication jobs (our extension): the couch_jobs type `server_jobs`, its
//! specification (source and target servers, include/exclude patterns for database names,
//! the per-database options), its record in couch_jobs job data, its job id and its view. The
//! [`Replicator`](crate::replicator::handle::Replicator) methods that add, read and cancel one
//! are in `server_job/api.rs`; the worker that runs a server job is in `server_job/worker.rs`.
//!
//! A server job owns one replication job per matching database, added through the normal
//! `rep_jobs` path as a persistent-like job of the pseudo `_replicator` database
//! `_server/<server job id>`: so the per-database jobs form their own fair-share group, and
//! their ids (`_server/<id>|<db>`) are the same after a restart, which makes re-adding them
//! idempotent.

use std::collections::BTreeMap;

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::jobs::{JobData, JobsError};

use crate::replicator::error::{ReplicatorError, ReplicatorResult};
use crate::replicator::job::id::JobId;
use crate::replicator::job::view::{JobKind, RepState, parse_rep};
use crate::replicator::node::name::NodeName;

/// The couch_jobs type of whole-server jobs.
pub const SERVER_JOBS: &str = "server_jobs";

/// The body field that makes a `POST /_replicate` body or `_replicator` document a
/// whole-server replication.
pub const ALL_DBS_FIELD: &str = "all_dbs";

/// The fields of a server-level body that are not per-database replication options.
const SERVER_FIELDS: [&str; 6] = [
    "source",
    "target",
    "include",
    "exclude",
    "delete_target_on_source_delete",
    ALL_DBS_FIELD,
];

/// Fields never passed on (request plumbing, document metadata).
const DROPPED_FIELDS: [&str; 6] = ["_id", "_rev", "cancel", "owner", "user_ctx", "id"];

/// What a whole-server replication copies and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerSpec {
    /// The source server URL (credentials allowed; never shown).
    pub source: String,
    /// The target server URL (credentials allowed; never shown).
    pub target: String,
    /// Database-name patterns (`*`, `?`) to copy; empty: every database. Names starting with
    /// `_` (system databases) are copied only when a pattern starting with `_` names them.
    #[serde(default)]
    pub include: Vec<String>,
    /// Database-name patterns to leave out (checked after `include`).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Delete the target database when the source one is deleted (off by default).
    #[serde(default)]
    pub delete_target_on_source_delete: bool,
    /// Per-database replication options (`continuous`, `create_target`, `worker_processes`,
    /// ...), CouchDB's names and meanings.
    #[serde(default)]
    pub options: Map<String, Value>,
}

impl ServerSpec {
    /// Parses a server-level body: the server fields, everything else a per-database option
    /// (validated now on a sample database, so a bad option is a 400 before any job exists).
    pub fn from_body(body: &Value) -> ReplicatorResult<Self> {
        let m = body
            .as_object()
            .ok_or_else(|| bad("the body must be a JSON object"))?;
        let url = |k: &str| -> ReplicatorResult<String> {
            let s = m
                .get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("`{k}` must be a server URL string")))?;
            check_server_url(s, k)?;
            Ok(s.trim_end_matches('/').to_owned())
        };
        let patterns = |k: &str| -> ReplicatorResult<Vec<String>> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|p| p.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad(format!("`{k}` must be an array of strings"))),
                Some(_) => Err(bad(format!("`{k}` must be an array of strings"))),
            }
        };
        let delete = match m.get("delete_target_on_source_delete") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("`delete_target_on_source_delete` must be a boolean")),
        };
        let mut options = m.clone();
        options.retain(|k, _| {
            !SERVER_FIELDS.contains(&k.as_str())
                && !DROPPED_FIELDS.contains(&k.as_str())
                && !k.starts_with("_replication")
        });
        let spec = ServerSpec {
            source: url("source")?,
            target: url("target")?,
            include: patterns("include")?,
            exclude: patterns("exclude")?,
            delete_target_on_source_delete: delete,
            options,
        };
        // The per-database options are checked as a database's replication would be.
        parse_rep(&spec.db_body("db"), &Default::default())?;
        Ok(spec)
    }

    /// Continuous per-database replications (the server job then never completes).
    pub fn continuous(&self) -> bool {
        self.options.get("continuous") == Some(&Value::Bool(true))
    }

    /// Whether database `name` is copied.
    pub fn matches(&self, name: &str) -> bool {
        let included = if self.include.is_empty() {
            !name.starts_with('_')
        } else {
            self.include
                .iter()
                .any(|p| glob(p, name) && (!name.starts_with('_') || p.starts_with('_')))
        };
        included && !self.exclude.iter().any(|p| glob(p, name))
    }

    /// The replication body of database `name`.
    pub fn db_body(&self, name: &str) -> Value {
        let mut body = self.options.clone();
        body.insert(
            "source".into(),
            crate::replication::endpoint::server::db_url(&self.source, name).into(),
        );
        body.insert(
            "target".into(),
            crate::replication::endpoint::server::db_url(&self.target, name).into(),
        );
        Value::Object(body)
    }
}

fn bad(reason: impl Into<String>) -> ReplicatorError {
    ReplicatorError::BadRequest(reason.into())
}

/// A server URL must be http(s) with a host.
fn check_server_url(s: &str, field: &str) -> ReplicatorResult<()> {
    let u = url::Url::parse(s).map_err(|e| bad(format!("`{field}` is not a valid URL: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(bad(format!("`{field}` must be an http(s) server URL")));
    }
    Ok(())
}

/// A server URL without credentials (what job ids and views use).
pub fn strip_credentials(s: &str) -> String {
    match url::Url::parse(s) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.as_str().trim_end_matches('/').to_owned()
        }
        Err(_) => s.to_owned(),
    }
}

/// `*` matches any run of characters, `?` any one; everything else itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative matching with one backtrack point (the last `*`): linear in practice.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

text_id! {
    /// A whole-server job's couch_jobs id (of the `server_jobs` type): `all_dbs-<md5>` for
    /// one asked for through `_replicate`, `db|doc_id` for a `_replicator` document's.
    ServerJobId
}

/// The job id of a server job: MD5 over everything that makes it a different copy, without
/// credentials, and the user who asked.
pub fn server_job_id(spec: &ServerSpec, user: Option<&str>) -> ServerJobId {
    let normalized = json!([
        strip_credentials(&spec.source),
        strip_credentials(&spec.target),
        spec.include,
        spec.exclude,
        spec.delete_target_on_source_delete,
        Value::Object(spec.options.clone()),
        user,
    ]);
    ServerJobId::from(format!(
        "all_dbs-{}",
        hex::encode(Md5::digest(normalized.to_string().as_bytes()))
    ))
}

/// The pseudo `_replicator` database (and fair-share group) of a server job's replications.
pub fn group_of(server_job_id: &ServerJobId) -> String {
    format!("_server/{server_job_id}")
}

/// Whether a job's `_replicator` database is a server job's pseudo database (such jobs
/// come from no document: `_scheduler/docs` leaves them out, `_scheduler/jobs` shows them).
pub fn is_server_group(db: &str) -> bool {
    db.starts_with("_server/")
}

/// The job kind of database `db`'s replication in server job `id`.
pub fn db_job_kind(server_job_id: &ServerJobId, db: &str) -> JobKind {
    JobKind::Persistent {
        db_name: group_of(server_job_id),
        doc_id: db.to_owned(),
    }
}

/// The state of a server job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ServerState {
    /// Waiting for a worker.
    #[default]
    Pending,
    /// A worker lists and follows the source and runs the replications.
    Running,
    /// One-shot: every database's replication ended (see `failed` for the ones that failed).
    Completed,
    /// The source server could not be listed for good.
    Failed,
}

impl ServerState {
    /// Completed or failed: the job will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }
}

/// Progress of one database's replication.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DbProgress {
    /// Its replication job id.
    pub job_id: JobId,
    /// Its replication job state.
    pub state: RepState,
    /// Documents read from the source.
    pub docs_read: u64,
    /// Documents written to the target.
    pub docs_written: u64,
    /// Documents the target refused.
    pub doc_write_failures: u64,
}

/// The job data of a server job. `spec` keeps credentials and is never shown; the view
/// ([`ServerJobView`]) leaves it out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerRecord {
    /// What to copy (`None` only in a default record).
    pub spec: Option<ServerSpec>,
    /// Who asked.
    pub user: Option<String>,
    /// The job's state.
    pub state: ServerState,
    /// Per matching database, by name.
    pub dbs: BTreeMap<String, DbProgress>,
    /// Why the job failed, or the last listing error.
    pub error: Option<String>,
    /// UNIX seconds it was added.
    pub start_time: i64,
    /// UNIX seconds of the last progress update.
    pub last_updated: i64,
    /// The node running it (while running).
    pub node: Option<NodeName>,
    /// How new and deleted databases are found: `_db_updates`, or `_all_dbs` polls where
    /// the source has no `_db_updates` (unknown before the first answer).
    #[serde(default)]
    pub follows: Option<String>,
}

impl ServerRecord {
    /// The record as couch_jobs job data.
    pub fn to_data(&self) -> JobData {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            _ => JobData::new(),
        }
    }

    /// The record from couch_jobs job data.
    pub fn from_data(d: &JobData) -> Result<Self, JobsError> {
        serde_json::from_value(Value::Object(d.clone()))
            .map_err(|e| JobsError::Encoding(format!("server job data: {e}")))
    }
}

/// A server job as the API shows it (no credentials).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerJobView {
    /// The couch_jobs id (`all_dbs-<md5>`).
    pub id: ServerJobId,
    /// Source server without credentials.
    pub source: String,
    /// Target server without credentials.
    pub target: String,
    /// The job's state.
    pub state: ServerState,
    /// Continuous per-database replications.
    pub continuous: bool,
    /// Matching databases seen so far.
    pub total: usize,
    /// Of which completed.
    pub completed: usize,
    /// Of which failed.
    pub failed: usize,
    /// Documents written over all databases.
    pub docs_written: u64,
    /// Per database.
    pub dbs: BTreeMap<String, DbProgress>,
    /// The last error.
    pub error: Option<String>,
    /// UNIX seconds it was added.
    pub start_time: i64,
    /// UNIX seconds of the last progress update.
    pub last_updated: i64,
    /// The node running it.
    pub node: Option<NodeName>,
    /// `_db_updates` or `_all_dbs` (polled).
    pub follows: Option<String>,
}

impl ServerJobView {
    /// The view of record `r` of job `id`.
    pub fn from_record(id: &ServerJobId, r: &ServerRecord) -> Self {
        let count = |s: RepState| r.dbs.values().filter(|d| d.state == s).count();
        let (source, target, continuous) = match &r.spec {
            Some(s) => (
                strip_credentials(&s.source),
                strip_credentials(&s.target),
                s.continuous(),
            ),
            None => Default::default(),
        };
        Self {
            id: id.clone(),
            source,
            target,
            state: r.state,
            continuous,
            total: r.dbs.len(),
            completed: count(RepState::Completed),
            failed: count(RepState::Failed),
            docs_written: r.dbs.values().map(|d| d.docs_written).sum(),
            dbs: r.dbs.clone(),
            error: r.error.clone(),
            start_time: r.start_time,
            last_updated: r.last_updated,
            node: r.node.clone(),
            follows: r.follows.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_shell_patterns() {
        assert!(glob("*", "abc"));
        assert!(glob("a*c", "abbbc"));
        assert!(glob("db-?", "db-1"));
        assert!(!glob("db-?", "db-12"));
        assert!(glob("*-log*", "x-log-2024"));
        assert!(!glob("a*b", "aXc"));
    }

    #[test]
    fn system_dbs_need_an_explicit_pattern() {
        let body = json!({"source": "http://h:1", "target": "http://h:2"});
        let mut s = ServerSpec::from_body(&body).unwrap();
        assert!(s.matches("a"));
        assert!(!s.matches("_users"));
        s.include = vec!["*".into(), "_users".into()];
        assert!(s.matches("_users") && !s.matches("_replicator"));
        s.exclude = vec!["a*".into()];
        assert!(!s.matches("abc") && s.matches("b"));
    }

    #[test]
    fn per_db_bodies_carry_options_and_encoded_names() {
        let body = json!({"source": "http://u:p@h:1/", "target": "http://h:2",
            "all_dbs": true, "continuous": true, "worker_processes": 2, "include": ["*"]});
        let s = ServerSpec::from_body(&body).unwrap();
        let b = s.db_body("a/b+c");
        assert_eq!(b["source"], "http://u:p@h:1/a%2Fb%2Bc");
        assert_eq!(b["target"], "http://h:2/a%2Fb%2Bc");
        assert_eq!(b["worker_processes"], 2);
        assert!(b.get("include").is_none() && b.get("all_dbs").is_none());
        assert!(s.continuous());
    }

    #[test]
    fn ids_ignore_credentials_and_bad_bodies_are_refused() {
        let a = json!({"source": "http://u:p1@h:1", "target": "http://h:2"});
        let b = json!({"source": "http://u:p2@h:1", "target": "http://h:2"});
        let (a, b) = (
            ServerSpec::from_body(&a).unwrap(),
            ServerSpec::from_body(&b).unwrap(),
        );
        assert_eq!(server_job_id(&a, None), server_job_id(&b, None));
        assert!(!server_job_id(&a, None).as_str().contains("p1"));
        for bad in [
            json!({"source": "ftp://h", "target": "http://h:2"}),
            json!({"source": "http://h:1", "target": 3}),
            json!({"source": "http://h:1", "target": "http://h:2", "include": "x"}),
            json!({"source": "http://h:1", "target": "http://h:2", "worker_processes": "x"}),
        ] {
            assert!(ServerSpec::from_body(&bad).is_err(), "{bad}");
        }
    }
}
