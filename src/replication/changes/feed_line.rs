//! The `_changes` row format both readers of a feed share: the changes reader, which turns
//! rows into work for a job, and the change watch's feed, which only needs their sequences.

use std::time::Duration;

use bytes::BytesMut;
use serde::Deserialize;
use serde_json::Value;
use tokio_util::codec::{Decoder, LinesCodec, LinesCodecError};

use crate::replication::endpoint::database::encode_query;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::limits::{EndpointLimits, Pace};

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

/// Cuts a continuous feed's body into lines in time linear in its length: `LinesCodec`
/// remembers how far it has searched, and taking a line off the front moves no bytes. A line
/// longer than `max_feed_line_bytes`, or one that arrives slower than the endpoint's pace
/// (a line's grace is `connection_timeout`; heartbeats are lines), ends the feed.
pub(crate) struct FeedLines {
    codec: LinesCodec,
    buf: BytesMut,
    max: usize,
    pace: Pace,
}

impl FeedLines {
    pub(crate) fn new(limits: &EndpointLimits, connection_timeout: Duration) -> Self {
        Self {
            codec: LinesCodec::new_with_max_length(limits.max_feed_line_bytes),
            buf: BytesMut::new(),
            max: limits.max_feed_line_bytes,
            pace: limits.pace(connection_timeout),
        }
    }

    /// Appends a chunk of the body; an error when the line it continues is too slow.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<()> {
        if self.buf.is_empty() {
            // A line's time starts at its first byte.
            self.pace.restart();
        }
        self.buf.extend_from_slice(chunk);
        if tokio::time::Instant::now() > self.pace.deadline(self.buf.len() as u64) {
            return Err(ReplicationError::EndpointResponseTooSlow(format!(
                "_changes: {} bytes of one line in {:.0} s, slower than {} bytes per second",
                self.buf.len(),
                self.pace.elapsed().as_secs_f64(),
                self.pace.rate()
            )));
        }
        Ok(())
    }

    /// The next whole line, if one has arrived (without its `\n` / `\r\n`).
    pub(crate) fn next_line(&mut self) -> Result<Option<String>> {
        match self.codec.decode(&mut self.buf) {
            Ok(Some(line)) => {
                self.pace.restart();
                Ok(Some(line))
            }
            Ok(None) => Ok(None),
            Err(LinesCodecError::MaxLineLengthExceeded) => {
                Err(ReplicationError::EndpointResponseTooLarge(format!(
                    "_changes: a line longer than {} bytes; the cap is [replicator] max_feed_line_bytes",
                    self.max
                )))
            }
            Err(e) => Err(ReplicationError::BadResponse(format!("_changes line: {e}"))),
        }
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
