//! The `_changes` row format both readers of a feed share: the changes reader, which turns
//! rows into work for a job, and the change watch's feed, which only needs their sequences.

use serde::Deserialize;
use serde_json::Value;

use super::endpoint::encode_query;
use super::error::{ReplicationError, Result};

/// One leaf revision of a change row.
#[derive(Debug, Deserialize)]
pub struct RevObj {
    pub(crate) rev: String,
}

/// One row of a `_changes` feed (a change, or the closing `last_seq`).
#[derive(Debug, Deserialize)]
pub struct Row {
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) seq: Option<Value>,
    #[serde(default)]
    pub(crate) changes: Vec<RevObj>,
    #[serde(default)]
    pub(crate) removed: bool,
    #[serde(default)]
    pub(crate) last_seq: Option<Value>,
}

/// Parses one line of a continuous `_changes` feed: `None` for a heartbeat (blank line), else
/// the row; anything that is not a JSON change row is a [`ReplicationError::BadResponse`]
/// naming the problem.
pub fn parse_feed_line(line: &[u8]) -> Result<Option<Row>> {
    let line = line.trim_ascii();
    if line.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(line)
        .map(Some)
        .map_err(|e| ReplicationError::BadResponse(format!("_changes line: {e}")))
}

/// Encodes a sequence for the `since` query argument: strings raw, others as JSON.
pub(crate) fn seq_arg(seq: &Value) -> String {
    match seq {
        Value::String(s) => encode_query(s),
        other => encode_query(&other.to_string()),
    }
}

/// The error for a `_changes` request answered with an unexpected `status`.
pub(crate) fn refused(
    endpoint: &impl std::fmt::Display,
    status: reqwest::StatusCode,
) -> ReplicationError {
    ReplicationError::ChangesReqFailed(format!("{endpoint}: _changes answered {status}"))
}
