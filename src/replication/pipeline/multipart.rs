//! Reading CouchDB's multipart answers: the boundary of a `multipart/*` content type, a part's
//! type, and [`Watch`], which bounds what a multipart parser may hold without handing it on
//! and remembers why it cut the source (too much held, or too slow), for the job's reason.
//! `multer` buffers a part's headers until their blank line and everything the source sent
//! ahead of the part being read; a source that sends endless part headers (or a part the
//! reader never asks for) would grow that buffer without end, so the bytes taken from the
//! source but not yet handed on by any part are counted and capped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::replication::error::{ReplicationError, Result};

/// The `boundary` parameter of any `multipart/*` content type (`multer::parse_boundary`
/// accepts only `multipart/form-data`, CouchDB sends `multipart/mixed` and `/related`).
pub fn boundary_of(ctype: &str) -> Result<String> {
    let mut params = ctype.split(';');
    let is_multipart = params
        .next()
        .is_some_and(|m| m.trim().to_ascii_lowercase().starts_with("multipart/"));
    let boundary = params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
    });
    match boundary {
        Some(b) if is_multipart && !b.is_empty() => Ok(b),
        _ => Err(ReplicationError::BadResponse(format!(
            "no multipart boundary in content type `{ctype}`"
        ))),
    }
}

/// A multipart part's content type (JSON when it names none, as CouchDB's document parts).
pub(crate) fn part_type(field: &multer::Field<'_>) -> String {
    field
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned()
}

/// A multipart source's bytes taken but not yet handed on by one of its parts, and whether
/// it was cut for holding too many or for being too slow.
#[derive(Clone, Default)]
pub(crate) struct Watch {
    taken: Arc<AtomicU64>,
    handed: Arc<AtomicU64>,
    tripped: Arc<AtomicBool>,
    slow: Arc<AtomicBool>,
}

impl Watch {
    /// `source`, failing once more than `cap` of its bytes wait unhanded in the parser, and
    /// handing the parser one chunk per poll: `multer` pulls from its source until it is
    /// not ready, so behind a target slower than the source it took everything the source
    /// could send (16 MiB ahead, then the cap tripped, under a loaded test run). Between
    /// two chunks the guard says "not ready" and wakes its task at once: the parser hands on
    /// what it has first, and pulls more only when polled again.
    pub(crate) fn guard<S>(
        &self,
        source: S,
        cap: u64,
    ) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static
    where
        S: Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    {
        let me = self.clone();
        let counted = source.map(move |chunk| {
            let b = chunk?;
            let taken = me.taken.fetch_add(b.len() as u64, Ordering::Relaxed) + b.len() as u64;
            if taken.saturating_sub(me.handed.load(Ordering::Relaxed)) > cap {
                me.tripped.store(true, Ordering::Relaxed);
                return Err(std::io::Error::other(format!(
                    "more than {cap} bytes of multipart framing held unread"
                )));
            }
            Ok(b)
        });
        let mut counted = Box::pin(counted);
        let mut pause = false;
        futures::stream::poll_fn(move |cx| {
            if std::mem::take(&mut pause) {
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            let next = counted.as_mut().poll_next(cx);
            pause = matches!(next, std::task::Poll::Ready(Some(Ok(_))));
            next
        })
    }

    /// The source was cut as too slow (by `http::upload::paced`).
    pub(crate) fn too_slow(&self) {
        self.slow.store(true, Ordering::Relaxed);
    }

    /// `n` bytes of a part were handed on (to a target, or into a bounded buffer).
    pub(crate) fn handed(&self, n: usize) {
        self.handed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `e` as the limit it tripped, when the watch cut the source (`what` names the
    /// request); otherwise `e` unchanged.
    pub(crate) fn explain(&self, e: ReplicationError, what: &str) -> ReplicationError {
        if self.slow.load(Ordering::Relaxed) {
            ReplicationError::EndpointResponseTooSlow(format!(
                "{what}: {e}; the floor is [replicator] min_bytes_per_sec after connection_timeout"
            ))
        } else if self.tripped.load(Ordering::Relaxed) {
            ReplicationError::EndpointResponseTooLarge(format!(
                "{what} sent multipart framing (part headers or unread parts) past the cap; \
                 the cap is [replicator] max_response_bytes"
            ))
        } else {
            e
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_held_unhanded_past_the_cap_fail_the_source() {
        let watch = Watch::default();
        let chunks = (0..10).map(|_| Ok(Bytes::from(vec![0u8; 100])));
        let mut s = std::pin::pin!(watch.guard(futures::stream::iter(chunks), 240));
        assert!(s.next().await.is_some_and(|r| r.is_ok()));
        assert!(s.next().await.is_some_and(|r| r.is_ok()));
        watch.handed(150);
        assert!(
            s.next().await.is_some_and(|r| r.is_ok()),
            "300 taken, 150 handed"
        );
        assert!(
            s.next().await.is_some_and(|r| r.is_err()),
            "400 taken, 150 handed"
        );
        let e = watch.explain(ReplicationError::BadResponse("x".into()), "GET a/b");
        assert!(
            matches!(e, ReplicationError::EndpointResponseTooLarge(_)),
            "{e}"
        );
    }

    #[test]
    fn a_boundary_is_found_in_any_multipart_type() {
        assert_eq!(
            boundary_of("multipart/mixed; boundary=\"ab\"").unwrap(),
            "ab"
        );
        assert_eq!(boundary_of("Multipart/Related;BOUNDARY=cd").unwrap(), "cd");
        assert!(boundary_of("application/json; boundary=x").is_err());
        assert!(boundary_of("multipart/mixed").is_err());
    }
}
