//! Callers checked by a CouchDB (`[auth_couchdb] url`, `serve --auth-couchdb URL`): the users
//! of its `_users` database and its server admins. A Basic `name:password` or an
//! `AuthSession` cookie this node does not know is forwarded to that CouchDB's
//! `GET /_session`, whose `userCtx` (name and roles, `_admin` for its admins) becomes the
//! caller here. CouchDB answers in milliseconds only because it caches too: a success is
//! remembered for a short time (`cache_ttl`, 10 s) under an HMAC of the credential with a
//! per-start key, never the credential itself; a refusal is never remembered, so a password
//! changed in `_users` works at the next request. The old password keeps working here for at
//! most `cache_ttl`. A CouchDB that cannot be asked is a 503, not a 401: the caller's
//! credentials may be fine.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use axum::http::StatusCode;
use base64::Engine as _;
use rand::RngCore as _;
use serde::Deserialize;

use super::cookie::hmac_sha256;
use crate::replicator::replicator_db::request::UserCtx;

/// Where and how callers are checked.
#[derive(Debug, Clone)]
pub struct CouchDbAuthSettings {
    /// The CouchDB's root URL, without credentials (`http://couchdb:5984`).
    pub url: url::Url,
    /// How long a success is remembered (zero: every request asks).
    pub cache_ttl: Duration,
    /// Most remembered successes; the oldest goes first when full.
    pub cache_max_entries: usize,
    /// How long one check may take before the CouchDB counts as unreachable.
    pub timeout: Duration,
}

impl CouchDbAuthSettings {
    /// Settings with the defaults for `url`, which must be `http(s)` and carry no
    /// credentials (callers' own are forwarded; a fixed one would make everyone that user).
    pub fn new(url: &str) -> Result<Self, String> {
        let mut u = url::Url::parse(url.trim())
            .map_err(|e| format!("the authentication CouchDB URL is not a URL: {e}"))?;
        if !matches!(u.scheme(), "http" | "https") {
            return Err("the authentication CouchDB URL must be http or https".into());
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(
                "the authentication CouchDB URL must not carry credentials: each caller's own are forwarded"
                    .into(),
            );
        }
        if !u.path().ends_with('/') {
            let p = format!("{}/", u.path());
            u.set_path(&p);
        }
        u.set_query(None);
        u.set_fragment(None);
        Ok(Self {
            url: u,
            cache_ttl: Duration::from_secs(10),
            cache_max_entries: 10_000,
            timeout: Duration::from_secs(10),
        })
    }
}

/// Why a CouchDB could not say who a caller is. Messages name the server, never the caller's
/// credentials.
#[derive(Debug, thiserror::Error)]
pub enum CouchDbAuthError {
    /// No answer (refused, reset, timed out).
    #[error(
        "cannot check credentials: the authentication CouchDB at {url} is unreachable ({detail})"
    )]
    Unreachable {
        /// The CouchDB's origin.
        url: String,
        /// What failed: `timed out`, `connection failed`, `request failed`.
        detail: String,
    },
    /// An answer other than 200, 400 or 401.
    #[error("cannot check credentials: the authentication CouchDB at {url} answered {status}")]
    Status {
        /// The CouchDB's origin.
        url: String,
        /// Its status.
        status: u16,
    },
    /// A 200 whose body is not a session reply.
    #[error(
        "cannot check credentials: the authentication CouchDB at {url} did not answer GET /_session with a userCtx"
    )]
    BadReply {
        /// The CouchDB's origin.
        url: String,
    },
}

/// What the caller sent.
#[derive(Clone, Copy)]
pub enum Credential<'a> {
    /// HTTP Basic.
    Basic {
        /// The user name.
        name: &'a str,
        /// The password.
        password: &'a str,
    },
    /// The value of an `AuthSession` cookie.
    Cookie(&'a str),
}

