//! Reading a body into memory within the endpoint's limits ([`super::limits`]): the cap is
//! checked as chunks arrive (and against a declared `Content-Length` before any), so nothing
//! larger than the cap is ever held, and a body that trickles ends at its [`Pace`] deadline.
//! Used for whole responses and for the multipart parts kept in memory.

use bytes::Bytes;
use futures::{Stream, StreamExt};

use std::sync::Arc;

use super::budget::{ResponseBudget, Share};
use super::limits::Pace;

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// More than `cap` bytes (`read` so far, or declared by `Content-Length`).
    #[error("more than {cap} bytes ({read} {how})")]
    TooLarge {
        /// Bytes read, or declared.
        read: u64,
        /// The cap in force.
        cap: u64,
        /// "read" or "declared by Content-Length".
        how: &'static str,
    },
    /// The body did not keep its pace.
    #[error("{read} bytes in {secs:.0} s, slower than {rate} bytes per second")]
    TooSlow {
        /// Bytes read when the deadline passed.
        read: u64,
        /// Seconds spent reading.
        secs: f64,
        /// The minimum rate.
        rate: u64,
    },
    /// The connection failed while reading (retryable).
    #[error("{0}")]
    Transport(String),
}

/// How a body is read: its cap and pace, and the node's budget it reads within (waiting for
/// it up to `patience`). With `keep`, the body keeps its share of the budget until its last
/// copy is dropped: a document held until written counts as long as it is held.
pub(crate) struct Bounds<'a> {
    pub(crate) cap: u64,
    pub(crate) pace: Pace,
    pub(crate) budget: &'a Arc<ResponseBudget>,
    pub(crate) patience: std::time::Duration,
    pub(crate) keep: bool,
}

/// A body with the share of the budget it keeps.
struct Kept {
    body: Bytes,
    _share: Share,
}

