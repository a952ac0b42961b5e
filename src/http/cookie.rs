//! CouchDB's `AuthSession` cookie: base64url of `NAME:HEXTIME:MAC`, MAC the raw HMAC-SHA256
//! of `NAME:HEXTIME` under the `[chttpd_auth] secret` followed by the user's password salt (so
//! changing a password ends its sessions), valid for `[chttpd_auth] timeout` seconds from
//! HEXTIME. SHA-1 MACs are accepted too, as CouchDB's default `hash_algorithms = sha256, sha`
//! does. Minting, verifying, reading and writing the cookie header; the `/_session`
//! endpoints that use it are in `session.rs`, the request authentication in `auth.rs`. Also the
//! HTTP layer's one HMAC-SHA256 set-up (`hmac_sha256`), which the credential caches share.

use axum::extract::Request;
use axum::http::header::{COOKIE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine as _;
use hmac::{Hmac, Mac as _};
use rand::RngCore as _;
use sha1::Sha1;
use sha2::Sha256;

use super::error::HttpError;
use super::password::same_bytes;
use crate::replicator::replicator_db::request::UserCtx;

/// Cookie signing settings. `Debug` hides the secret.
#[derive(Clone)]
pub struct SessionSettings {
    /// `[chttpd_auth] secret` (random per start when not configured).
    pub secret: String,
    /// `[chttpd_auth] timeout`, seconds.
    pub timeout_secs: u64,
    /// `[chttpd_auth] same_site`: the cookie's `SameSite` (`Strict`, `Lax` or `None`);
    /// `None` here leaves it out, as CouchDB does by default. Ours defaults to `Lax`, so a
    /// form on another site cannot send the cookie with its `POST`.
    pub same_site: Option<String>,
}

impl Default for SessionSettings {
    fn default() -> Self {
        let mut raw = [0u8; 16];
        rand::rng().fill_bytes(&mut raw);
        Self {
            secret: hex::encode(raw),
            timeout_secs: 600,
            same_site: Some("Lax".to_owned()),
        }
    }
}

impl std::fmt::Debug for SessionSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionSettings")
            .field("timeout_secs", &self.timeout_secs)
            .finish_non_exhaustive()
    }
}

/// Seconds since the epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// HMAC-SHA256 under `key` of `parts` one after another: the one keyed SHA-256 set-up of
/// the HTTP layer, for the cookie's MAC and for the digests the credential caches keep
/// instead of passwords (`auth.rs`, `couchdb_auth.rs`).
pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// HMAC-SHA1, only to accept the cookies CouchDB's `hash_algorithms = sha256, sha` accepts.
fn mac_sha1(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha1>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn key(s: &SessionSettings, salt: &str) -> Vec<u8> {
    let mut k = s.secret.as_bytes().to_vec();
    k.extend_from_slice(salt.as_bytes());
    k
}

/// The cookie value for `name` (whose password salt is `salt`) issued at `now`.
pub fn mint(s: &SessionSettings, name: &str, salt: &str, now: u64) -> String {
    let data = format!("{name}:{now:X}");
    let mut raw = data.clone().into_bytes();
    raw.push(b':');
    raw.extend(hmac_sha256(&key(s, salt), &[data.as_bytes()]));
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// Who may hold a cookie: the signing settings and, per user name, the password salt the MAC
/// covers and the user's context. Implemented by the configured users; kept as a trait so this
/// module needs nothing from the authentication module that calls it.
pub trait SessionUsers {
    /// The cookie settings.
    fn session(&self) -> &SessionSettings;
    /// The salt and context of `name`, if it is a user.
    fn session_user(&self, name: &str) -> Option<(&str, UserCtx)>;
}

/// The user a cookie stands for: `None` when it is expired, forged or names an unknown
/// user (the request is then anonymous, as in CouchDB); 400 when it cannot be decoded.
pub fn verify(
    users: &impl SessionUsers,
    cookie: &str,
    now: u64,
) -> Result<Option<UserCtx>, HttpError> {
    Ok(verify_issued(users, cookie, now)?.map(|(ctx, _)| ctx))
}

/// [`verify`], with the time the cookie was issued.
pub fn verify_issued(
    users: &impl SessionUsers,
    cookie: &str,
    now: u64,
) -> Result<Option<(UserCtx, u64)>, HttpError> {
    let malformed =
        || HttpError::bad_request("Malformed AuthSession cookie. Please clear your cookies.");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cookie.trim_end_matches('='))
        .map_err(|_| malformed())?;
    let mut parts = raw.splitn(3, |b| *b == b':');
    let (Some(name), Some(time), Some(mac)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(malformed());
    };
    let name = std::str::from_utf8(name).map_err(|_| malformed())?;
    let time_str = std::str::from_utf8(time).map_err(|_| malformed())?;
    let Some((salt, ctx)) = users.session_user(name) else {
        return Ok(None);
    };
    let s = users.session();
    let Ok(issued) = u64::from_str_radix(time_str, 16) else {
        return Ok(None);
    };
    if now >= issued.saturating_add(s.timeout_secs) {
        return Ok(None);
    }
    let k = key(s, salt);
    let data = format!("{name}:{time_str}");
    let ok = same_bytes(&hmac_sha256(&k, &[data.as_bytes()]), mac)
        || same_bytes(&mac_sha1(&k, data.as_bytes()), mac);
    Ok(ok.then_some((ctx, issued)))
}

/// The `AuthSession` value of the request's cookies, if any and not empty.
pub fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == "AuthSession")
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Marks every cookie a response sets `Secure`: the layer of the HTTPS listener's routes, as
/// CouchDB marks its cookies on its TLS port (a browser then never sends them over plain HTTP).
pub async fn secure_over_tls(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let set: Vec<HeaderValue> = resp
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| match v.to_str() {
            Ok(s) if !s.to_ascii_lowercase().contains("; secure") => {
                HeaderValue::from_str(&format!("{s}; Secure")).unwrap_or_else(|_| v.clone())
            }
            _ => v.clone(),
        })
        .collect();
    if !set.is_empty() {
        resp.headers_mut().remove(SET_COOKIE);
        for v in set {
            resp.headers_mut().append(SET_COOKIE, v);
        }
    }
    resp
}

/// A `Set-Cookie` value with CouchDB's attributes (`value` empty clears the session).
pub fn set_cookie(value: &str, s: &SessionSettings, now: u64) -> String {
    let timeout_secs = s.timeout_secs;
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(now + timeout_secs);
    // httpdate writes `Mon, 23 Nov 2026 11:53:58 GMT`; cookies carry `23-Nov-2026`.
    let d = httpdate::fmt_http_date(at);
    let p: Vec<&str> = d.split(' ').collect();
    let expires = match p.as_slice() {
        [wd, day, mon, year, time, tz] => format!("{wd} {day}-{mon}-{year} {time} {tz}"),
        _ => d.clone(),
    };
    let same_site = s
        .same_site
        .as_deref()
        .map_or(String::new(), |v| format!("; SameSite={v}"));
    format!(
        "AuthSession={value}; Version=1; Expires={expires}; Max-Age={timeout_secs}; Path=/; HttpOnly{same_site}"
    )
}
