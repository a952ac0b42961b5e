//! Parsing and validation of replication requests, with no I/O: a `_replicator` database
//! document (what the doc processor sees on `_changes`) and a `POST /_replicate` body (what the
//! HTTP API receives). Both become the engine's [`ReplicationSpec`]; the document-level rules
//! (design docs, `_replication_state`, `owner`, `user_ctx`, `cancel`) live here so the doc
//! processor and the HTTP layer share one set of reasons. Nothing here panics on any input.

use serde_json::{Map, Value};

use crate::replication::ReplicationSpec;

/// Why a replication document or request body was rejected. The text is what CouchDB writes
/// into `_replication_state_reason` / the `reason` of a 400 reply; it never holds a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRepDoc(pub String);

fn bad(msg: impl Into<String>) -> InvalidRepDoc {
    InvalidRepDoc(msg.into())
}

/// The `_replication_state` a document carries (CouchDB's couch_replicator_doc_processor.erl).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocState {
    /// No state field: a new or edited document to process.
    New,
    /// `triggered`, written by older replicators or `update_docs`: processed like a new doc.
    Triggered,
    /// `error`, written by older replicators or `update_docs`: processed like a new doc.
    Error,
    /// `completed`: terminal, the processor forgets the document.
    Completed,
    /// `failed`: terminal, the processor ignores the document.
    Failed,
}

impl DocState {
    fn parse(v: Option<&Value>) -> Result<Self, InvalidRepDoc> {
        match v {
            None | Some(Value::Null) => Ok(Self::New),
            Some(Value::String(s)) => match s.as_str() {
                "triggered" => Ok(Self::Triggered),
                "error" => Ok(Self::Error),
                "completed" => Ok(Self::Completed),
                "failed" => Ok(Self::Failed),
                other => Err(bad(format!(
                    "`_replication_state` `{other}` is not one of triggered, error, completed, failed"
                ))),
            },
            Some(_) => Err(bad("`_replication_state` must be a string")),
        }
    }

    /// True for `completed` and `failed`, which the processor never schedules again.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }
}

/// The user a replication runs for (`user_ctx` of a document, or the HTTP caller).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserCtx {
    /// User name; `None` for an anonymous caller.
    pub name: Option<String>,
    /// Roles (`_admin` for server admins).
    pub roles: Vec<String>,
}

impl UserCtx {
    /// True when the user is a server admin.
    pub(crate) fn is_admin(&self) -> bool {
        self.roles.iter().any(|r| r == "_admin")
    }

    fn parse(v: Option<&Value>) -> Result<Option<Self>, InvalidRepDoc> {
        let m = match v {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(m)) => m,
            Some(_) => return Err(bad("`user_ctx` must be a JSON object")),
        };
        let name = match m.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad("`user_ctx.name` must be a string or null")),
        };
        let roles = match m.get("roles") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|r| {
                    r.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| bad("`user_ctx.roles` must be an array of strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad("`user_ctx.roles` must be an array of strings")),
        };
        Ok(Some(Self { name, roles }))
    }
}

/// A valid `_replicator` document.
#[derive(Debug, Clone, PartialEq)]
pub struct RepDoc {
    /// `_id`.
    pub doc_id: String,
    /// `_rev`, needed to write the terminal state back.
    pub rev: Option<String>,
    /// What to replicate.
    pub spec: ReplicationSpec,
    /// `owner` (the user who wrote the document), if stamped.
    pub owner: Option<String>,
    /// `user_ctx`, if given.
    pub user_ctx: Option<UserCtx>,
}

/// What the doc processor must do with one `_changes` row of a `_replicator` database.
#[derive(Debug, Clone, PartialEq)]
pub enum DocAction {
    /// Not a replication (design or local doc): nothing to do.
    Skip,
    /// The document was deleted: remove its job.
    Remove {
        /// `_id`.
        doc_id: String,
    },
    /// `completed` or `failed`: the job (if any) stays as it is; nothing is scheduled.
    Terminal {
        /// `_id`.
        doc_id: String,
        /// Which terminal state.
        state: DocState,
    },
    /// A valid replication: create or update its job.
    Schedule(Box<RepDoc>),
    /// Invalid: the document gets `failed` with this reason (terminal, CouchDB's couch_replicator_doc_processor.erl).
    Fail {
        /// `_id`.
        doc_id: String,
        /// `_rev` to write over.
        rev: Option<String>,
        /// Why.
        reason: InvalidRepDoc,
    },
}

/// Decides what a `_changes` row's document (fetched with `include_docs=true`) means. A row
/// without a usable `_id` is skipped: there is no document to write a reason to.
pub fn classify_change(doc: &Value) -> DocAction {
    let Some(m) = doc.as_object() else {
        return DocAction::Skip;
    };
    let Some(doc_id) = m.get("_id").and_then(Value::as_str) else {
        return DocAction::Skip;
    };
    if doc_id.starts_with("_design/") || doc_id.starts_with("_local/") {
        return DocAction::Skip;
    }
    if m.get("_deleted").and_then(Value::as_bool) == Some(true) {
        return DocAction::Remove {
            doc_id: doc_id.to_owned(),
        };
    }
    match DocState::parse(m.get("_replication_state")) {
        Ok(state) if state.is_terminal() => {
            return DocAction::Terminal {
                doc_id: doc_id.to_owned(),
                state,
            };
        }
        _ => {}
    }
    match parse_rep_doc(doc) {
        Ok(d) => DocAction::Schedule(Box::new(d)),
        Err(reason) => DocAction::Fail {
            doc_id: doc_id.to_owned(),
            rev: m.get("_rev").and_then(Value::as_str).map(str::to_owned),
            reason,
        },
    }
}

