//! One request sent as couch_replicator_httpc.erl sends it ([`HttpClient::run`]): paced by
//! the 429 hook ([`RateLimiter`](crate::replication::rate_limiter::RateLimiter)) without
//! consuming retries, one of the client's slots (and, buffered, the endpoint's gate) held per
//! try, one re-authentication after a 401/403, and connection errors, timeouts, 408 and 5xx
//! retried with doubling sleeps up to `retries_per_request`, within 60 s of the first failure.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use tokio::time::Instant;

use super::{HttpClient, Req, ReqBody, Resp, describe, strip_query};
use crate::backoff::Backoff;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::rate_limiter::RateKey;
use crate::telemetry::{NodeMetrics, Series};

/// First retry sleep.
const FIRST_WAIT: Duration = Duration::from_millis(250);
/// Give up retrying once the first failure is older than this (`health_threshold / 2`).
const RETRY_WINDOW: Duration = Duration::from_secs(60);

/// Why one try failed: worth another, or not.
enum Attempt {
    /// A transport failure (retried with backoff).
    Retry(String),
    /// Retrying cannot help (a cap tripped, a redirect loop).
    Fatal(ReplicationError),
}

/// What a request gave: the whole response, or one whose body the caller reads.
pub(super) enum Outcome {
    /// Read whole (`buffer`).
    Full(Resp),
    /// Headers only; the body is the caller's to read.
    Stream(reqwest::Response),
}

impl Outcome {
    fn status(&self) -> StatusCode {
        match self {
            Self::Full(r) => r.status,
            Self::Stream(r) => r.status(),
        }
    }
}

impl HttpClient {
    /// Sends `req` until an answer the retry rules do not consume, reading the body whole
    /// when `buffer`.
    pub(super) async fn run(&self, req: &Req, buffer: bool) -> Result<Outcome> {
        let key = RateKey::new(self.ep.url(), req.method.as_str());
        let mut attempt: u32 = 0;
        let mut wait = Backoff::new(FIRST_WAIT, Duration::from_secs(300));
        let mut first_failure: Option<Instant> = None;
        let mut reauthed = false;
        // The credentials' generation the last attempt was sent with.
        let mut credentials = 0;
        let what = format!("{} {}/{}", req.method, self.ep, strip_query(&req.path));
        loop {
            let pause = self.limiter.interval(&key);
            if pause >= self.limiter.max_interval() {
                return Err(ReplicationError::MaxBackoff(self.ep.to_string()));
            }
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            let result = self.try_once(req, buffer, &mut credentials, &what).await?;
            self.count_response(result.as_ref().map(Outcome::status).ok(), buffer);
            let retry_reason = match result {
                Ok(out) => {
                    let status = out.status();
                    if status == StatusCode::TOO_MANY_REQUESTS {
                        self.congestion.fetch_add(1, Ordering::Relaxed);
                        let next = self.limiter.failure(&key);
                        if next >= self.limiter.max_interval() {
                            return Err(ReplicationError::MaxBackoff(self.ep.to_string()));
                        }
                        tracing::debug!(%what, interval_ms = next.as_millis() as u64, "429, backing off");
                        continue;
                    }
                    self.limiter.success(&key);
                    if (status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN)
                        && !reauthed
                    {
                        reauthed = true;
                        if self.auth.on_rejected(&self.http, credentials).await {
                            continue;
                        }
                    }
                    if status == StatusCode::REQUEST_TIMEOUT || status.is_server_error() {
                        format!("HTTP {status}")
                    } else {
                        return Ok(out);
                    }
                }
                Err(Attempt::Retry(e)) => e,
                Err(Attempt::Fatal(e)) => return Err(e),
            };
            self.congestion.fetch_add(1, Ordering::Relaxed);
            let first = *first_failure.get_or_insert_with(Instant::now);
            if attempt >= self.cfg.retries_per_request || first.elapsed() > RETRY_WINDOW {
                return Err(ReplicationError::HttpRequestFailed(format!(
                    "{what}: {retry_reason}"
                )));
            }
            attempt += 1;
            NodeMetrics::add(&self.cfg.metrics.request_retries, 1);
            tracing::debug!(%what, attempt, reason = %retry_reason, "retrying request");
            wait.wait().await;
        }
    }

    /// One try with a slot of the client held (and, buffered, a permit of the endpoint's
    /// gate). The outer error: the client closed; the inner one: how the try failed.
    async fn try_once(
        &self,
        req: &Req,
        buffer: bool,
        credentials: &mut u64,
        what: &str,
    ) -> Result<Result<Outcome, Attempt>> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| ReplicationError::WorkerDied("client closed".into()))?;
        // A streamed response (a continuous feed) may stay open for hours: only
        // buffered requests pass the endpoint's gate.
        let _gate = if buffer {
            self.pass_gate().await?
        } else {
            None
        };
        self.cfg.metrics.inc(Series::Requests);
        let sent = Instant::now();
        let out = self.attempt(req, buffer, credentials, what).await;
        // Round trips decide a replication over a long link: this is where to see them.
        tracing::trace!(%what, status = ?out.as_ref().map(Outcome::status).ok(),
            ms = sent.elapsed().as_secs_f64() * 1e3, "request");
        Ok(out)
    }

    /// Sends the request once and, when `buffer`, reads its body whole within the limits.
    async fn attempt(
        &self,
        req: &Req,
        buffer: bool,
        credentials: &mut u64,
        what: &str,
    ) -> Result<Outcome, Attempt> {
        let mut rb = self
            .builder(req, credentials)
            .await
            .map_err(Attempt::Fatal)?;
        if let Some(body) = &req.body {
            rb = rb.header("content-type", req.content_type.as_ref());
            rb = match body {
                ReqBody::Whole(b) => rb.body(b.clone()),
                ReqBody::Parts(parts) => {
                    let len: usize = parts.iter().map(Bytes::len).sum();
                    let parts: Vec<Bytes> = parts.to_vec();
                    let stream =
                        futures::stream::iter(parts.into_iter().map(Ok::<_, std::io::Error>));
                    rb.header("content-length", len)
                        .body(reqwest::Body::wrap_stream(stream))
                }
            };
        }
        let resp = rb.send().await.map_err(|e| {
            if e.is_redirect() {
                // A redirect loop answers the same again: not worth a retry.
                Attempt::Fatal(ReplicationError::HttpRequestFailed(format!(
                    "{what}: more than {} redirects",
                    self.cfg.limits.max_redirects
                )))
            } else {
                Attempt::Retry(describe(&e))
            }
        })?;
        if !buffer {
            return Ok(Outcome::Stream(resp));
        }
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = self.read_body(resp, what).await.map_err(|e| match e {
            ReplicationError::HttpRequestFailed(m) => Attempt::Retry(m),
            other => Attempt::Fatal(other),
        })?;
        Ok(Outcome::Full(Resp {
            status,
            headers,
            body,
            request: what.to_owned(),
        }))
    }
}
