//! Reading a body into memory within the endpoint's limits ([`super::limits`]): the cap is
//! checked as chunks arrive (and against a declared `Content-Length` before any), so nothing
//! larger than the cap is ever held, and a body that trickles ends at its [`Pace`] deadline.
//! Used for whole responses and for the multipart parts kept in memory.

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

use super::budget::ResponseBudget;
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
/// it up to `patience`).
pub(crate) struct Bounds<'a> {
    pub(crate) cap: u64,
    pub(crate) pace: Pace,
    pub(crate) budget: &'a ResponseBudget,
    pub(crate) patience: std::time::Duration,
}

/// Reads `stream` whole, holding at most `cap` bytes; `declared` is the `Content-Length`.
/// The pace starts at the first byte.
pub(crate) async fn collect<S>(stream: S, declared: Option<u64>, b: Bounds<'_>) -> Result<Bytes, BodyError>
where
    S: Stream<Item = Result<Bytes, String>>,
{
    let Bounds {
        cap,
        mut pace,
        budget,
        patience,
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
    let mut exact = declared.map(|n| BytesMut::with_capacity(n as usize));
    let mut parts: Vec<Bytes> = Vec::new();
    let mut received: u64 = 0;
    let mut share = budget.share();
    // Until the first byte only the read timeout applies: a long poll is silent, then whole.
    let far = tokio::time::Instant::now() + std::time::Duration::from_secs(86_400 * 365);
    loop {
        let deadline = if received == 0 { far } else { pace.deadline(received) };
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
        share.cover(received, patience).await.map_err(|e| {
            BodyError::Transport(format!(
                "waited {:.0} s for the node's response budget ([replicator] response_budget_bytes)",
                e.waited.as_secs_f64()
            ))
        })?;
        match &mut exact {
            Some(buf) => buf.extend_from_slice(&chunk),
            None => parts.push(Bytes::copy_from_slice(&chunk)),
        }
    }
    Ok(match exact {
        Some(buf) => buf.freeze(),
        None => concat(parts, received),
    })
}

/// The chunks as one buffer (no copy for a single chunk).
fn concat(mut parts: Vec<Bytes>, len: u64) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(len as usize);
    for p in parts {
        out.extend_from_slice(&p);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::replication::http::limits::EndpointLimits;

    fn chunks(n: usize, size: usize) -> impl Stream<Item = Result<Bytes, String>> {
        futures::stream::iter((0..n).map(move |_| Ok(Bytes::from(vec![b'a'; size]))))
    }

    fn budget() -> ResponseBudget {
        ResponseBudget::new(64 << 20, Default::default())
    }

    fn bounds(cap: u64, budget: &ResponseBudget) -> Bounds<'_> {
        Bounds {
            cap,
            pace: EndpointLimits::default().pace(Duration::from_secs(30)),
            budget,
            patience: Duration::from_secs(1),
        }
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
            matches!(err, BodyError::TooLarge { read: 50, cap: 45, .. }),
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
