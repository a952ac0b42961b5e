//! [`JobId`]: the couch_jobs id of a replication job, and its computation: `db|doc_id` for a
//! `_replicator` document's job ([`persistent_job_id`]), the MD5 of the normalized request
//! without credentials for a transient one ([`transient_job_id`]). The generic couch_jobs
//! layer keeps opaque `&str` ids; the replicator converts at its boundary with `as_str()`.

use md5::{Digest, Md5};
use serde_json::{Value, json};

use crate::replication::{Filter, RepId, ReplicationSpec};

text_id! {
    /// A replication job's couch_jobs id (not its replication id: see
    /// [`crate::replication::RepId`]).
    JobId
}

/// How a caller names a job to [`crate::replicator::Replicator::get`],
/// [`crate::replicator::Replicator::cancel`] and [`crate::replicator::Replicator::wait`]: by
/// its job id, or by the replication id it runs (claimed in the collision index once it ran,
/// else as its record shows it). Either converts from a reference to the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobRef {
    /// The job's couch_jobs id.
    Job(JobId),
    /// The full replication id (`base+ext`) the job runs.
    Replication(RepId),
}

impl std::fmt::Display for JobRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobRef::Job(id) => id.fmt(f),
            JobRef::Replication(id) => id.fmt(f),
        }
    }
}

impl From<JobId> for JobRef {
    fn from(id: JobId) -> Self {
        JobRef::Job(id)
    }
}

impl From<&JobId> for JobRef {
    fn from(id: &JobId) -> Self {
        JobRef::Job(id.clone())
    }
}

impl From<RepId> for JobRef {
    fn from(id: RepId) -> Self {
        JobRef::Replication(id)
    }
}

impl From<&RepId> for JobRef {
    fn from(id: &RepId) -> Self {
        JobRef::Replication(id.clone())
    }
}

/// The job id of a persistent job.
pub fn persistent_job_id(db_name: &str, doc_id: &str) -> JobId {
    JobId::from(format!("{db_name}|{doc_id}"))
}

/// The job id of a transient job: MD5 over everything that makes it a different replication,
/// without credentials and without network access (CouchDB 4.x's couch_replicator_jobs.erl).
pub fn transient_job_id(spec: &ReplicationSpec, user: Option<&str>) -> JobId {
    let o = &spec.options;
    let normalized = json!([
        spec.source.url(),
        spec.target.url(),
        user,
        o.continuous,
        o.create_target,
        filter_json(&o.filter),
        o.winning_revs_only,
    ]);
    JobId::from(hex::encode(Md5::digest(normalized.to_string().as_bytes())))
}

/// The filter as stable JSON (job ids are persisted: no `Debug` text in them).
fn filter_json(f: &Filter) -> Value {
    match f {
        Filter::None => Value::Null,
        Filter::DocIds(ids) => json!({ "doc_ids": ids }),
        Filter::Selector(sel) => json!({ "selector": sel }),
        Filter::Named { name, query_params } => {
            json!({ "filter": name, "query_params": query_params })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::ReplicationOptions;
    use crate::replicator::job::view::parse_rep;

    fn spec(src: &str, tgt: &str) -> ReplicationSpec {
        let rep = json!({"source": src, "target": tgt, "continuous": true});
        parse_rep(&rep, &ReplicationOptions::default()).unwrap()
    }

    #[test]
    fn job_ids_are_their_text_in_json_and_logs() {
        let id = JobId::from("_replicator|doc");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""_replicator|doc""#);
        let back: JobId = serde_json::from_str(r#""_replicator|doc""#).unwrap();
        assert_eq!(back, id);
        assert_eq!(id.to_string(), "_replicator|doc");
        assert_eq!(format!("{id:?}"), r#""_replicator|doc""#);
        let m: std::collections::HashMap<JobId, u8> = [(id.clone(), 1)].into();
        assert_eq!(m.get("_replicator|doc"), Some(&1));
    }

    #[test]
    fn transient_ids_ignore_credentials_but_not_the_user() {
        let a = spec("http://u:p1@127.0.0.1:1/a", "http://127.0.0.1:1/b");
        let b = spec("http://u:p2@127.0.0.1:1/a", "http://127.0.0.1:1/b");
        let c = spec("http://u:p2@127.0.0.1:1/a", "http://127.0.0.1:1/c");
        assert_eq!(transient_job_id(&a, None), transient_job_id(&b, None));
        assert_ne!(transient_job_id(&a, None), transient_job_id(&c, None));
        assert_ne!(
            transient_job_id(&a, None),
            transient_job_id(&a, Some("bob"))
        );
    }

    #[test]
    fn transient_ids_are_built_from_stable_json() {
        let rep = json!({"source": "http://127.0.0.1:1/a", "target": "http://127.0.0.1:1/b",
            "doc_ids": ["x"]});
        let s = parse_rep(&rep, &ReplicationOptions::default()).unwrap();
        let text = r#"["http://127.0.0.1:1/a","http://127.0.0.1:1/b","bob",false,false,{"doc_ids":["x"]},false]"#;
        assert_eq!(
            transient_job_id(&s, Some("bob")),
            hex::encode(Md5::digest(text.as_bytes()))
        );
    }
}
