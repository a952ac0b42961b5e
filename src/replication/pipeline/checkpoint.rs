//! Checkpoints (CouchDB's couch_replicator_scheduler_job.erl start-up; CouchDB's couch_replicator_scheduler_job.erl checkpoints): reading `_local/<rep id>` on both sides to find the
//! start sequence (same session on both, else the newest common session in the histories,
//! else from scratch), looking under the older id versions too and moving what is found there
//! to the current id as CouchDB does, and writing them with the session history (newest
//! first, at most 50 entries). The sequence written is always a through-sequence the pipeline
//! guarantees. Documents are CouchDB's, so either replicator resumes from the other's.

use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::stats::ReplicationStats;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req};
use crate::replication::id::rep_id::REP_ID_VERSION;

/// Maximum history entries kept in a checkpoint document.
pub const MAX_HISTORY: usize = 50;

/// Where a run starts.
#[derive(Debug, Clone, PartialEq)]
pub struct StartPoint {
    /// Sequence to read changes from.
    pub seq: Value,
    /// Stats of the newest matching history entry (to seed cumulative counters).
    pub seed: Option<ReplicationStats>,
}

/// Reads and writes the checkpoint documents of one replication session.
pub struct Checkpointer {
    src: Arc<HttpClient>,
    tgt: Arc<HttpClient>,
    path: String,
    src_rev: Option<String>,
    tgt_rev: Option<String>,
    session_id: String,
    start_time: String,
    start_seq: Value,
    history: Vec<Value>,
    /// What a one-shot `_replicate` answers (see [`Checkpointer::record`]).
    record: Value,
    /// `doc_ids` replications repeat some stats at the top of the document (CouchDB 1.0's
    /// format, still written by CouchDB 3).
    doc_ids: bool,
    last_written: Option<Value>,
    /// `instance_start_time` of source and target as seen when the replication opened them.
    instance_start: (Option<String>, Option<String>),
}

