//! Timing an attachment passed from source to target by its progress, not by reqwest's read
//! timeout, which runs while a request body is still being sent (it cut every upload longer
//! than `connection_timeout`) and while the reader of an answer pauses (it cut the source's
//! answer whenever the target was slow to take it): an upload's [`Upload`] progress and when
//! it counts as stalled, and [`paced`], a source stream timed only while it is waited for.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::client::describe;

/// `inner`, failing when it makes its reader wait `idle` for the next chunk; the time the
/// reader takes between chunks does not count. Ends after the first error.
pub(crate) fn paced<S>(inner: S, idle: Duration) -> impl Stream<Item = Result<Bytes, String>>
where
    S: Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
{
    futures::stream::unfold(Some(Box::pin(inner)), move |state| async move {
        let mut s = state?;
        // The deadline starts now, when the reader asks for the next chunk.
        match tokio::time::timeout(idle, s.next()).await {
            Ok(Some(Ok(b))) => Some((Ok(b), Some(s))),
            Ok(Some(Err(e))) => Some((Err(describe(&e)), None)),
            Ok(None) => None,
            Err(_) => Some((
                Err(format!("the endpoint sent nothing for {} s", idle.as_secs())),
                None,
            )),
        }
    })
}

/// How far a streamed upload got: what `HttpClient::send_once` times it by.
pub(crate) struct Upload {
    started: Instant,
    /// Milliseconds from `started` to the last chunk taken from the body.
    last_ms: AtomicU64,
    sent: AtomicU64,
    ended: AtomicBool,
}

impl Upload {
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            ended: AtomicBool::new(false),
        }
    }

    pub(crate) fn moved(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Resolves, with why, once the upload stalled: while the body is sent, the target may
    /// stop reading for `4 x idle` (it writes to disk meanwhile); once it is sent, it has
    /// `idle` plus a second per MiB received to answer (CouchDB syncs an attachment before
    /// it answers). CouchDB's replicator waits `connection_timeout` for the answer alone.
    pub(crate) async fn stalled(&self, idle: Duration) -> String {
        loop {
            let last = self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let sent = self.sent.load(Ordering::Relaxed);
            let (limit, what) = if self.ended.load(Ordering::Relaxed) {
                (idle + Duration::from_secs(sent >> 20), "no answer")
            } else {
                (idle * 4, "the target stopped reading the body")
            };
            if Instant::now() >= last + limit {
                return format!("{what} for {} s ({sent} bytes sent)", limit.as_secs());
            }
            tokio::time::sleep_until(last + limit).await;
        }
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_the_wait_for_a_chunk_counts_not_the_readers_pauses() {
        let idle = Duration::from_secs(5);
        // A chunk every 3 s, then silence.
        let inner = futures::stream::unfold(0, |i| async move {
            if i == 3 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            Some((Ok(Bytes::from_static(b"x")), i + 1))
        });
        let mut s = std::pin::pin!(paced(inner, idle));
        for _ in 0..3 {
            assert!(s.next().await.is_some_and(|r| r.is_ok()));
            // The reader pauses longer than `idle`: not the endpoint's fault.
            tokio::time::sleep(Duration::from_secs(20)).await;
        }
        let t = Instant::now();
        let e = s.next().await.unwrap().unwrap_err();
        assert!(e.contains("sent nothing for 5 s"), "{e}");
        assert_eq!(t.elapsed(), idle);
        assert!(s.next().await.is_none(), "the stream ends after its error");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sent_body_waits_longer_for_its_answer_the_larger_it_was() {
        let idle = Duration::from_secs(5);
        let up = Upload::new();
        up.moved(1 << 20);
        let t = Instant::now();
        let why = up.stalled(idle).await;
        assert!(why.starts_with("the target stopped reading"), "{why}");
        assert_eq!(t.elapsed(), idle * 4);
        let up = Upload::new();
        up.moved(100 << 20);
        up.end();
        let t = Instant::now();
        let why = up.stalled(idle).await;
        assert!(why.starts_with("no answer"), "{why}");
        assert_eq!(t.elapsed(), idle + Duration::from_secs(100));
    }
}
