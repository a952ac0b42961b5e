//! `[auth_couchdb]`: the CouchDB whose `_users` and admins may call this node
//! ([`crate::http::couchdb_auth`]). `url` (or `serve --auth-couchdb URL`) turns it
//! on; `cache_ttl` (seconds a checked credential is trusted, default 10, 0 = ask every time),
//! `cache_max_entries` (default 10000) and `timeout` (seconds one check may take, default 10)
//! tune it. Plain `http` is refused unless the CouchDB is on this machine or
//! `allow_insecure = true`: whoever answers that URL decides who is an admin here, and on a
//! network path anyone can answer.

use std::time::Duration;

use crate::http::couchdb_auth::CouchDbAuthSettings;

use super::config_file::ConfigFile;

/// The section's name.
pub const SECTION: &str = "auth_couchdb";

/// The keys read here.
pub const KEYS: &[&str] = &[
    "url",
    "cache_ttl",
    "cache_max_entries",
    "timeout",
    "allow_insecure",
];

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
    let allowed = cfg
        .get(SECTION, "allow_insecure")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if s.url.scheme() == "http" && !is_this_machine(&s.url) && !allowed {
        return Err(format!(
            "[{SECTION}] url: plain http to another machine lets anyone on the path answer \
             as a server admin; use https, or set [{SECTION}] allow_insecure = true"
        ));
    }
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

/// Whether `url` names this machine (loopback), where nobody else is on the path.
fn is_this_machine(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_this_machine_or_when_allowed() {
        let c = |t: &str| ConfigFile::parse(t).unwrap();
        let e = read(&c("[auth_couchdb]\nurl = http://couch:5984\n")).unwrap_err();
        assert!(e.contains("allow_insecure"), "{e}");
        for ok in [
            "url = https://couch:6984",
            "url = http://127.0.0.1:5984",
            "url = http://localhost:5984",
            "url = http://[::1]:5984",
            "url = http://couch:5984\nallow_insecure = true",
        ] {
            let cfg = c(&format!("[auth_couchdb]\n{ok}\n"));
            assert!(read(&cfg).is_ok(), "{ok}");
        }
    }

    #[test]
    fn settings_and_their_errors() {
        let c = |t: &str| ConfigFile::parse(t).unwrap();
        assert!(read(&c("[chttpd]\nport = 1\n")).unwrap().is_none());
        let s = read(&c(
            "[auth_couchdb]\nurl = http://couch:5984\ncache_ttl = 0\ntimeout = 3\n\
             allow_insecure = true\n",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(s.url.as_str(), "http://couch:5984/");
        assert_eq!(s.cache_ttl, Duration::ZERO);
        assert_eq!(s.timeout, Duration::from_secs(3));
        assert_eq!(s.cache_max_entries, 10_000);
        let e = read(&c("[auth_couchdb]\nurl = http://a:pw@couch:5984\n")).unwrap_err();
        assert!(e.contains("[auth_couchdb] url") && !e.contains("pw"), "{e}");
        let e = read(&c("[auth_couchdb]\nurl = https://couch\ncache_ttl = -1\n")).unwrap_err();
        assert!(e.contains("cache_ttl"), "{e}");
        let e = read(&c("[auth_couchdb]\nurl = https://couch\ntimeout = 0\n")).unwrap_err();
        assert!(e.contains("timeout"), "{e}");
    }
}
