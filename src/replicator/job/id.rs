//! [`JobId`]: the couch_jobs id of a replication job, `db|doc_id` for a `_replicator`
//! document's job, the MD5 of the normalized request for a transient one
//! (`super::view::persistent_job_id`, `super::view::transient_job_id`). The generic couch_jobs
//! layer keeps opaque `&str` ids; the replicator converts at its boundary with `as_str()`.

use crate::replication::RepId;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