/// What the CouchDB said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A known user.
    User(UserCtx),
    /// Wrong credentials, or a cookie that is expired or not its own (CouchDB then treats
    /// the request as anonymous).
    Rejected,
    /// A cookie it cannot decode (its 400 and reason).
    BadCookie(String),
}

/// Remembered successes: HMAC of the credential -> (when checked, who).
struct Cache {
    key: [u8; 32],
    ttl: Duration,
    max: usize,
    entries: Mutex<HashMap<[u8; 32], (Instant, UserCtx)>>,
}

impl Cache {
    fn new(ttl: Duration, max: usize) -> Self {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        Self {
            key,
            ttl,
            max,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The credential's cache key. The kind is part of it, so a cookie can never stand for
    /// a Basic pair; the NUL separates name from password (names cannot hold one in JSON
    /// documents CouchDB accepts, and a collision would need the same bytes anyway).
    fn digest(&self, c: Credential<'_>) -> [u8; 32] {
        match c {
            Credential::Basic { name, password } => hmac_sha256(
                &self.key,
                &[b"basic\0", name.as_bytes(), b"\0", password.as_bytes()],
            ),
            Credential::Cookie(v) => hmac_sha256(&self.key, &[b"cookie\0", v.as_bytes()]),
        }
    }

    fn get(&self, k: &[u8; 32], now: Instant) -> Option<UserCtx> {
        let m = self.entries.lock().ok()?;
        let (at, ctx) = m.get(k)?;
        (now.saturating_duration_since(*at) < self.ttl).then(|| ctx.clone())
    }

    fn put(&self, k: [u8; 32], ctx: UserCtx, now: Instant) {
        if self.ttl.is_zero() || self.max == 0 {
            return;
        }
        let Ok(mut m) = self.entries.lock() else {
            return;
        };
        if m.len() >= self.max && !m.contains_key(&k) {
            m.retain(|_, (at, _)| now.saturating_duration_since(*at) < self.ttl);
            // Still full of fresh entries: the oldest makes room (a linear scan, only when
            // the bound is reached with everything fresh).
            if m.len() >= self.max
                && let Some(old) = m.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| *k)
            {
                m.remove(&old);
            }
        }
        m.insert(k, (now, ctx));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map_or(0, |m| m.len())
    }
}

/// `GET /_session`'s reply.
#[derive(Deserialize)]
struct SessionReply {
    #[serde(rename = "userCtx")]
    user_ctx: SessionCtx,
}

#[derive(Deserialize)]
struct SessionCtx {
    name: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
}

/// `POST /_session`'s reply.
#[derive(Deserialize)]
struct LoginReply {
    name: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
}

/// An error body's reason.
#[derive(Deserialize)]
struct ErrorReply {
    reason: Option<String>,
}

/// Checks callers against one CouchDB. Cheap to share behind an `Arc`.
pub struct CouchDbAuth {
    settings: CouchDbAuthSettings,
    /// The URL as logs and errors show it (no path, query or credentials).
    shown: String,
    session_url: url::Url,
    client: reqwest::Client,
    cache: Cache,
}

impl std::fmt::Debug for CouchDbAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CouchDbAuth")
            .field("url", &self.shown)
            .field("cache_ttl", &self.settings.cache_ttl)
            .field("cache_max_entries", &self.settings.cache_max_entries)
            .finish_non_exhaustive()
    }
}

impl CouchDbAuth {
    /// A checker for `settings.url`.
    pub fn new(settings: CouchDbAuthSettings) -> Result<Self, String> {
        let session_url = settings
            .url
            .join("_session")
            .map_err(|e| format!("the authentication CouchDB URL cannot take a path: {e}"))?;
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            // A redirect could carry the forwarded credentials to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the authentication client: {e}"))?;
        let shown = settings.url.origin().ascii_serialization();
        let cache = Cache::new(settings.cache_ttl, settings.cache_max_entries);
        Ok(Self {
            settings,
            shown,
            session_url,
            client,
            cache,
        })
    }

