//! Where steps jobs live: the documents' key space and the couch_jobs queue types.
//!
//! One couch_jobs type per target queue: `steps:<node>` and `steps:any`. couch_jobs'
//! `accept` takes from a whole type's pending range and cannot filter by id, so node-prefixed
//! ids in one shared type would make node A dequeue B's steps and hand them back (extra
//! writes, spinning); with a type per queue, a step for B is simply never offered to A, and
//! an enqueue only wakes the workers that may take it (the pending watch is per type). The
//! couch_jobs job id is the steps job id: a job is in exactly one queue at a time.

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::jobs::JobData;
use crate::store::strinc;
use crate::store::tuple::{self, Bytes};

use super::model::Target;

/// The couch_jobs type prefix of step queues.
pub const QUEUE_PREFIX: &str = "steps:";

/// The couch_jobs type of a target's queue.
pub fn queue_type(target: &Target) -> String {
    format!("{QUEUE_PREFIX}{}", target.as_str())
}

/// The queues a worker on `node` takes steps from: its own, then `any`.
pub fn node_queues(node: &str) -> [String; 2] {
    [
        queue_type(&Target::Node(node.to_string())),
        queue_type(&Target::Any),
    ]
}

/// The couch_jobs data of a queued step: which job, which step.
pub fn queue_entry(job_id: &str, step: usize) -> JobData {
    let mut data = JobData::new();
    data.insert("job".into(), json!(job_id));
    data.insert("step".into(), json!(step));
    data
}

/// Reads a queue entry back (`None` if it is not one of ours).
pub fn parse_queue_entry(data: &JobData) -> Option<(String, usize)> {
    let job = data.get("job").and_then(Value::as_str)?;
    let step = data.get("step").and_then(Value::as_u64)?;
    Some((job.to_string(), usize::try_from(step).ok()?))
}

/// Keys of the steps documents: `prefix ‖ pack((1, job_id))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepsKeys {
    docs: Vec<u8>,
}

const DOCS: i64 = 1;

impl StepsKeys {
    /// Document keys under the layer prefix `prefix`.
    pub fn new(prefix: &[u8]) -> Self {
        let mut docs = prefix.to_vec();
        tuple::pack_into(&(DOCS,), &mut docs);
        Self { docs }
    }

    /// The key of job `id`'s document.
    pub fn doc(&self, id: &str) -> Vec<u8> {
        let mut key = self.docs.clone();
        tuple::pack_into(&(Bytes(Cow::Borrowed(id.as_bytes())),), &mut key);
        key
    }

    /// Document keys after `after` (from the first when `None`).
    pub fn doc_range(&self, after: Option<&str>) -> (Vec<u8>, Vec<u8>) {
        let begin = match after {
            Some(id) => {
                let mut k = self.doc(id);
                k.push(0);
                k
            }
            None => self.docs.clone(),
        };
        // A tuple-packed prefix never ends in 0xFF, so strinc exists.
        let end = strinc(&self.docs).unwrap_or_else(|| vec![0xFF]);
        (begin, end)
    }

    /// The job id of a document key.
    pub fn decode_doc_key(&self, key: &[u8]) -> Option<String> {
        let rest = key.strip_prefix(self.docs.as_slice())?;
        let (id,): (Bytes,) = tuple::unpack(rest).ok()?;
        String::from_utf8(id.into_owned()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_and_entries() {
        assert_eq!(queue_type(&Target::Any), "steps:any");
        assert_eq!(
            node_queues("b"),
            ["steps:b".to_string(), "steps:any".to_string()]
        );
        let e = queue_entry("j1", 4);
        assert_eq!(parse_queue_entry(&e), Some(("j1".into(), 4)));
        assert_eq!(parse_queue_entry(&JobData::new()), None);
    }

    #[test]
    fn doc_keys_round_trip_and_ranges_exclude_the_start() {
        let k = StepsKeys::new(b"p");
        assert_eq!(k.decode_doc_key(&k.doc("abc")).as_deref(), Some("abc"));
        let (b, e) = k.doc_range(Some("abc"));
        assert!(b > k.doc("abc") && b < k.doc("abd") && e > k.doc("zzz"));
        assert_eq!(k.decode_doc_key(b"zz"), None);
    }
}