impl AsRef<[u8]> for Kept {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

/// Reads `stream` whole, holding at most `cap` bytes; `declared` is the `Content-Length`.
/// The pace starts at the first byte.
pub(crate) async fn collect<S>(
    stream: S,
    declared: Option<u64>,
    b: Bounds<'_>,
) -> Result<Bytes, BodyError>
where
    S: Stream<Item = Result<Bytes, String>>,
{
    let Bounds {
        cap,
        mut pace,
        budget,
        patience,
        keep,
    } = b;
    // No body can outgrow the node's whole budget.
    let cap = cap.min(budget.total_bytes() + super::budget::UNBUDGETED_BYTES);
    if let Some(n) = declared.filter(|n| *n > cap) {
        return Err(BodyError::TooLarge {
            read: n,
            cap,
            how: "declared by Content-Length",
        });
    }
    let mut stream = std::pin::pin!(stream);
    // Chunks are copied out of the transport's buffers: a chunk shares its allocation with
    // the unused rest of a read buffer, and held as it comes, a body took twice its size.
    // One buffer grows by doubling (gathering the chunks and joining them at the end held
    // every large body twice for a moment), and the budget covers the buffer's capacity, not
    // the bytes in it: covering only the bytes, bodies read at once held up to twice the
    // budget (big_data bench, 2026-11-29). The old buffer, freed as soon as the allocator
    // has moved the bytes, is not counted.
    let mut body: Vec<u8> = Vec::new();
    // A first chunk of a megabyte or more is not a transport's read buffer (those are
    // smaller) but a part the multipart parser has gathered whole: kept as it is unless more follows.
    let mut whole: Option<Bytes> = None;
    let mut received: u64 = 0;
    let mut share = budget.share();
    let wait_err = |e: super::budget::BudgetSpent| {
        BodyError::Transport(format!(
            "waited {:.0} s for the node's response budget ([replicator] response_budget_bytes)",
            e.waited.as_secs_f64()
        ))
    };
    // Until the first byte only the read timeout applies: a long poll is silent, then whole.
    let far = tokio::time::Instant::now() + std::time::Duration::from_secs(86_400 * 365);
    loop {
        let deadline = if received == 0 {
            far
        } else {
            pace.deadline(received)
        };
        let next = tokio::select! {
            n = stream.next() => n,
            _ = tokio::time::sleep_until(deadline) => {
                return Err(BodyError::TooSlow {
                    read: received,
                    secs: pace.elapsed().as_secs_f64(),
                    rate: pace.rate(),
                });
            }
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(BodyError::Transport)?;
        if received == 0 {
            pace.restart();
        }
        received += chunk.len() as u64;
        if received > cap {
            return Err(BodyError::TooLarge {
                read: received,
                cap,
                how: "read",
            });
        }
        if received == chunk.len() as u64 && chunk.len() >= WHOLE_CHUNK_MIN {
            share.cover(received, patience).await.map_err(wait_err)?;
            whole = Some(chunk);
            continue;
        }
        let first = whole.take();
        let first_len = first.as_ref().map_or(0, Bytes::len);
        let needed = body.len() + first_len + chunk.len();
        if needed > body.capacity() {
            let grown = grown_capacity(body.capacity(), needed, cap, declared);
            share
                .cover((grown + first_len) as u64, patience)
                .await
                .map_err(wait_err)?;
            body.reserve_exact(grown - body.len());
        }
        if let Some(first) = first {
            body.extend_from_slice(&first);
        }
        body.extend_from_slice(&chunk);
        share.fit(body.capacity() as u64);
    }
    let (body, occupied) = match whole {
        Some(w) => (w, received),
        None => {
            let occupied = body.capacity() as u64;
            (Bytes::from(body), occupied)
        }
    };
    if keep && share.holds_any() {
        share.fit(occupied);
        return Ok(Bytes::from_owner(Kept {
            body,
            _share: share,
        }));
    }
    Ok(body)
}

/// The capacity a body's buffer grows to when `needed` bytes no longer fit in `now`: the
/// declared length when it holds them, else double (at least [`MIN_BUFFER`]), never past the
/// cap unless `needed` is.
fn grown_capacity(now: usize, needed: usize, cap: u64, declared: Option<u64>) -> usize {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    if let Some(d) = declared
        .and_then(|d| usize::try_from(d).ok())
        .filter(|d| *d >= needed && *d <= cap)
    {
        return d;
    }
    needed
        .max(now.saturating_mul(2))
        .max(MIN_BUFFER)
        .min(cap.max(needed))
}

/// The smallest buffer a body starts with.
const MIN_BUFFER: usize = 8 << 10;

/// The size from which a first chunk is kept without a copy.
const WHOLE_CHUNK_MIN: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::replication::http::limits::EndpointLimits;

    fn chunks(n: usize, size: usize) -> impl Stream<Item = Result<Bytes, String>> {
        futures::stream::iter((0..n).map(move |_| Ok(Bytes::from(vec![b'a'; size]))))
    }

    fn budget() -> Arc<ResponseBudget> {
        Arc::new(ResponseBudget::new(64 << 20, Default::default()))
    }

    fn bounds(cap: u64, budget: &Arc<ResponseBudget>) -> Bounds<'_> {
        Bounds {
            cap,
            pace: EndpointLimits::default().pace(Duration::from_secs(30)),
            budget,
            patience: Duration::from_secs(1),
            keep: false,
        }
    }

    #[tokio::test]
    async fn a_kept_body_holds_its_share_until_its_last_copy_goes() {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = Arc::new(crate::telemetry::NodeMetrics::default());
        let budget = Arc::new(ResponseBudget::new(64 << 20, metrics.clone()));
        let held = || metrics.response_bytes_held.load(Relaxed);
        let kept = Bounds {
            keep: true,
            ..bounds(8 << 20, &budget)
        };
        // 3 MiB in 1 KiB chunks: the buffer doubled to 4 MiB, and that is what it holds.
        let body = collect(chunks(3072, 1024), None, kept).await.unwrap();
        assert_eq!(body.len(), 3 << 20);
        let over = (4 << 20) - super::super::budget::UNBUDGETED_BYTES;
        assert_eq!(held(), over);
        let part = body.slice(10..20);
        drop(body);
        assert_eq!(held(), over, "a slice keeps the share");
        drop(part);
        assert_eq!(held(), 0);
        // Without keep, the share goes when reading ends.
        let body = collect(chunks(3072, 1024), None, bounds(8 << 20, &budget))
            .await
            .unwrap();
        assert_eq!((body.len(), held()), (3 << 20, 0));
    }