    /// The CouchDB's address as shown in logs and errors.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// Who `cred` identifies, from the cache or the CouchDB's `GET /_session`, with the
    /// `Set-Cookie` CouchDB answered (it renews a cookie past a tenth of its lifetime; the
    /// caller should get it, or the session ends while in use).
    pub async fn check(
        &self,
        cred: Credential<'_>,
    ) -> Result<(Verdict, Option<String>), CouchDbAuthError> {
        let key = self.cache.digest(cred);
        if let Some(ctx) = self.cache.get(&key, Instant::now()) {
            return Ok((Verdict::User(ctx), None));
        }
        let (verdict, set_cookie) = self.ask(cred).await?;
        if let Verdict::User(ctx) = &verdict {
            self.cache.put(key, ctx.clone(), Instant::now());
        }
        Ok((verdict, set_cookie))
    }

    /// CouchDB's `POST /_session` for `name`/`password`: the user and CouchDB's `Set-Cookie`
    /// (its cookie, which later requests here present), or `None` when refused. The pair is
    /// remembered as a checked Basic credential too.
    pub async fn login(
        &self,
        name: &str,
        password: &str,
    ) -> Result<Option<(UserCtx, Option<String>)>, CouchDbAuthError> {
        let body = serde_json::json!({"name": name, "password": password});
        let resp = self
            .client
            .post(self.session_url.clone())
            .json(&body)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        match resp.status() {
            StatusCode::OK => {
                let cookie = set_cookie_of(&resp);
                let reply: LoginReply = resp.json().await.map_err(|_| self.bad_reply())?;
                let ctx = UserCtx {
                    name: Some(reply.name.unwrap_or_else(|| name.to_owned())),
                    roles: reply.roles,
                };
                let key = self.cache.digest(Credential::Basic { name, password });
                self.cache.put(key, ctx.clone(), Instant::now());
                Ok(Some((ctx, cookie)))
            }
            StatusCode::UNAUTHORIZED => Ok(None),
            other => Err(self.status(other)),
        }
    }

    async fn ask(
        &self,
        cred: Credential<'_>,
    ) -> Result<(Verdict, Option<String>), CouchDbAuthError> {
        let mut req = self
            .client
            .get(self.session_url.clone())
            .header(reqwest::header::ACCEPT, "application/json");
        req = match cred {
            Credential::Basic { name, password } => {
                let raw = format!("{name}:{password}");
                let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
                req.header(reqwest::header::AUTHORIZATION, format!("Basic {b64}"))
            }
            Credential::Cookie(v) => {
                req.header(reqwest::header::COOKIE, format!("AuthSession={v}"))
            }
        };
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = resp.status();
        let set_cookie = set_cookie_of(&resp);
        match status {
            StatusCode::OK => {
                let body: SessionReply = resp.json().await.map_err(|_| self.bad_reply())?;
                let SessionCtx { name, roles } = body.user_ctx;
                let verdict = match name {
                    Some(n) => Verdict::User(UserCtx {
                        name: Some(n),
                        roles,
                    }),
                    None => Verdict::Rejected,
                };
                Ok((
                    verdict,
                    set_cookie.filter(|_| matches!(cred, Credential::Cookie(_))),
                ))
            }
            StatusCode::UNAUTHORIZED => {
                tracing::debug!(couchdb = %self.shown, "the authentication CouchDB refused the credentials");
                Ok((Verdict::Rejected, None))
            }
            StatusCode::BAD_REQUEST if matches!(cred, Credential::Cookie(_)) => {
                let reason = resp
                    .json::<ErrorReply>()
                    .await
                    .ok()
                    .and_then(|e| e.reason)
                    .unwrap_or_else(|| "Malformed AuthSession cookie.".into());
                Ok((Verdict::BadCookie(reason), None))
            }
            other => Err(self.status(other)),
        }
    }

    fn status(&self, status: StatusCode) -> CouchDbAuthError {
        tracing::warn!(couchdb = %self.shown, status = status.as_u16(), "the authentication CouchDB failed a session request");
        CouchDbAuthError::Status {
            url: self.shown.clone(),
            status: status.as_u16(),
        }
    }

