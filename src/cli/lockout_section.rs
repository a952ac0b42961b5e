//! CouchDB's `[chttpd_auth_lockout]`: `mode` (`enforce`, `warn`, anything else `off`),
//! `threshold`, `max_objects` and `max_lifetime` (milliseconds), with CouchDB 3.4's defaults
//! (see `http::lockout`).

use std::time::Duration;

use crate::http::lockout::{LockoutMode, LockoutSettings};

use super::config_file::ConfigFile;

/// The section.
pub const SECTION: &str = "chttpd_auth_lockout";

/// The keys this file reads.
pub const KEYS: &[&str] = &["mode", "threshold", "max_objects", "max_lifetime"];

/// Reads the section over CouchDB's defaults; errors name the key and what it must be.
pub fn read(cfg: &ConfigFile) -> Result<LockoutSettings, String> {
    let mut s = LockoutSettings::default();
    let number = |key: &str| -> Result<Option<u64>, String> {
        let Some(v) = cfg.get(SECTION, key) else {
            return Ok(None);
        };
        match v.trim().parse::<u64>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(format!(
                "[{SECTION}] {key} must be a whole number of at least 1, not `{v}`"
            )),
        }
    };
    if let Some(v) = cfg.get(SECTION, "mode") {
        s.mode = LockoutMode::parse(v);
    }
    if let Some(n) = number("threshold")? {
        s.threshold = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(n) = number("max_objects")? {
        s.max_objects = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = number("max_lifetime")? {
        s.max_lifetime = Duration::from_millis(n);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn couchdbs_keys_and_defaults() {
        let cfg = ConfigFile::parse(
            "[chttpd_auth_lockout]\nmode = warn\nthreshold = 3\nmax_lifetime = 1000\n",
        )
        .unwrap();
        let s = read(&cfg).unwrap();
        assert_eq!(s.mode, LockoutMode::Warn);
        assert_eq!((s.threshold, s.max_objects), (3, 10_000));
        assert_eq!(s.max_lifetime, Duration::from_secs(1));
        let bad = ConfigFile::parse("[chttpd_auth_lockout]\nthreshold = 0\n").unwrap();
        assert!(read(&bad).unwrap_err().contains("threshold"));
    }
}
