//! Backing off under load: CouchDB's AIMD algorithm behind the 429 limiter ([`aimd`]), the
//! limiter every request asks first ([`limiter`]), and the pipeline's adaptive in-flight
//! window ([`window`]).

pub(crate) mod aimd;
pub(crate) mod limiter;
pub(crate) mod window;

pub use limiter::{Aimd, RateLimiter};
#[cfg(any(test, feature = "internals"))]
pub use {
    limiter::{RateInterval, RateKey},
    window::WindowStats,
};
