//! A request to an endpoint ([`Req`]) and its body ([`ReqBody`]): what the client sends, and
//! sends again on a retry, so every part of it is cheap to clone.

use std::sync::Arc;

use bytes::Bytes;
use reqwest::Method;

/// A request body. Cloned for every retry, so it only shares buffers.
#[derive(Debug, Clone)]
pub enum ReqBody {
    /// One buffer.
    Whole(Bytes),
    /// Buffers sent one after another, their total as the `Content-Length`: a `_bulk_docs`
    /// body of large documents goes out from the documents as fetched, not copied into one.
    Parts(Arc<[Bytes]>),
}

/// A request to send: relative path (with query), optional body.
#[derive(Debug, Clone)]
pub struct Req {
    /// HTTP method.
    pub method: Method,
    /// Path under the database, already encoded, with query string.
    pub path: String,
    /// Body (cheap to clone for retries).
    pub body: Option<ReqBody>,
    /// Content-Type of the body.
    pub content_type: std::borrow::Cow<'static, str>,
    /// Accept header.
    pub accept: &'static str,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// Sent on the client without a read timeout, for a streamed answer whose reader pauses
    /// (an attachment passed on to a target that is slow to take it): the reader then times
    /// the stream itself, counting only the time it waits for the next chunk.
    pub paced_by_reader: bool,
}

impl Req {
    /// A GET of `path`.
    pub fn get(path: impl Into<String>) -> Self {
        Self::new(Method::GET, path, None)
    }

    /// A request with a JSON body.
    pub fn json(method: Method, path: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self::new(method, path, Some(ReqBody::Whole(body.into())))
    }

    /// A request with a JSON body sent from `parts` in order.
    pub fn json_parts(method: Method, path: impl Into<String>, parts: Vec<Bytes>) -> Self {
        Self::new(method, path, Some(ReqBody::Parts(parts.into())))
    }

    fn new(method: Method, path: impl Into<String>, body: Option<ReqBody>) -> Self {
        Self {
            method,
            path: path.into(),
            body,
            content_type: "application/json".into(),
            accept: "application/json",
            headers: Vec::new(),
            paced_by_reader: false,
        }
    }
}
