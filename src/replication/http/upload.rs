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

/// Why [`paced`] ended a source stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PaceError {
    /// The source sent nothing for `idle`, or too little for the time it was waited for.
    TooSlow(String),
    /// The transport failed.
    Failed(String),
}

impl std::fmt::Display for PaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooSlow(m) | Self::Failed(m) => f.write_str(m),
        }
    }
}

/// `inner`, failing when it makes its reader wait `idle` for the next chunk, or when the
/// time its reader spent waiting passes `idle` plus a second for every `min_bytes_per_sec`
/// bytes received (a trickle). The time the reader takes between chunks does not count: a
/// slow target is not the source's fault. Ends after the first error.
pub(crate) fn paced<S>(
    inner: S,
    idle: Duration,
    min_bytes_per_sec: u64,
) -> impl Stream<Item = Result<Bytes, PaceError>>
where
    S: Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
{
    let rate = min_bytes_per_sec.max(1) as f64;
    let start = (Box::pin(inner), Duration::ZERO, 0u64);
    futures::stream::unfold(Some(start), move |state| async move {
        let (mut s, waited, received) = state?;
        let earned = idle + Duration::from_secs_f64((received as f64 / rate).min(1e9));
        let left = earned.saturating_sub(waited).min(idle);
        // The clock runs now, while the reader waits for the next chunk.
        let asked = Instant::now();
        match tokio::time::timeout(left, s.next()).await {
            Ok(Some(Ok(b))) => {
                let n = b.len() as u64;
                Some((Ok(b), Some((s, waited + asked.elapsed(), received + n))))
            }
            Ok(Some(Err(e))) => Some((Err(PaceError::Failed(describe(&e))), None)),
            Ok(None) => None,
            Err(_) if left < idle => Some((
                Err(PaceError::TooSlow(format!(
                    "the endpoint sent {received} bytes in {} s of waiting, below \
                     min_bytes_per_sec {min_bytes_per_sec}",
                    (waited + left).as_secs()
                ))),
                None,
            )),
            Err(_) => Some((
                Err(PaceError::TooSlow(format!(
                    "the endpoint sent nothing for {} s",
                    idle.as_secs()
                ))),
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
        // 64 KiB every 3 s (well above the floor of 1 KiB/s), then silence.
        let inner = futures::stream::unfold(0, |i| async move {
            if i == 3 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            Some((Ok(Bytes::from(vec![b'x'; 64 << 10])), i + 1))
        });
        let mut s = std::pin::pin!(paced(inner, idle, 1));
        for _ in 0..3 {
            assert!(s.next().await.is_some_and(|r| r.is_ok()));
            // The reader pauses longer than `idle`: not the endpoint's fault.
            tokio::time::sleep(Duration::from_secs(20)).await;
        }
        let t = Instant::now();
        let e = s.next().await.unwrap().unwrap_err().to_string();
        assert!(e.contains("sent nothing for 5 s"), "{e}");
        assert_eq!(t.elapsed(), idle);
        assert!(s.next().await.is_none(), "the stream ends after its error");
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_ends_once_its_waiting_outgrows_what_it_brought() {
        let idle = Duration::from_secs(5);
        // A byte every second, for ever: never `idle` without a chunk.
        let inner = futures::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((Ok(Bytes::from_static(b"x")), ()))
        });
        let mut s = std::pin::pin!(paced(inner, idle, 10));
        let t = Instant::now();
        let mut got = 0;
        let e = loop {
            match s.next().await {
                Some(Ok(_)) => got += 1,
                Some(Err(e)) => break e,
                None => panic!("the stream ended without an error"),
            }
        };
        assert!(matches!(e, PaceError::TooSlow(_)), "{e}");
        // 5 s of grace plus 0.1 s per byte: the byte of each second earns a tenth of it.
        assert!((5..=6).contains(&got), "{got} bytes");
        assert!(t.elapsed() <= Duration::from_secs(7), "{:?}", t.elapsed());
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
