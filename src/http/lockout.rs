//! CouchDB's authentication lockout (`[chttpd_auth_lockout]`, CouchDB 3.4): after `threshold`
//! wrong passwords for one name from one client address, every login of that name from that
//! address is refused with 403 `forbidden`, "Account is temporarily locked due to multiple
//! authentication failures" (the right password too), until `max_lifetime` has passed since
//! the first failure. A success does not reset the count, as in CouchDB. At most
//! `max_objects` (address, name) pairs are tracked; when full, the least recently failed is
//! forgotten. Only the names this node checks itself are counted: a CouchDB that checks the
//! others (`[auth_couchdb]`) keeps its own lockout.
//!
//! The address is the socket's peer. CouchDB (mochiweb) takes the last `X-Forwarded-For`
//! entry when the peer is a private address; that header is the client's to write, so it is
//! not trusted here (docs/couchdb-differences.md).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::error::HttpError;

/// What a reached threshold does (`[chttpd_auth_lockout] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockoutMode {
    /// Refuse with 403 (CouchDB's default).
    Enforce,
    /// Only log that the threshold was reached.
    Warn,
    /// Count nothing.
    Off,
}

impl LockoutMode {
    /// CouchDB's names; anything else is `off`, as in CouchDB.
    pub fn parse(s: &str) -> Self {
        match s.trim() {
            "enforce" => Self::Enforce,
            "warn" => Self::Warn,
            _ => Self::Off,
        }
    }
}

/// `[chttpd_auth_lockout]`, with CouchDB's defaults.
#[derive(Debug, Clone)]
pub struct LockoutSettings {
    /// What a reached threshold does.
    pub mode: LockoutMode,
    /// Failures that lock (the next attempt is refused).
    pub threshold: u32,
    /// (address, name) pairs tracked at most.
    pub max_objects: usize,
    /// How long a lock lasts, from the first failure.
    pub max_lifetime: Duration,
}

impl Default for LockoutSettings {
    fn default() -> Self {
        Self {
            mode: LockoutMode::Enforce,
            threshold: 5,
            max_objects: 10_000,
            max_lifetime: Duration::from_millis(300_000),
        }
    }
}

struct Entry {
    failures: u32,
    first: Instant,
    last: Instant,
}

/// The failures counted so far.
pub(crate) struct Lockout {
    settings: LockoutSettings,
    table: Mutex<HashMap<(IpAddr, String), Entry>>,
}

/// CouchDB's reason, word for word.
pub const LOCKED: &str = "Account is temporarily locked due to multiple authentication failures";

impl Lockout {
    pub(crate) fn new(settings: LockoutSettings) -> Self {
        Self {
            settings,
            table: Mutex::new(HashMap::new()),
        }
    }

    /// 403 when `name` is locked for `peer` (in `enforce` mode; `warn` logs and lets it try).
    pub(crate) fn check(&self, peer: IpAddr, name: &str) -> Result<(), HttpError> {
        if self.settings.mode == LockoutMode::Off {
            return Ok(());
        }
        let Ok(mut table) = self.table.lock() else {
            return Ok(());
        };
        let key = (peer, name.to_owned());
        let locked = match table.get(&key) {
            Some(e) if e.first.elapsed() >= self.settings.max_lifetime => {
                table.remove(&key);
                false
            }
            Some(e) => e.failures >= self.settings.threshold,
            None => false,
        };
        if !locked {
            return Ok(());
        }
        if self.settings.mode == LockoutMode::Warn {
            tracing::warn!(user = %name, %peer, "authentication failure threshold reached");
            return Ok(());
        }
        tracing::warn!(user = %name, %peer, "authentication rejected for a locked-out user");
        Err(HttpError::forbidden(LOCKED))
    }

    /// One more wrong password for `name` from `peer`.
    pub(crate) fn failed(&self, peer: IpAddr, name: &str) {
        if self.settings.mode == LockoutMode::Off {
            return;
        }
        let Ok(mut table) = self.table.lock() else {
            return;
        };
        let now = Instant::now();
        let key = (peer, name.to_owned());
        if !table.contains_key(&key) && table.len() >= self.settings.max_objects.max(1) {
            let lifetime = self.settings.max_lifetime;
            table.retain(|_, e| now.duration_since(e.first) < lifetime);
            if table.len() >= self.settings.max_objects.max(1)
                && let Some(oldest) = table
                    .iter()
                    .min_by_key(|(_, e)| e.last)
                    .map(|(k, _)| k.clone())
            {
                table.remove(&oldest);
            }
        }
        let e = table.entry(key).or_insert(Entry {
            failures: 0,
            first: now,
            last: now,
        });
        e.failures += 1;
        e.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[tokio::test(start_paused = true)]
    async fn the_threshold_locks_one_name_from_one_address_for_the_lifetime() {
        let l = Lockout::new(LockoutSettings::default());
        for _ in 0..4 {
            l.failed(ip(1), "bob");
        }
        assert!(l.check(ip(1), "bob").is_ok(), "4 failures do not lock");
        l.failed(ip(1), "bob");
        let e = l.check(ip(1), "bob").unwrap_err();
        assert_eq!(e.status.as_u16(), 403);
        assert!(l.check(ip(2), "bob").is_ok(), "another address");
        assert!(l.check(ip(1), "alice").is_ok(), "another name");
        tokio::time::advance(Duration::from_secs(299)).await;
        l.failed(ip(1), "bob");
        assert!(
            l.check(ip(1), "bob").is_err(),
            "later failures do not extend it"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            l.check(ip(1), "bob").is_ok(),
            "the lifetime runs from the first failure"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn warn_and_off_never_refuse_and_the_table_stays_bounded() {
        for mode in [LockoutMode::Warn, LockoutMode::Off] {
            let l = Lockout::new(LockoutSettings {
                mode,
                ..LockoutSettings::default()
            });
            for _ in 0..10 {
                l.failed(ip(1), "bob");
            }
            assert!(l.check(ip(1), "bob").is_ok(), "{mode:?}");
        }
        let l = Lockout::new(LockoutSettings {
            max_objects: 3,
            ..LockoutSettings::default()
        });
        for n in 0..50u8 {
            l.failed(ip(n), "bob");
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert_eq!(l.table.lock().unwrap().len(), 3);
        assert_eq!(LockoutMode::parse("bogus"), LockoutMode::Off);
    }
}
