//! A fully read HTTP response, the unit that [`super::client::HttpClient::send`] returns and
//! that coalesced reads (`super::coalesce`) hand to every job that waited for them.

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use crate::replication::error::{ReplicationError, Result};

/// A fully read response.
#[derive(Debug)]
pub struct Resp {
    /// Status code.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
    /// The request it answers, as errors name it (`POST http://host/db/_revs_diff`, no
    /// credentials).
    pub request: String,
}

impl Resp {
    /// Parses the body as JSON whatever the Content-Type says (pouchdb-server sends
    /// `text/plain`).
    pub fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| {
            ReplicationError::BadResponse(format!(
                "{what}: invalid JSON ({e}) in the answer to {}",
                self.request
            ))
        })
    }
}
