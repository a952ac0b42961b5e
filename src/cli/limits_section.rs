//! The caps on what endpoints may send, read from `[replicator]` (ours; CouchDB has none):
//! `max_response_bytes`, `max_feed_line_bytes`, `max_redirects`, `min_bytes_per_sec`,
//! `response_budget_bytes` and `compress_loopback`. Node configuration only: replication documents cannot set them.

use crate::replication::http::limits::EndpointLimits;

use super::config_file::ConfigFile;

/// The keys this file reads.
pub const KEYS: &[&str] = &[
    "max_response_bytes",
    "max_feed_line_bytes",
    "max_redirects",
    "min_bytes_per_sec",
    "response_budget_bytes",
    "compress_loopback",
];

/// Reads the caps over their defaults; errors name the key and what it must be.
pub fn read(cfg: &ConfigFile) -> Result<EndpointLimits, String> {
    let mut l = EndpointLimits::default();
    let number = |key: &str, min: u64| -> Result<Option<u64>, String> {
        let Some(v) = cfg.get("replicator", key) else {
            return Ok(None);
        };
        match v.trim().parse::<u64>() {
            Ok(n) if n >= min => Ok(Some(n)),
            _ => Err(format!(
                "[replicator] {key} must be a whole number of at least {min}, not `{v}`"
            )),
        }
    };
    // 64 KiB at least: a database info or a checkpoint must always fit.
    if let Some(n) = number("max_response_bytes", 64 << 10)? {
        l.max_response_bytes = n;
    }
    if let Some(n) = number("max_feed_line_bytes", 4 << 10)? {
        l.max_feed_line_bytes = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = number("max_redirects", 0)? {
        l.max_redirects = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = number("min_bytes_per_sec", 1)? {
        l.min_bytes_per_sec = n;
    }
    if let Some(n) = number("response_budget_bytes", 1 << 20)? {
        l.response_budget_bytes = n;
    }
    if l.response_budget_bytes < l.max_response_bytes {
        return Err(format!(
            "[replicator] response_budget_bytes ({}) must be at least max_response_bytes ({})",
            l.response_budget_bytes, l.max_response_bytes
        ));
    }
    if let Some(v) = cfg.get("replicator", "compress_loopback") {
        l.compress_loopback = match v.trim() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(format!(
                    "[replicator] compress_loopback must be true or false, not `{v}`"
                ));
            }
        };
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_read_over_their_defaults_and_bad_values_named() {
        let cfg = ConfigFile::parse(
            "[replicator]\nmax_response_bytes = 1048576\nmax_redirects = 0\ncompress_loopback = true\n",
        )
        .unwrap();
        let l = read(&cfg).unwrap();
        assert_eq!(l.max_response_bytes, 1 << 20);
        assert_eq!(l.max_redirects, 0);
        assert!(l.compress_loopback);
        assert_eq!(
            l.max_feed_line_bytes,
            EndpointLimits::default().max_feed_line_bytes
        );
        for bad in [
            "max_response_bytes = 10",
            "min_bytes_per_sec = 0",
            "max_redirects = -1",
        ] {
            let cfg = ConfigFile::parse(&format!("[replicator]\n{bad}\n")).unwrap();
            let e = read(&cfg).unwrap_err();
            let key = bad.split(' ').next().unwrap();
            assert!(e.contains(key), "{e}");
        }
    }
}