/// Parses a `_replicator` document into a [`RepDoc`].
pub fn parse_rep_doc(doc: &Value) -> Result<RepDoc, InvalidRepDoc> {
    let m = doc
        .as_object()
        .ok_or_else(|| bad("the replication document must be a JSON object"))?;
    let doc_id = match m.get("_id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => {
            return Err(bad(
                "the replication document needs a non-empty string `_id`",
            ));
        }
    };
    let rev = match m.get("_rev") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("`_rev` must be a string")),
    };
    DocState::parse(m.get("_replication_state"))?;
    if m.get("cancel").and_then(Value::as_bool) == Some(true) {
        return Err(bad(
            "`cancel` is not allowed in a _replicator document: delete the document to stop the replication",
        ));
    }
    let owner = match m.get("owner") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("`owner` must be a string")),
    };
    let user_ctx = UserCtx::parse(m.get("user_ctx"))?;
    let spec = parse_spec(m)?;
    Ok(RepDoc {
        doc_id,
        rev,
        spec,
        owner,
        user_ctx,
    })
}

/// A parsed `POST /_replicate` body.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplicateRequest {
    /// Start (or join) a transient replication.
    Start(Box<ReplicationSpec>),
    /// `cancel: true` naming the job by `id` / `_local_id` / `replication_id`.
    CancelById(String),
    /// `cancel: true` with source and target: the job is the one they identify.
    CancelBySpec(Box<ReplicationSpec>),
}

/// Parses a `POST /_replicate` body. `user_ctx` in the body is ignored: a transient job runs
/// as the authenticated caller, as in CouchDB.
pub fn parse_replicate_body(body: &Value) -> Result<ReplicateRequest, InvalidRepDoc> {
    let m = body
        .as_object()
        .ok_or_else(|| bad("the request body must be a JSON object"))?;
    let cancel = match m.get("cancel") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`cancel` must be a boolean")),
    };
    if cancel {
        for key in ["id", "_local_id", "replication_id"] {
            match m.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if !s.is_empty() => {
                    return Ok(ReplicateRequest::CancelById(s.clone()));
                }
                Some(_) => return Err(bad(format!("`{key}` must be a non-empty string"))),
            }
        }
        return parse_spec(m).map(|s| ReplicateRequest::CancelBySpec(Box::new(s)));
    }
    parse_spec(m).map(|s| ReplicateRequest::Start(Box::new(s)))
}

