//! Cookie login, CouchDB's `/_session`: `POST` (JSON or form `name`/`password`) answers
//! `{"ok":true,"name","roles"}` with an `AuthSession` cookie, `GET` describes the caller,
//! `DELETE` clears the cookie. The cookie is CouchDB's: base64url of `NAME:HEXTIME:MAC`, MAC
//! the raw HMAC-SHA256 of `NAME:HEXTIME` under the `[chttpd_auth] secret` followed by the
//! user's password salt (so changing a password ends its sessions); it is valid for
//! `[chttpd_auth] timeout` seconds from HEXTIME. SHA-1 MACs are accepted too, as CouchDB's
//! default `hash_algorithms = sha256, sha` does. A request carrying a cookie older than a
//! tenth of its lifetime gets a fresh one, as in CouchDB.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::header::{CONTENT_TYPE, COOKIE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac as _};
use rand::RngCore as _;
use serde::Deserialize;
use serde_json::{Value, json};
use sha1::Sha1;
use sha2::Sha256;

use super::AppState;
use super::auth::{AuthMethod, Caller, HasUsers, Users};
use super::error::HttpError;
use super::password::same_bytes;
use crate::replicator::rep_doc::UserCtx;

/// Cookie signing settings. `Debug` hides the secret.
#[derive(Clone)]
pub struct SessionSettings {
    /// `[chttpd_auth] secret` (random per start when not configured).
    pub secret: String,
    /// `[chttpd_auth] timeout`, seconds.
    pub timeout_secs: u64,
}