    fn unreachable(&self, e: &reqwest::Error) -> CouchDbAuthError {
        let detail = if e.is_timeout() {
            "timed out".to_owned()
        } else if e.is_connect() {
            "connection failed".to_owned()
        } else {
            "request failed".to_owned()
        };
        tracing::warn!(couchdb = %self.shown, %detail, "the authentication CouchDB is unreachable");
        CouchDbAuthError::Unreachable {
            url: self.shown.clone(),
            detail,
        }
    }

    fn bad_reply(&self) -> CouchDbAuthError {
        CouchDbAuthError::BadReply {
            url: self.shown.clone(),
        }
    }
}

/// The `AuthSession` cookie a CouchDB reply sets, as a `Set-Cookie` value.
fn set_cookie_of(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("AuthSession="))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(n: &str) -> UserCtx {
        UserCtx {
            name: Some(n.into()),
            roles: vec![],
        }
    }

    #[test]
    fn urls_without_credentials_only() {
        let s = CouchDbAuthSettings::new("http://couch:5984").unwrap();
        assert_eq!(s.url.as_str(), "http://couch:5984/");
        let s = CouchDbAuthSettings::new("https://h/prefix?x=1").unwrap();
        assert_eq!(s.url.as_str(), "https://h/prefix/");
        let a = CouchDbAuth::new(s).unwrap();
        assert_eq!(a.session_url.as_str(), "https://h/prefix/_session");
        assert_eq!(a.url(), "https://h");
        let e = CouchDbAuthSettings::new("http://admin:s3cret@h:5984").unwrap_err();
        assert!(e.contains("credentials") && !e.contains("s3cret"), "{e}");
        assert!(CouchDbAuthSettings::new("ftp://h").is_err());
        assert!(CouchDbAuthSettings::new("not a url").is_err());
    }

    #[test]
    fn cache_keys_are_digests_of_kind_and_credential() {
        let c = Cache::new(Duration::from_secs(10), 10);
        let bob = Credential::Basic {
            name: "bob",
            password: "pw",
        };
        let k = c.digest(bob);
        assert_eq!(k, c.digest(bob), "stable within a start");
        for other in [
            Credential::Basic {
                name: "bob",
                password: "pw2",
            },
            Credential::Basic {
                name: "bo",
                password: "bpw",
            },
            Credential::Cookie("bob:pw"),
        ] {
            assert_ne!(k, c.digest(other));
        }
        // Another start (another key) gives other digests: nothing to precompute.
        assert_ne!(k, Cache::new(Duration::from_secs(10), 10).digest(bob));
    }

    #[test]
    fn successes_expire_and_the_cache_is_bounded() {
        let c = Cache::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        let (a, b, d) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        c.put(a, ctx("a"), t0);
        assert_eq!(c.get(&a, t0 + Duration::from_secs(9)), Some(ctx("a")));
        assert_eq!(c.get(&a, t0 + Duration::from_secs(10)), None, "TTL over");
        c.put(b, ctx("b"), t0 + Duration::from_secs(1));
        // Full with fresh entries: the oldest (a) goes.
        c.put(d, ctx("d"), t0 + Duration::from_secs(2));
        assert_eq!(c.len(), 2);
        let now = t0 + Duration::from_secs(3);
        assert_eq!(c.get(&a, now), None);
        assert_eq!(c.get(&b, now), Some(ctx("b")));
        assert_eq!(c.get(&d, now), Some(ctx("d")));
        // Expired entries are dropped first when full.
        c.put(a, ctx("a"), t0 + Duration::from_secs(30));
        assert_eq!(c.len(), 1);
        // A zero TTL remembers nothing.
        let none = Cache::new(Duration::ZERO, 10);
        none.put(a, ctx("a"), t0);
        assert_eq!(none.len(), 0);
    }
}
