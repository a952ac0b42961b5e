//! What a host or the HTTP layer asks the replicator to add: [`NewJob`], a persistent or
//! transient replication built from typed endpoints and options, or taken as the CouchDB
//! document / `POST /_replicate` body it came as. It takes no messages; the handle's
//! `add` turns it into a job record.

use std::time::Duration;

use serde_json::Value;

use super::job::view::JobKind;
use crate::replication::Endpoint;

/// What to add: a persistent job (from a `_replicator` doc) or a transient one.
///
/// Build one from typed endpoints with [`NewJob::transient`] or [`NewJob::persistent`] and
/// the typed option methods; [`NewJob::from_body`] takes a `_replicator` document or
/// `POST /_replicate` body as it came (the HTTP layer's and doc processor's way in). Either
/// way the job keeps the CouchDB document it stands for (options under CouchDB's names), which
/// is what its record and `_scheduler` views show; options are checked when the job is added.
///
/// ```
/// use couch_replicator::{Endpoint, NewJob};
///
/// # fn main() -> Result<(), couch_replicator::ReplicationError> {
/// let a = Endpoint::parse("http://127.0.0.1:5984/a")?;
/// let b = Endpoint::parse("http://127.0.0.1:5984/b")?;
/// let job = NewJob::transient(a, b)
///     .continuous()
///     .create_target()
///     .doc_ids(["x", "y"])
///     .worker_processes(2);
/// assert_eq!(job.body()["continuous"], true);
/// assert_eq!(job.body()["doc_ids"][1], "y");
/// assert_eq!(job.body()["worker_processes"], 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NewJob {
    kind: JobKind,
    /// The replication document / `POST /_replicate` body (`source`, `target`, options).
    rep: Value,
    /// Added paused (see `Replicator::pause`): it runs once resumed.
    paused: bool,
}

/// Shows the kind and the options' names only: the endpoints may carry credentials.
impl std::fmt::Debug for NewJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields: Vec<&str> = self
            .rep
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        f.debug_struct("NewJob")
            .field("kind", &self.kind)
            .field("fields", &fields)
            .finish()
    }
}

impl NewJob {
    /// A transient replication (as from `POST /_replicate`) of `source` into `target`,
    /// owned by no user.
    pub fn transient(source: Endpoint, target: Endpoint) -> Self {
        Self::from_body(
            JobKind::Transient { user: None },
            endpoints(&source, &target),
        )
    }

    /// A persistent replication, as if from document `doc_id` of `_replicator` database
    /// `db_name`.
    pub fn persistent(
        db_name: impl Into<String>,
        doc_id: impl Into<String>,
        source: Endpoint,
        target: Endpoint,
    ) -> Self {
        let kind = JobKind::Persistent {
            db_name: db_name.into(),
            doc_id: doc_id.into(),
        };
        Self::from_body(kind, endpoints(&source, &target))
    }

    /// A job from a replication document or request body as it came: the HTTP and
    /// `_replicator` edges.
    pub fn from_body(kind: JobKind, rep: Value) -> Self {
        Self {
            kind,
            rep,
            paused: false,
        }
    }

    /// Adds the job paused, in the same transaction (a document that says `"paused": true`
    /// from the start never runs, not even for a moment). An existing job is left as it is.
    pub fn paused(mut self) -> Self {
        self.paused = true;
        self
    }

    /// Whether it is added paused.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Persistent or transient (and whose).
    pub fn kind(&self) -> &JobKind {
        &self.kind
    }

    /// The replication document this job stands for. It carries the endpoints'
    /// credentials: never log it.
    pub fn body(&self) -> &Value {
        &self.rep
    }

    /// Runs a transient job as `user` (who may then see and cancel it over HTTP).
    pub fn user(mut self, user: impl Into<String>) -> Self {
        if let JobKind::Transient { user: u } = &mut self.kind {
            *u = Some(user.into());
        }
        self
    }

    /// Keeps replicating new changes after catching up (`continuous`).
    pub fn continuous(self) -> Self {
        self.set("continuous", true)
    }

    /// Creates the target database if it is missing (`create_target`).
    pub fn create_target(self) -> Self {
        self.set("create_target", true)
    }

    /// Replicates only these documents (`doc_ids`).
    pub fn doc_ids<S: Into<String>>(self, ids: impl IntoIterator<Item = S>) -> Self {
        let ids: Vec<String> = ids.into_iter().map(Into::into).collect();
        self.set("doc_ids", ids)
    }

