//! The `_changes` row format both readers of a feed share: the changes reader, which turns
//! rows into work for a job, and the change watch's feed, which only needs their sequences.

use bytes::BytesMut;
use serde::Deserialize;
use serde_json::Value;
use tokio_util::codec::{Decoder, LinesCodec};

use crate::replication::endpoint::database::encode_query;
use crate::replication::error::{ReplicationError, Result};

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

/// The longest feed line accepted: a row lists one document's leaves, so anything near this is
/// not a change row, and holding more would let a broken server fill our memory.
const MAX_LINE: usize = 16 << 20;

/// Cuts a continuous feed's body into lines in time linear in its length: `LinesCodec`
/// remembers how far it has searched, and taking a line off the front moves no bytes.
pub(crate) struct FeedLines {
    codec: LinesCodec,
    buf: BytesMut,
}

impl FeedLines {
    pub(crate) fn new() -> Self {
        Self {
            codec: LinesCodec::new_with_max_length(MAX_LINE),
            buf: BytesMut::new(),
        }
    }

    /// Appends a chunk of the body.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole line, if one has arrived (without its `\n` / `\r\n`).
    pub(crate) fn next_line(&mut self) -> Result<Option<String>> {
        self.codec
            .decode(&mut self.buf)
            .map_err(|e| ReplicationError::BadResponse(format!("_changes line: {e}")))
    }
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