    #[tokio::test]
    async fn a_growing_body_covers_its_whole_buffer() {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = Arc::new(crate::telemetry::NodeMetrics::default());
        let budget = Arc::new(ResponseBudget::new(7 << 20, metrics.clone()));
        let kept = |budget| Bounds {
            keep: true,
            ..bounds(8 << 20, budget)
        };
        let a = collect(chunks(3072, 1024), None, kept(&budget))
            .await
            .unwrap();
        let free = super::super::budget::UNBUDGETED_BYTES;
        assert_eq!(metrics.response_bytes_held.load(Relaxed), (4 << 20) - free);
        // A second 3 MiB body's bytes fit in the 3.25 MiB left, but not the 4 MiB buffer
        // they grow into: it waits, then gives up.
        let err = collect(chunks(3072, 1024), None, kept(&budget))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, BodyError::Transport(m) if m.contains("response budget")),
            "{err:?}"
        );
        assert_eq!(metrics.response_bytes_held.load(Relaxed), (4 << 20) - free);
        drop(a);
        let b = collect(chunks(3072, 1024), None, kept(&budget))
            .await
            .unwrap();
        assert_eq!(b.len(), 3 << 20);
        // A declared length is allocated once, exactly.
        drop(b);
        let c = collect(chunks(3072, 1024), Some(3 << 20), kept(&budget))
            .await
            .unwrap();
        assert_eq!(c.len(), 3 << 20);
        assert_eq!(metrics.response_bytes_held.load(Relaxed), (3 << 20) - free);
    }

    #[test]
    fn buffers_double_up_to_the_cap_or_take_the_declared_length() {
        assert_eq!(grown_capacity(0, 10, 1 << 20, None), MIN_BUFFER);
        assert_eq!(
            grown_capacity(MIN_BUFFER, MIN_BUFFER + 1, 1 << 20, None),
            2 * MIN_BUFFER
        );
        assert_eq!(
            grown_capacity(768 << 10, (768 << 10) + 1, 1 << 20, None),
            1 << 20
        );
        assert_eq!(grown_capacity(0, 10, 1 << 20, Some(1000)), 1000);
        // A declared length past the cap or short of the bytes is not believed.
        assert_eq!(grown_capacity(0, 10, 1 << 20, Some(2 << 20)), MIN_BUFFER);
        assert_eq!(
            grown_capacity(MIN_BUFFER, MIN_BUFFER + 1, 1 << 20, Some(5)),
            2 * MIN_BUFFER
        );
    }

    #[tokio::test]
    async fn a_body_within_the_cap_is_read_whole() {
        let budget = budget();
        let body = collect(chunks(4, 10), Some(40), bounds(40, &budget))
            .await
            .unwrap();
        assert_eq!(body.len(), 40);
    }

    #[tokio::test]
    async fn the_cap_stops_reading_at_the_first_chunk_past_it() {
        let budget = budget();
        let err = collect(chunks(1000, 10), None, bounds(45, &budget))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                BodyError::TooLarge {
                    read: 50,
                    cap: 45,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = collect(chunks(1, 10), Some(1 << 40), bounds(45, &budget))
            .await
            .unwrap_err();
        assert!(matches!(err, BodyError::TooLarge { read, .. } if read == 1 << 40));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_ends_at_its_deadline() {
        let limits = EndpointLimits {
            min_bytes_per_sec: 10,
            ..EndpointLimits::default()
        };
        // One byte a second: 5 s of grace, then 10 bytes a second are owed.
        let trickle = futures::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((Ok(Bytes::from_static(b"a")), ()))
        });
        let started = tokio::time::Instant::now();
        let budget = budget();
        let b = Bounds {
            pace: limits.pace(Duration::from_secs(5)),
            ..bounds(1 << 20, &budget)
        };
        let err = collect(trickle, None, b).await.unwrap_err();
        assert!(matches!(err, BodyError::TooSlow { .. }), "{err:?}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(5) && took < Duration::from_secs(8),
            "{took:?}"
        );
    }
}