impl Default for SessionSettings {
    fn default() -> Self {
        let mut raw = [0u8; 16];
        rand::rng().fill_bytes(&mut raw);
        Self {
            secret: hex::encode(raw),
            timeout_secs: 600,
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

fn mac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

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
    raw.extend(mac_sha256(&key(s, salt), data.as_bytes()));
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// The user a cookie stands for: `None` when it is expired, forged or names an unknown
/// user (the request is then anonymous, as in CouchDB); 400 when it cannot be decoded.
pub fn verify(users: &Users, cookie: &str, now: u64) -> Result<Option<UserCtx>, HttpError> {
    Ok(verify_issued(users, cookie, now)?.map(|(ctx, _)| ctx))
}

/// [`verify`], with the time the cookie was issued.
fn verify_issued(
    users: &Users,
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
    let ok = same_bytes(&mac_sha256(&k, data.as_bytes()), mac)
        || same_bytes(&mac_sha1(&k, data.as_bytes()), mac);
    Ok(ok.then_some((ctx, issued)))
}

/// A fresh cookie for a request authenticated by a cookie older than a tenth of its
/// lifetime, as CouchDB sends one, so active sessions do not expire.
pub fn refreshed(users: &Users, headers: &HeaderMap, now: u64) -> Option<String> {
    let cookie = cookie_value(headers)?;
    let (ctx, issued) = verify_issued(users, &cookie, now).ok()??;
    let s = users.session();
    if now.saturating_sub(issued) * 10 <= s.timeout_secs {
        return None;
    }
    let name = ctx.name?;
    let (salt, _) = users.session_user(&name)?;
    Some(set_cookie(&mint(s, &name, salt, now), s.timeout_secs, now))
}

/// Middleware adding [`refreshed`] cookies to responses that set none themselves.
pub async fn refresh_cookie(
    State(state): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let fresh = refreshed(state.users(), req.headers(), now_secs());
    let mut resp = next.run(req).await;
    if let Some(c) = fresh
        && !resp.headers().contains_key(SET_COOKIE)
        && let Ok(v) = HeaderValue::from_str(&c)
    {
        resp.headers_mut().insert(SET_COOKIE, v);
    }
    resp
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

/// A `Set-Cookie` value with CouchDB's attributes (`value` empty clears the session).
pub fn set_cookie(value: &str, timeout_secs: u64, now: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(now + timeout_secs);
    // httpdate writes `Mon, 23 Nov 2026 11:53:58 GMT`; cookies carry `23-Nov-2026`.
    let d = httpdate::fmt_http_date(at);
    let p: Vec<&str> = d.split(' ').collect();
    let expires = match p.as_slice() {
        [wd, day, mon, year, time, tz] => format!("{wd} {day}-{mon}-{year} {time} {tz}"),
        _ => d.clone(),
    };
    format!(
        "AuthSession={value}; Version=1; Expires={expires}; Max-Age={timeout_secs}; Path=/; HttpOnly"
    )
}

fn with_cookie(status: StatusCode, cookie: String, body: Value) -> Response {
    let mut r = (status, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(SET_COOKIE, v);
    }
    r
}

/// The name and password of a login body.
#[derive(Deserialize)]
struct LoginForm {
    #[serde(alias = "username")]
    name: Option<String>,
    password: Option<String>,
}

fn login_form(headers: &HeaderMap, body: &[u8]) -> Result<LoginForm, HttpError> {
    let ct = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.starts_with("application/json") {
        serde_json::from_slice(body)
            .map_err(|_| HttpError::bad_request("the body must be {\"name\", \"password\"}"))
    } else if ct.starts_with("application/x-www-form-urlencoded") {
        let mut f = LoginForm {
            name: None,
            password: None,
        };
        for (k, v) in url::form_urlencoded::parse(body) {
            match k.as_ref() {
                "name" | "username" => f.name = Some(v.into_owned()),
                "password" => f.password = Some(v.into_owned()),
                _ => {}
            }
        }
        Ok(f)
    } else {
        Err(HttpError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "bad_content_type",
            "Content-Type must be 'application/x-www-form-urlencoded' or 'application/json'",
        ))
    }
}

/// `POST /_session`.
pub async fn post_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let form = login_form(&headers, &body)?;
    let users = state.users();
    let name = form.name.unwrap_or_default();
    let password = form.password.unwrap_or_default();
    let s = users.session();
    let now = now_secs();
    match users.login(&name, &password) {
        Some(ctx) => {
            let salt = users.session_user(&name).map_or("", |(salt, _)| salt);
            let cookie = set_cookie(&mint(s, &name, salt, now), s.timeout_secs, now);
            let body = json!({"ok": true, "name": name, "roles": ctx.roles});
            Ok(with_cookie(StatusCode::OK, cookie, body))
        }
        None => {
            tracing::info!(user = %name, "session login refused");
            let body = json!({"error": "unauthorized", "reason": "Name or password is incorrect."});
            let cookie = set_cookie("", s.timeout_secs, now);
            Ok(with_cookie(StatusCode::UNAUTHORIZED, cookie, body))
        }
    }
}

/// `?basic=true` asks for a 401 when anonymous, as CouchDB does.
#[derive(Deserialize)]
pub struct SessionQuery {
    basic: Option<String>,
}

/// `GET /_session`.
pub async fn get_session(
    State(state): State<AppState>,
    Query(q): Query<SessionQuery>,
    headers: HeaderMap,
) -> Result<Json<Value>, HttpError> {
    let (caller, how) = state.users().authenticate_headers(&headers)?;
    let ctx = match &caller {
        Caller::User(u) => json!({"name": u.name, "roles": u.roles}),
        Caller::Anonymous if q.basic.as_deref() == Some("true") => {
            return Err(HttpError::unauthorized("Authentication required.").with_basic_challenge());
        }
        Caller::Anonymous => json!({"name": null, "roles": []}),
    };
    let mut info = json!({"authentication_handlers": ["cookie", "default"]});
    if let Some(h) = how {
        info["authenticated"] = json!(AuthMethod::name(h));
    }
    Ok(Json(json!({"ok": true, "userCtx": ctx, "info": info})))
}

/// `DELETE /_session`.
pub async fn delete_session(State(state): State<AppState>) -> Response {
    let s = state.users().session();
    with_cookie(
        StatusCode::OK,
        set_cookie("", s.timeout_secs, now_secs()),
        json!({"ok": true}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users() -> Users {
        let settings = super::super::auth::AuthSettings {
            iterations: 2,
            session: SessionSettings {
                secret: "s3cr3t".into(),
                timeout_secs: 600,
            },
            ..Default::default()
        };
        Users::configure(
            [("adm".to_string(), "pw".to_string())],
            [("bob".to_string(), "b".to_string())],
            &settings,
        )
        .unwrap()
    }

    #[test]
    fn cookies_verify_until_they_expire() {
        let u = users();
        let (salt, _) = u.session_user("adm").unwrap();
        let c = mint(u.session(), "adm", salt, 1_000);
        let ctx = verify(&u, &c, 1_599).unwrap().unwrap();
        assert_eq!(ctx.roles, vec!["_admin".to_string()]);
        assert_eq!(verify(&u, &c, 1_600).unwrap(), None);
        // The decoded cookie is `adm:3E8:` + 32 MAC bytes.
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&c)
            .unwrap();
        assert!(raw.starts_with(b"adm:3E8:") && raw.len() == 8 + 32);
        // Another user's salt, or a forged time, does not verify.
        let (bob_salt, _) = u.session_user("bob").unwrap();
        let forged = mint(u.session(), "adm", bob_salt, 1_000);
        assert_eq!(verify(&u, &forged, 1_001).unwrap(), None);
        let unknown = mint(u.session(), "eve", salt, 1_000);
        assert_eq!(verify(&u, &unknown, 1_001).unwrap(), None);
        assert_eq!(
            verify(&u, "!!", 1).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        assert!(verify(&u, "YWJj", 1).is_err()); // "abc": no colons
    }

    #[test]
    fn a_cookie_minted_by_couchdb_3_4_verifies() {
        // Captured from CouchDB 3.4.3 (`POST /_session` as admin:admin); the secret and the
        // admin hash are what it wrote into its local.ini (tests/fixtures/couchdb-3.4.3-local.ini).
        let settings = super::super::auth::AuthSettings {
            session: SessionSettings {
                secret: "a2e53dd4aef6ef9e7304bfbd4a03830e".into(),
                timeout_secs: 600,
            },
            ..Default::default()
        };
        let hash = "-pbkdf2:sha256-760669adacd56c93a318509f4db83a9b92609968c326bef77c28a17224b0be92,\
                    f5512f0141077776d790b65dea397196,600000";
        let u = Users::configure([("admin".to_string(), hash.to_string())], [], &settings).unwrap();
        let cookie = "YWRtaW46NkIwNDI3MDM6iW_du2ZJ13vENaY1VW_yD9T2nI2bizUV3piiQyB-xSE";
        let issued = 0x6B04_2703;
        let ctx = verify(&u, cookie, issued + 10).unwrap().unwrap();
        assert_eq!(ctx.name.as_deref(), Some("admin"));
        assert_eq!(verify(&u, cookie, issued + 600).unwrap(), None);
        // We mint the same bytes for the same user and time.
        let (salt, _) = u.session_user("admin").unwrap();
        assert_eq!(mint(u.session(), "admin", salt, issued), cookie);
    }

    #[test]
    fn old_cookies_are_renewed() {
        let u = users();
        let (salt, _) = u.session_user("bob").unwrap();
        let mut h = HeaderMap::new();
        let c = format!("AuthSession={}", mint(u.session(), "bob", salt, 1_000));
        h.insert(COOKIE, HeaderValue::from_str(&c).unwrap());
        assert_eq!(refreshed(&u, &h, 1_060), None);
        let fresh = refreshed(&u, &h, 1_061).unwrap();
        let v = fresh
            .split(';')
            .next()
            .unwrap()
            .strip_prefix("AuthSession=")
            .unwrap();
        assert_eq!(
            verify(&u, v, 1_061 + 599).unwrap().unwrap().name.as_deref(),
            Some("bob")
        );
        assert_eq!(refreshed(&u, &h, 1_600), None);
    }

    #[test]
    fn cookie_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            COOKIE,
            HeaderValue::from_static("a=1; AuthSession=xyz; b=2"),
        );
        assert_eq!(cookie_value(&h).as_deref(), Some("xyz"));
        h.insert(COOKIE, HeaderValue::from_static("AuthSession="));
        assert_eq!(cookie_value(&h), None);
        let c = set_cookie("v", 600, 0);
        assert_eq!(
            c,
            "AuthSession=v; Version=1; Expires=Thu, 01-Jan-1970 00:10:00 GMT; Max-Age=600; Path=/; HttpOnly"
        );
    }
}