    /// Replicates only documents matching a Mango `selector` (a JSON query by nature).
    pub fn selector(self, selector: Value) -> Self {
        self.set("selector", selector)
    }

    /// Replicates through the filter function `ddoc/name` of the source with `query_params`.
    pub fn filter(self, name: impl Into<String>, query_params: Value) -> Self {
        self.set("filter", name.into())
            .set("query_params", query_params)
    }

    /// Batches in flight at the start (`worker_processes`).
    pub fn worker_processes(self, n: usize) -> Self {
        self.set("worker_processes", n)
    }

    /// Changes per batch (`worker_batch_size`).
    pub fn worker_batch_size(self, n: usize) -> Self {
        self.set("worker_batch_size", n)
    }

    /// Requests in flight per endpoint at most (`http_connections`).
    pub fn http_connections(self, n: usize) -> Self {
        self.set("http_connections", n)
    }

    /// A request's inactivity timeout (`connection_timeout`, milliseconds in the document).
    pub fn connection_timeout(self, t: Duration) -> Self {
        self.set("connection_timeout", millis(t))
    }

    /// How many times a failed request is retried (`retries_per_request`).
    pub fn retries_per_request(self, n: u32) -> Self {
        self.set("retries_per_request", n)
    }

    /// How often checkpoints are written (`checkpoint_interval`, milliseconds in the document).
    pub fn checkpoint_interval(self, t: Duration) -> Self {
        self.set("checkpoint_interval", millis(t))
    }

    /// Whether checkpoints are written at all (`use_checkpoints`).
    pub fn use_checkpoints(self, on: bool) -> Self {
        self.set("use_checkpoints", on)
    }

    /// Starts from this source sequence instead of the checkpoint's (`since_seq`; CouchDB's
    /// sequences are opaque JSON values).
    pub fn since_seq(self, seq: Value) -> Self {
        self.set("since_seq", seq)
    }

    /// Replicates only each document's winning revision (`winning_revs_only`).
    pub fn winning_revs_only(self, on: bool) -> Self {
        self.set("winning_revs_only", on)
    }

    fn set(mut self, name: &'static str, value: impl Into<Value>) -> Self {
        if let Value::Object(m) = &mut self.rep {
            m.insert(name.to_owned(), value.into());
        }
        self
    }
}

/// A duration as the whole milliseconds CouchDB's documents hold.
fn millis(t: Duration) -> u64 {
    u64::try_from(t.as_millis()).unwrap_or(u64::MAX)
}

/// The `{"source", "target"}` body every builder starts from.
fn endpoints(source: &Endpoint, target: &Endpoint) -> Value {
    serde_json::json!({"source": source.to_json(), "target": target.to_json()})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ep(v: Value) -> Endpoint {
        Endpoint::from_json(&v).unwrap()
    }

    #[test]
    fn typed_options_write_the_document_couchdb_would_hold() {
        let source = json!("http://bob:s3cret@127.0.0.1:5984/a");
        let target = json!({"url": "http://127.0.0.1:5984/b", "headers": {"x-tenant": "t1"}});
        let job = NewJob::persistent("_replicator", "d1", ep(source.clone()), ep(target.clone()))
            .continuous()
            .worker_processes(2)
            .checkpoint_interval(Duration::from_secs(5))
            .connection_timeout(Duration::from_millis(1500))
            .since_seq(json!("12-abc"));
        // The endpoints as they were given; durations as CouchDB's milliseconds.
        assert_eq!(
            job.body(),
            &json!({"source": source, "target": target, "continuous": true,
                    "worker_processes": 2, "checkpoint_interval": 5000,
                    "connection_timeout": 1500, "since_seq": "12-abc"})
        );
        assert!(matches!(job.kind(), JobKind::Persistent { doc_id, .. } if doc_id == "d1"));
    }

    #[test]
    fn debug_shows_no_credentials() {
        let source = ep(json!("http://bob:s3cret@127.0.0.1:5984/a"));
        let target = ep(json!("http://127.0.0.1:5984/b"));
        let shown = format!("{:?}", NewJob::transient(source, target).user("ann"));
        assert!(
            !shown.contains("s3cret") && !shown.contains("bob"),
            "{shown}"
        );
        assert!(shown.contains("source") && shown.contains("ann"), "{shown}");
    }
}
