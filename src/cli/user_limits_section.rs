//! The limits on callers who are not admins, read from `[replicator]` (ours; CouchDB has
//! none): `max_jobs_per_user`, `user_max_worker_processes`, `user_max_worker_batch_size`,
//! `user_max_http_connections` (see `http::user_limits`).

use crate::http::user_limits::UserLimits;

use super::config_file::ConfigFile;

/// The keys this file reads.
pub const KEYS: &[&str] = &[
    "max_jobs_per_user",
    "user_max_worker_processes",
    "user_max_worker_batch_size",
    "user_max_http_connections",
];

/// Reads the limits over their defaults; errors name the key and what it must be.
pub fn read(cfg: &ConfigFile) -> Result<UserLimits, String> {
    let mut l = UserLimits::default();
    let fields: [(&str, &mut usize); 4] = [
        ("max_jobs_per_user", &mut l.max_jobs),
        ("user_max_worker_processes", &mut l.worker_processes),
        ("user_max_worker_batch_size", &mut l.worker_batch_size),
        ("user_max_http_connections", &mut l.http_connections),
    ];
    for (key, field) in fields {
        let Some(v) = cfg.get("replicator", key) else {
            continue;
        };
        *field = match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err(format!(
                    "[replicator] {key} must be a whole number of at least 1, not `{v}`"
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
    fn keys_over_defaults() {
        let cfg = ConfigFile::parse("[replicator]\nmax_jobs_per_user = 3\n").unwrap();
        let l = read(&cfg).unwrap();
        assert_eq!((l.max_jobs, l.worker_processes), (3, 8));
        let bad = ConfigFile::parse("[replicator]\nuser_max_http_connections = 0\n").unwrap();
        assert!(
            read(&bad)
                .unwrap_err()
                .contains("user_max_http_connections")
        );
    }
}
