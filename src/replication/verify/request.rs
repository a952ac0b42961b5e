//! The `"verify"` option of a one-shot `_replicate` body and of a `_replicator` document
//! (`true`, or `{"deep": true}`), and the JSON a completed replication carries for it: the
//! report, or `{"error", "reason"}` when the check could not run (the replication itself
//! succeeded, so that is information, not a failure).

use serde_json::{Map, Value, json};

use super::check::{VerifyOptions, verify};
use crate::replication::pipeline::run::Context;
use crate::replication::{ReplicationError, ReplicationSpec};

/// What `fields["verify"]` asks for; `Err` names what is wrong with it.
pub fn requested(fields: &Map<String, Value>) -> Result<Option<VerifyOptions>, String> {
    let deep = match fields.get("verify") {
        None | Some(Value::Null | Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => false,
        Some(Value::Object(o)) => match o.get("deep") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("`verify.deep` must be a boolean".into()),
        },
        Some(_) => return Err("`verify` must be a boolean or {\"deep\": boolean}".into()),
    };
    Ok(Some(VerifyOptions {
        deep,
        progress: None,
    }))
}

/// Runs the check after a replication: the report as JSON, or `{"error", "reason"}`.
pub async fn report_json(spec: &ReplicationSpec, opts: &VerifyOptions) -> Value {
    match verify(spec, &Context::default(), opts).await {
        Ok(r) => serde_json::to_value(r).unwrap_or(Value::Null),
        Err(e) => error_json(&e),
    }
}

/// A replication error as CouchDB's `{"error", "reason"}` (its text is `tag: reason`).
pub fn error_json(e: &ReplicationError) -> Value {
    let text = e.to_string();
    match text.split_once(": ") {
        Some((tag, reason)) => json!({"error": tag, "reason": reason}),
        None => json!({"error": "verify_failed", "reason": text}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_is_a_boolean_or_an_object_with_deep() {
        let f = |v: Value| requested(v.as_object().unwrap()).map(|o| o.map(|o| o.deep));
        assert_eq!(f(json!({})), Ok(None));
        assert_eq!(f(json!({"verify": false})), Ok(None));
        assert_eq!(f(json!({"verify": true})), Ok(Some(false)));
        assert_eq!(f(json!({"verify": {"deep": true}})), Ok(Some(true)));
        assert!(f(json!({"verify": 1})).is_err());
        assert!(f(json!({"verify": {"deep": "y"}})).is_err());
    }
}
