//! CouchDB's `[chttpd_auth]` (or its older name `[couch_httpd_auth]`): how plain passwords in
//! `[admins]`/`[users]` are hashed (`iterations`, `pbkdf2_prf`) and how sessions are signed
//! (`secret`, `timeout`, `same_site`), with `[chttpd_auth_lockout]` read alongside
//! ([`super::lockout_section`]).

use crate::http::auth::AuthSettings;
use crate::http::password::{MAX_ITERATIONS, Prf};

use super::config_file::ConfigFile;
use super::lockout_section;

/// The section's names: CouchDB's current one, then its older one (read when the first has
/// no such key).
pub const SECTIONS: [&str; 2] = ["chttpd_auth", "couch_httpd_auth"];

/// The keys read here.
pub const KEYS: &[&str] = &["iterations", "pbkdf2_prf", "secret", "timeout", "same_site"];

/// Reads the section (and the lockout's) over CouchDB's defaults; errors name the key and
/// what it must be.
pub fn read(cfg: &ConfigFile) -> Result<AuthSettings, String> {
    let get = |k: &str| SECTIONS.iter().find_map(|s| cfg.get(s, k));
    let mut s = AuthSettings::default();
    if let Some(v) = get("iterations") {
        s.iterations = v
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=MAX_ITERATIONS).contains(n))
            .ok_or_else(|| {
                format!("[chttpd_auth] iterations must be from 1 to {MAX_ITERATIONS}")
            })?;
    }
    if let Some(v) = get("pbkdf2_prf") {
        s.prf = Prf::parse(v.trim()).ok_or_else(|| {
            "[chttpd_auth] pbkdf2_prf must be sha, sha224, sha256, sha384 or sha512".to_string()
        })?;
    }
    if let Some(v) = get("secret").filter(|v| !v.is_empty()) {
        s.session.secret = v.to_owned();
    }
    if let Some(v) = get("timeout") {
        s.session.timeout_secs = v
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=31_536_000).contains(n))
            .ok_or_else(|| "[chttpd_auth] timeout must be 1 to 31536000 seconds".to_string())?;
    }
    if let Some(v) = get("same_site") {
        s.session.same_site = same_site(v)?;
    }
    s.lockout = lockout_section::read(cfg)?;
    Ok(s)
}

/// `same_site`: the cookie's `SameSite` attribute, none when empty.
fn same_site(v: &str) -> Result<Option<String>, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "strict" => Ok(Some("Strict".to_owned())),
        "lax" => Ok(Some("Lax".to_owned())),
        "none" => Ok(Some("None".to_owned())),
        _ => Err("[chttpd_auth] same_site must be strict, lax, none or empty".into()),
    }
}
