//! `[auth_couchdb]`: the CouchDB whose `_users` and admins may call this node
//! ([`crate::http::couchdb_auth`]). `url` (or `serve --auth-couchdb URL`) turns it
//! on; `cache_ttl` (seconds a checked credential is trusted, default 10, 0 = ask every time),
//! `cache_max_entries` (default 10000) and `timeout` (seconds one check may take, default 10)
//! tune it.

use std::time::Duration;

use crate::http::couchdb_auth::CouchDbAuthSettings;

use super::config_file::ConfigFile;

/// The section's name.
pub const SECTION: &str = "auth_couchdb";

/// The keys read here.
pub const KEYS: &[&str] = &["url", "cache_ttl", "cache_max_entries", "timeout"];

/// Whole seconds / counts within `range`, or an error naming the key.
fn num(
    cfg: &ConfigFile,
    key: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Option<u64>, String> {
    let Some(v) = cfg.get(SECTION, key) else {
        return Ok(None);
    };
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| range.contains(n))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "[{SECTION}] {key} must be a whole number from {} to {}",
                range.start(),
                range.end()
            )
        })
}

/// The settings, or `None` when no `url` is set.
pub fn read(cfg: &ConfigFile) -> Result<Option<CouchDbAuthSettings>, String> {
    let Some(url) = cfg.get(SECTION, "url") else {
        return Ok(None);
    };
    let mut s = CouchDbAuthSettings::new(url).map_err(|e| format!("[{SECTION}] url: {e}"))?;
    if let Some(n) = num(cfg, "cache_ttl", 0..=3600)? {
        s.cache_ttl = Duration::from_secs(n);
    }
    if let Some(n) = num(cfg, "cache_max_entries", 0..=1_000_000)? {
        s.cache_max_entries = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = num(cfg, "timeout", 1..=300)? {
        s.timeout = Duration::from_secs(n);
    }
    Ok(Some(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_their_errors() {
        let c = |t: &str| ConfigFile::parse(t).unwrap();
        assert!(read(&c("[chttpd]\nport = 1\n")).unwrap().is_none());
        let s = read(&c(
            "[auth_couchdb]\nurl = http://couch:5984\ncache_ttl = 0\ntimeout = 3\n",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(s.url.as_str(), "http://couch:5984/");
        assert_eq!(s.cache_ttl, Duration::ZERO);
        assert_eq!(s.timeout, Duration::from_secs(3));
        assert_eq!(s.cache_max_entries, 10_000);
        let e = read(&c("[auth_couchdb]\nurl = http://a:pw@couch:5984\n")).unwrap_err();
        assert!(e.contains("[auth_couchdb] url") && !e.contains("pw"), "{e}");
        let e = read(&c("[auth_couchdb]\nurl = http://couch\ncache_ttl = -1\n")).unwrap_err();
        assert!(e.contains("cache_ttl"), "{e}");
        let e = read(&c("[auth_couchdb]\nurl = http://couch\ntimeout = 0\n")).unwrap_err();
        assert!(e.contains("timeout"), "{e}");
    }
}