/// The `instance_start_time` field of a db-info or `_ensure_full_commit` answer.
pub fn instance_start_of(v: &Value) -> Option<String> {
    match v.get("instance_start_time")? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Where the checkpoint of the current id version lives (`ids` newest first).
pub(crate) fn checkpoint_path(ids: &[String]) -> String {
    format!("_local/{}", ids.first().map_or("", String::as_str))
}

/// A checkpoint document, or `None` where the database has none.
pub(crate) async fn read_local(c: &HttpClient, path: &str) -> Result<Option<Value>> {
    let r = c.send(&Req::get(path)).await?;
    match r.status {
        StatusCode::OK => Ok(Some(r.json("checkpoint document")?)),
        StatusCode::UNAUTHORIZED => Err(c.unauthorized()),
        StatusCode::FORBIDDEN => Err(c.forbidden()),
        _ => Ok(None),
    }
}

fn seed_from(entry: Option<&Value>) -> Option<ReplicationStats> {
    let e = entry?;
    let n = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(ReplicationStats {
        revisions_checked: n("missing_checked"),
        missing_revisions_found: n("missing_found"),
        docs_read: n("docs_read"),
        docs_written: n("docs_written"),
        doc_write_failures: n("doc_write_failures"),
        bulk_get_docs: n("bulk_get_docs"),
        bulk_get_attempts: n("bulk_get_attempts"),
        ..Default::default()
    })
}

/// D.2 step 4, as CouchDB's `compare_replication_logs`: the same session id on both sides
/// (or neither document) resumes from the source's `source_last_seq` with its whole history;
/// otherwise the histories are searched for a common session, whose `recorded_seq` is the
/// start and whose older entries are kept. Cumulative stats continue from the first entry kept.
pub fn compare_logs(src: Option<&Value>, tgt: Option<&Value>) -> (StartPoint, Vec<Value>) {
    let sid = |d: Option<&Value>| d.and_then(|d| d.get("session_id")).cloned();
    let hist = |d: Option<&Value>| {
        d.and_then(|d| d.get("history"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (seq, history) = if sid(src) == sid(tgt) {
        let seq = src
            .and_then(|s| s.get("source_last_seq"))
            .cloned()
            .unwrap_or(json!(0));
        (seq, hist(src))
    } else {
        compare_rep_history(&hist(src), &hist(tgt))
    };
    let seed = seed_from(history.first());
    (StartPoint { seq, seed }, history)
}

fn has_session_id(id: Option<&Value>, entries: &[Value]) -> bool {
    id.is_some() && entries.iter().any(|e| e.get("session_id") == id)
}

fn recorded_seq(e: &Value) -> Value {
    e.get("recorded_seq").cloned().unwrap_or(json!(0))
}

fn compare_rep_history(s: &[Value], t: &[Value]) -> (Value, Vec<Value>) {
    let (Some((s0, s_rest)), Some((t0, t_rest))) = (s.split_first(), t.split_first()) else {
        return (json!(0), Vec::new());
    };
    if has_session_id(s0.get("session_id"), t) {
        return (recorded_seq(s0), s_rest.to_vec());
    }
    if has_session_id(t0.get("session_id"), s_rest) {
        return (recorded_seq(t0), t_rest.to_vec());
    }
    compare_rep_history(s_rest, t_rest)
}

/// Reads the checkpoint of one side under the first of `ids` (newest id version first) that
/// has one (all are read at once). One found under an older id is copied to `ids[0]`, as CouchDB migrates it; the
/// returned document then carries the revision of that copy. `current`: the document under
/// `ids[0]` when it was read already (`Some(None)`: there is none).
async fn find_and_migrate(
    c: &HttpClient,
    ids: &[String],
    current: Option<Option<Value>>,
) -> Result<Option<Value>> {
    let Some(current_id) = ids.first() else {
        return Ok(None);
    };
    let skip = match current {
        Some(Some(doc)) => return Ok(Some(doc)),
        Some(None) => 1,
        None => 0,
    };
    // Every id version is read at once (a round trip each would add up on a slow link);
    // the newest found wins.
    let paths: Vec<String> = ids[skip..]
        .iter()
        .map(|id| format!("_local/{id}"))
        .collect();
    let found = futures::future::try_join_all(paths.iter().map(|p| read_local(c, p))).await?;
    for (i, (id, doc)) in ids[skip..].iter().zip(found).enumerate() {
        let Some(mut doc) = doc else {
            continue;
        };
        if i + skip == 0 {
            return Ok(Some(doc));
        }
        if let Some(m) = doc.as_object_mut() {
            m.remove("_id");
            m.remove("_rev");
        }
        let path = format!("_local/{current_id}");
        let rev = put_local(c, &path, &doc, None).await?;
        tracing::info!(db = %c.endpoint(), from = %id, to = %current_id, "migrated replication checkpoint");
        if let (Some(m), Some(r)) = (doc.as_object_mut(), rev) {
            m.insert("_rev".into(), Value::String(r));
        }
        return Ok(Some(doc));
    }
    Ok(None)
}

impl Checkpointer {
    /// Reads both checkpoint documents and decides the start point. `ids` are the base ids
    /// of every id version, the current one first (see [`crate::replication::id::rep_id::checkpoint_ids`]).
    /// With a `new_target` (created by this start) there is nothing to match: only the
    /// source's current document is needed, for the revision the first checkpoint replaces
    /// (one request instead of one per id version on each side). `source_current`: that
    /// document (at [`checkpoint_path`]) when the caller read it already.
    pub async fn load(
        src: Arc<HttpClient>,
        tgt: Arc<HttpClient>,
        ids: &[String],
        new_target: bool,
        source_current: Option<Option<Value>>,
    ) -> Result<(Self, StartPoint)> {
        let path = checkpoint_path(ids);
        let (s, t) = match (new_target, source_current) {
            (true, Some(doc)) => (doc, None),
            (true, None) => (read_local(&src, &path).await?, None),
            (false, current) => tokio::try_join!(
                find_and_migrate(&src, ids, current),
                find_and_migrate(&tgt, ids, None)
            )?,
        };
        let (start, history) = compare_logs(s.as_ref(), t.as_ref());
        // Until a checkpoint is written: the source's document, marked as no change.
        let mut record = serde_json::Map::new();
        record.insert("no_changes".into(), Value::Bool(true));
        for (k, v) in s.iter().flat_map(|d| d.as_object()).flatten() {
            if !k.starts_with('_') {
                record.insert(k.clone(), v.clone());
            }
        }
        let rev = |d: &Option<Value>| {
            d.as_ref()
                .and_then(|d| d.get("_rev"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let cp = Self {
            src_rev: rev(&s),
            tgt_rev: rev(&t),
            src,
            tgt,
            path,
            session_id: uuid::Uuid::new_v4().simple().to_string(),
            start_time: httpdate::fmt_http_date(std::time::SystemTime::now()),
            start_seq: start.seq.clone(),
            history,
            record: Value::Object(record),
            doc_ids: false,
            last_written: None,
            instance_start: (None, None),
        };
        Ok((cp, start))
    }

    /// Records the `instance_start_time` of source and target seen at start: a checkpoint
    /// fails when either changed (the database was re-created or the server lost
    /// unflushed writes), so the job restarts from a checkpoint both sides really have.
    pub fn expect_instance_start(&mut self, src: Option<String>, tgt: Option<String>) {
        self.instance_start = (src, tgt);
    }

    async fn ensure_commit(&self, c: &HttpClient, expected: Option<&String>) -> Result<()> {
        let commit = Req::json(Method::POST, "_ensure_full_commit", "{}");
        let r = c.send(&commit).await?;
        if !r.status.is_success() {
            return Err(ReplicationError::CheckpointFailed(format!(
                "{}: _ensure_full_commit answered {}",
                c.endpoint(),
                r.status
            )));
        }
        let now = r.json::<Value>("_ensure_full_commit").ok();
        let now = now.as_ref().and_then(instance_start_of);
        // "0" is tolerated on either side (servers that do not track it, upgrades).
        match (expected, now) {
            (Some(e), Some(n)) if *e != n && e != "0" && n != "0" => {
                Err(ReplicationError::CheckpointFailed(format!(
                    "instance_start_time on {} changed since last checkpoint ({e} -> {n})",
                    c.endpoint()
                )))
            }
            _ => Ok(()),
        }
    }

    /// Marks a `doc_ids` replication (its documents carry a few more fields).
    pub fn set_doc_ids(&mut self, doc_ids: bool) {
        self.doc_ids = doc_ids;
    }

    /// CouchDB's answer to a one-shot `_replicate`, without `ok`: the checkpoint document
    /// last written, or, when this run wrote none, the source's one with `no_changes: true`.
    /// Taken by value: it is the checkpointer's last use, and the history is large.
    pub fn into_record(self) -> Value {
        self.record
    }

    /// Overrides the start sequence recorded in history (`since_seq`).
    pub fn set_start_seq(&mut self, seq: Value) {
        self.start_seq = seq;
    }

    /// Writes a checkpoint at `through` to both sides. Skipped when nothing changed.
    pub async fn write(&mut self, through: &Value, stats: &ReplicationStats) -> Result<bool> {
        if self.last_written.as_ref() == Some(through)
            || (self.last_written.is_none() && *through == self.start_seq)
        {
            return Ok(false);
        }
        let body = self.next_body(through, stats);
        let (src_rev, tgt_rev) = (self.src_rev.take(), self.tgt_rev.take());
        let writes = async {
            tokio::try_join!(
                put_local(&self.src, &self.path, &body, src_rev),
                put_local(&self.tgt, &self.path, &body, tgt_rev),
            )
        };
        let commits = async {
            tokio::try_join!(
                self.ensure_commit(&self.src, self.instance_start.0.as_ref()),
                self.ensure_commit(&self.tgt, self.instance_start.1.as_ref()),
            )
        };
        // Both sides must still be the databases this run started with, so the commits come
        // first, unless neither side can tell: CouchDB 2 and later answer an
        // `instance_start_time` of "0" and commit every write at once, so there the commits
        // and the writes go together (one round trip instead of two on a slow link).
        let (s, t) = if self.instance_unknowable() {
            let (_, revs) = tokio::try_join!(commits, writes)?;
            revs
        } else {
            commits.await?;
            writes.await?
        };
        (self.src_rev, self.tgt_rev) = (s, t);
        self.last_written = Some(through.clone());
        self.record = body;
        Ok(true)
    }

    /// Whether `_ensure_full_commit` can never fail the instance check: both sides reported
    /// no instance (or "0") when the replication opened them.
    fn instance_unknowable(&self) -> bool {
        let unknown = |i: &Option<String>| i.as_deref().is_none_or(|v| v == "0");
        unknown(&self.instance_start.0) && unknown(&self.instance_start.1)
    }

    /// The checkpoint document to write at `through`: this session's entry first in the
    /// history.
    fn next_body(&self, through: &Value, stats: &ReplicationStats) -> Value {
        let entry = json!({
            "session_id": self.session_id,
            "start_time": self.start_time,
            "end_time": httpdate::fmt_http_date(std::time::SystemTime::now()),
            "start_last_seq": self.start_seq,
            "end_last_seq": through,
            "recorded_seq": through,
            "missing_checked": stats.revisions_checked,
            "missing_found": stats.missing_revisions_found,
            "docs_read": stats.docs_read,
            "docs_written": stats.docs_written,
            "doc_write_failures": stats.doc_write_failures,
            "bulk_get_docs": stats.bulk_get_docs,
            "bulk_get_attempts": stats.bulk_get_attempts,
        });
        let mut history = Vec::with_capacity(MAX_HISTORY);
        history.push(entry);
        history.extend(self.history.iter().take(MAX_HISTORY - 1).cloned());
        let mut body = json!({
            "session_id": self.session_id,
            "source_last_seq": through,
            "replication_id_version": REP_ID_VERSION,
        });
        if self.doc_ids
            && let Some(m) = body.as_object_mut()
        {
            for k in [
                "start_time",
                "end_time",
                "docs_read",
                "docs_written",
                "doc_write_failures",
            ] {
                m.insert(k.into(), history[0][k].clone());
            }
        }
        body["history"] = Value::Array(history);
        body
    }
}

async fn put_local(
    c: &HttpClient,
    path: &str,
    body: &Value,
    rev: Option<String>,
) -> Result<Option<String>> {
    // The record with its `_rev`, serialized without copying the (up to 50-entry) history.
    #[derive(serde::Serialize)]
    struct WithRev<'a> {
        #[serde(rename = "_rev", skip_serializing_if = "Option::is_none")]
        rev: Option<String>,
        #[serde(flatten)]
        body: &'a Value,
    }
    let doc = serde_json::to_string(&WithRev { rev, body })
        .map_err(|e| ReplicationError::CheckpointFailed(e.to_string()))?;
    let mut req = Req::json(Method::PUT, path, doc);
    req.headers
        .push(("x-couch-full-commit", "false".to_owned()));
    let r = c.send(&req).await?;
    if r.status.is_success() {
        let v: Value = r.json("checkpoint write")?;
        return Ok(v.get("rev").and_then(Value::as_str).map(str::to_owned));
    }
    if r.status == StatusCode::CONFLICT {
        // A previous attempt may have succeeded with its answer lost: accept if identical.
        if let Some(cur) = read_local(c, path).await? {
            let same = ["session_id", "source_last_seq", "history"]
                .iter()
                .all(|k| cur.get(*k) == body.get(*k));
            if same {
                return Ok(cur.get("_rev").and_then(Value::as_str).map(str::to_owned));
            }
        }
    }
    Err(ReplicationError::CheckpointFailed(format!(
        "{}: writing the checkpoint answered {}",
        c.endpoint(),
        r.status
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_session_resumes_from_source_last_seq() {
        let d = json!({"session_id": "a", "source_last_seq": 42, "history": [{"session_id": "a", "recorded_seq": 42, "docs_read": 7}]});
        let (sp, h) = compare_logs(Some(&d), Some(&d));
        assert_eq!(sp.seq, json!(42));
        assert_eq!(sp.seed.unwrap().docs_read, 7);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn common_older_session_is_found_in_history() {
        let s = json!({"session_id": "c", "history": [{"session_id": "c", "recorded_seq": 30}, {"session_id": "b", "recorded_seq": 20}]});
        let t = json!({"session_id": "d", "history": [{"session_id": "d", "recorded_seq": 25}, {"session_id": "b", "recorded_seq": 20}]});
        assert_eq!(compare_logs(Some(&s), Some(&t)).0.seq, json!(20));
        let t2 = json!({"session_id": "x", "history": [{"session_id": "y", "recorded_seq": 5}]});
        assert_eq!(compare_logs(Some(&s), Some(&t2)).0.seq, json!(0));
        assert_eq!(compare_logs(Some(&s), None).0.seq, json!(0));
        assert_eq!(compare_logs(None, None).0.seq, json!(0));
    }

    #[test]
    fn a_common_session_keeps_only_the_older_entries_as_couchdb_does() {
        let s = json!({"session_id": "c", "history": [
            {"session_id": "c", "recorded_seq": 30, "docs_read": 3},
            {"session_id": "b", "recorded_seq": 20, "docs_read": 2},
            {"session_id": "a", "recorded_seq": 10, "docs_read": 1}]});
        let t = json!({"session_id": "d", "history": [{"session_id": "b", "recorded_seq": 20}]});
        let (sp, h) = compare_logs(Some(&s), Some(&t));
        // Target's first entry `b` is found in the source's entries after its first one.
        assert_eq!(sp.seq, json!(20));
        assert!(h.is_empty(), "the target's entries after `b`: none");
        let (sp, h) = compare_logs(Some(&t), Some(&s));
        assert_eq!(sp.seq, json!(20));
        assert_eq!(h.len(), 0);
        let t2 = json!({"session_id": "e", "history": [{"session_id": "e"}, {"session_id": "b"}]});
        let (sp, h) = compare_logs(Some(&s), Some(&t2));
        assert_eq!(sp.seq, json!(20));
        assert_eq!(h.len(), 1);
        assert_eq!(
            sp.seed.unwrap().docs_read,
            1,
            "stats continue from the first entry kept"
        );
    }
}
