//! What a node accepts from an endpoint ([`EndpointLimits`]): how many bytes one response body
//! may hold in memory, how long a feed line may be, how many redirects are followed and how
//! slowly a body may arrive. Node configuration only (`[replicator]`): a replication document
//! cannot raise them, so no user can make the node hold more than the operator allowed.

use std::time::Duration;

use tokio::time::Instant;

/// The caps on what is read from an endpoint. Every default is far above anything a real
/// CouchDB or PouchDB sends (see `docs/operations.md`, "Caps on what endpoints send").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// The most bytes of one response body held in memory, counted after decompression:
    /// JSON answers (database info, `_local`, `_revs_diff`, `_bulk_docs`, `_bulk_get`,
    /// `open_revs`), each multipart part kept in memory, and all such parts of one answer
    /// together. A `Content-Length` above it is refused before the body is read.
    pub max_response_bytes: u64,
    /// The longest `_changes` row (a line of a continuous feed, a row of a normal one).
    pub max_feed_line_bytes: usize,
    /// Redirects followed per request.
    pub max_redirects: usize,
    /// The slowest a body may arrive, in bytes per second, once `connection_timeout` has
    /// passed: a body that trickles ends at `start + connection_timeout + received / rate`.
    /// Continuous feeds are held to it per row instead (heartbeats keep them open).
    pub min_bytes_per_sec: u64,
    /// The node's budget of response bytes held while reading, all jobs together (see
    /// [`super::budget`]).
    pub response_budget_bytes: u64,
    /// Asks loopback endpoints for gzip too (off by default: compression on one machine
    /// only costs CPU; on for tests of compressed answers).
    pub compress_loopback: bool,
}

/// [`EndpointLimits::max_response_bytes`] by default: 16 MiB, twice CouchDB's largest
/// document (`max_document_size`, 8 MB) and far above any database info, checkpoint,
/// `_revs_diff` or `_bulk_docs` answer; a `_bulk_get` answer above it is fetched again one
/// revision at a time.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 16 << 20;

/// [`EndpointLimits::max_feed_line_bytes`] by default: 4 MiB (a row lists one document's
/// leaves: a thousand conflicts are about 50 KB, so this is some 80,000 of them).
pub const DEFAULT_MAX_FEED_LINE_BYTES: usize = 4 << 20;

impl Default for EndpointLimits {
    fn default() -> Self {
        Self {
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_feed_line_bytes: DEFAULT_MAX_FEED_LINE_BYTES,
            max_redirects: 10,
            min_bytes_per_sec: 1024,
            response_budget_bytes: super::budget::DEFAULT_RESPONSE_BUDGET_BYTES,
            compress_loopback: false,
        }
    }
}

impl EndpointLimits {
    /// The pace a body read started now must keep.
    pub(crate) fn pace(&self, connection_timeout: Duration) -> Pace {
        Pace {
            start: Instant::now(),
            grace: connection_timeout,
            min_bytes_per_sec: self.min_bytes_per_sec.max(1),
        }
    }
}

/// The deadline of a body being read: `connection_timeout` of grace, then one more second
/// for every `min_bytes_per_sec` bytes received.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    start: Instant,
    grace: Duration,
    min_bytes_per_sec: u64,
}

impl Pace {
    /// When the body must have ended (or sent more) having received `received` bytes.
    pub(crate) fn deadline(&self, received: u64) -> Instant {
        let earned = Duration::from_secs_f64(received as f64 / self.min_bytes_per_sec as f64);
        // Far enough to never be reached, without overflowing `Instant`.
        let earned = earned.min(Duration::from_secs(86_400 * 365));
        self.start + self.grace + earned
    }

    /// Starts the clock again (a feed row ended).
    pub(crate) fn restart(&mut self) {
        self.start = Instant::now();
    }

    /// The minimum rate, bytes per second.
    pub(crate) fn rate(&self) -> u64 {
        self.min_bytes_per_sec
    }

    /// How long the body has been read.
    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_body_earns_time_by_the_bytes_it_brings() {
        let limits = EndpointLimits {
            min_bytes_per_sec: 100,
            ..EndpointLimits::default()
        };
        let pace = limits.pace(Duration::from_secs(30));
        let now = Instant::now();
        assert_eq!(pace.deadline(0), now + Duration::from_secs(30));
        assert_eq!(pace.deadline(1000), now + Duration::from_secs(40));
        assert!(pace.deadline(u64::MAX) > now + Duration::from_secs(86_400));
    }
}