fn parse_spec(m: &Map<String, Value>) -> Result<ReplicationSpec, InvalidRepDoc> {
    for key in ["source", "target"] {
        match m.get(key) {
            Some(Value::String(_) | Value::Object(_)) => {}
            // CouchDB's wording, which existing clients may look for.
            _ => {
                return Err(bad(format!(
                    "The `{key}' property must exist and be either a string or an object."
                )));
            }
        }
    }
    // The engine's parser owns the option rules; its messages are already redacted.
    let mut spec =
        ReplicationSpec::from_json(&Value::Object(m.clone())).map_err(|e| bad(e.to_string()))?;
    // `cancel` is a request verb, not an option of the job.
    spec.options.cancel = false;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::Filter;
    use proptest::prelude::*;
    use serde_json::json;

    fn reason(doc: Value) -> String {
        match classify_change(&doc) {
            DocAction::Fail { reason, .. } => reason.0,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn good_doc_is_scheduled_with_its_options() {
        let doc = json!({"_id": "r1", "_rev": "1-a", "source": "http://u:pw@127.0.0.1:1/a",
            "target": {"url": "http://127.0.0.1:2/b"}, "continuous": true,
            "doc_ids": ["x"], "owner": "bob", "user_ctx": {"name": "bob", "roles": ["r"]}});
        let DocAction::Schedule(d) = classify_change(&doc) else {
            panic!("not scheduled");
        };
        assert_eq!(d.doc_id, "r1");
        assert_eq!(d.rev.as_deref(), Some("1-a"));
        assert!(d.spec.options.continuous);
        assert_eq!(d.spec.options.filter, Filter::DocIds(vec!["x".into()]));
        assert_eq!(d.spec.source.user(), Some("u"));
        assert_eq!(d.owner.as_deref(), Some("bob"));
        assert_eq!(d.user_ctx.unwrap().roles, vec!["r".to_string()]);
    }

    #[test]
    fn out_of_range_numbers_fail_the_doc_naming_the_option() {
        let doc = json!({"_id": "r", "source": "http://127.0.0.1:1/a",
            "target": "http://127.0.0.1:1/b", "http_connections": 1_000_000_000u64});
        let r = reason(doc);
        assert!(
            r.contains("`http_connections` must be an integer from 1 to 1000"),
            "{r}"
        );
    }

    #[test]
    fn triggered_and_error_docs_are_processed_again() {
        for st in ["triggered", "error"] {
            let doc = json!({"_id": "r", "source": "http://127.0.0.1:1/a",
                "target": "http://127.0.0.1:1/b", "_replication_state": st});
            assert!(
                matches!(classify_change(&doc), DocAction::Schedule(_)),
                "{st}"
            );
        }
    }

    #[test]
    fn terminal_deleted_and_design_docs() {
        let done = json!({"_id": "r", "_replication_state": "completed"});
        assert_eq!(
            classify_change(&done),
            DocAction::Terminal {
                doc_id: "r".into(),
                state: DocState::Completed
            }
        );
        // A failed doc stays failed even though it is still invalid.
        let failed = json!({"_id": "r", "_replication_state": "failed", "source": 1});
        assert!(matches!(
            classify_change(&failed),
            DocAction::Terminal {
                state: DocState::Failed,
                ..
            }
        ));
        let del = json!({"_id": "r", "_deleted": true});
        assert_eq!(
            classify_change(&del),
            DocAction::Remove { doc_id: "r".into() }
        );
        assert_eq!(
            classify_change(&json!({"_id": "_design/x", "views": {}})),
            DocAction::Skip
        );
        assert_eq!(classify_change(&json!([1, 2])), DocAction::Skip);
        assert_eq!(classify_change(&json!({"source": "x"})), DocAction::Skip);
    }

    #[test]
    fn bad_docs_fail_with_clear_reasons() {
        let base = |extra: Value| {
            let mut d = json!({"_id": "r", "_rev": "2-b", "source": "http://127.0.0.1:1/a",
                "target": "http://127.0.0.1:1/b"});
            for (k, v) in extra.as_object().unwrap() {
                d[k] = v.clone();
            }
            d
        };
        assert_eq!(
            reason(json!({"_id": "r", "target": "http://127.0.0.1:1/b"})),
            "The `source' property must exist and be either a string or an object."
        );
        assert!(reason(base(json!({"source": 42}))).contains("`source' property must exist"));
        assert!(reason(base(json!({"target": "ftp://h/db"}))).contains("unsupported protocol"));
        assert!(reason(base(json!({"worker_processes": 0}))).contains("worker_processes"));
        assert!(reason(base(json!({"cancel": true}))).contains("cancel"));
        assert!(reason(base(json!({"user_ctx": {"roles": "admin"}}))).contains("user_ctx.roles"));
        assert!(reason(base(json!({"owner": 7}))).contains("owner"));
        assert!(reason(base(json!({"_replication_state": "bogus"}))).contains("bogus"));
        assert!(reason(base(json!({"selector": {}, "filter": "d/f"}))).contains("selector"));
        let secret = reason(base(json!({"source": "htp://u:hunter2@h/db"})));
        assert!(!secret.contains("hunter2"), "{secret}");
        // The rev travels with the failure so the processor can write it back.
        assert!(matches!(
            classify_change(&base(json!({"continuous": "yes"}))),
            DocAction::Fail { rev: Some(r), .. } if r == "2-b"
        ));
    }

    #[test]
    fn replicate_bodies() {
        let start = json!({"source": "http://127.0.0.1:1/a", "target": "http://127.0.0.1:1/b",
            "continuous": true, "user_ctx": {"name": "mallory", "roles": ["_admin"]}});
        let ReplicateRequest::Start(spec) = parse_replicate_body(&start).unwrap() else {
            panic!("not a start");
        };
        assert!(spec.options.continuous && !spec.options.cancel);
        assert_eq!(
            parse_replicate_body(&json!({"cancel": true, "replication_id": "abc+continuous"})),
            Ok(ReplicateRequest::CancelById("abc+continuous".into()))
        );
        assert!(matches!(
            parse_replicate_body(&json!({"cancel": true, "source": "http://127.0.0.1:1/a",
                "target": "http://127.0.0.1:1/b"})),
            Ok(ReplicateRequest::CancelBySpec(_))
        ));
        assert_eq!(
            parse_replicate_body(&json!({"cancel": "yes"}))
                .unwrap_err()
                .0,
            "`cancel` must be a boolean"
        );
        assert_eq!(
            parse_replicate_body(&json!({"cancel": true}))
                .unwrap_err()
                .0,
            "The `source' property must exist and be either a string or an object."
        );
        assert!(parse_replicate_body(&json!("x")).is_err());
    }

    proptest! {
        #[test]
        fn failure_reasons_never_leak_passwords(pw in "[a-z]{8,12}", n in 0i64..3) {
            let doc = json!({"_id": "r", "source": format!("http://u:{pw}@127.0.0.1/a"),
                "target": format!("bogus://u:{pw}@h/b"), "worker_processes": n});
            if let DocAction::Fail { reason, .. } = classify_change(&doc) {
                prop_assert!(!reason.0.contains(&pw));
            }
        }
    }
}
