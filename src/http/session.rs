//! Cookie login, CouchDB's `/_session`: `POST` (JSON or form `name`/`password`) answers
//! `{"ok":true,"name","roles"}` with an `AuthSession` cookie (made in `cookie.rs`), `GET`
//! describes the caller, `DELETE` clears the cookie. A request carrying a cookie older than a
//! tenth of its lifetime gets a fresh one, as in CouchDB; so does one carrying a cookie of the
//! authentication CouchDB that CouchDB renewed while checking it.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::header::{CONTENT_TYPE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::auth::{AuthMethod, Caller, HasUsers, RenewedCookie, Users};
use super::cookie::{cookie_value, mint, now_secs, set_cookie, verify_issued};
use super::error::HttpError;
use super::peer::Peer;

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
    Some(set_cookie(&mint(s, &name, salt, now), s, now))
}

/// Middleware adding [`refreshed`] cookies to responses that set none themselves.
pub(crate) async fn refresh_cookie(
    State(state): State<AppState>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let fresh = refreshed(state.users(), req.headers(), now_secs());
    // Filled when the authentication CouchDB renews its own cookie during the request.
    let renewed = RenewedCookie::default();
    req.extensions_mut().insert(renewed.clone());
    let mut resp = next.run(req).await;
    if let Some(c) = fresh.or_else(|| renewed.take())
        && !resp.headers().contains_key(SET_COOKIE)
        && let Ok(v) = HeaderValue::from_str(&c)
    {
        resp.headers_mut().insert(SET_COOKIE, v);
    }
    resp
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
pub(crate) async fn post_session(
    State(state): State<AppState>,
    peer: Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let form = login_form(&headers, &body)?;
    let users = state.users();
    let name = form.name.unwrap_or_default();
    let password = form.password.unwrap_or_default();
    let s = users.session();
    let now = now_secs();
    if let Some(ctx) = users.login_from(peer, &name, &password).await? {
        let salt = users.session_user(&name).map_or("", |(salt, _)| salt);
        let cookie = set_cookie(&mint(s, &name, salt, now), s, now);
        let body = json!({"ok": true, "name": name, "roles": ctx.roles});
        return Ok(with_cookie(StatusCode::OK, cookie, body));
    }
    // Not ours: the authentication CouchDB's user gets that CouchDB's cookie, which requests
    // here then present (and which works on that CouchDB too).
    if let Some(c) = users.couchdb() {
        let got = c
            .login(&name, &password)
            .await
            .map_err(|e| HttpError::unavailable(e.to_string()))?;
        if let Some((ctx, cookie)) = got {
            let ctx = users.not_local(ctx)?;
            let body = json!({"ok": true, "name": ctx.name, "roles": ctx.roles});
            let mut r = (StatusCode::OK, Json(body)).into_response();
            if let Some(v) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
                r.headers_mut().insert(SET_COOKIE, v);
            }
            return Ok(r);
        }
    }
    tracing::info!(user = %name, "session login refused");
    let body = json!({"error": "unauthorized", "reason": "Name or password is incorrect."});
    let cookie = set_cookie("", s, now);
    Ok(with_cookie(StatusCode::UNAUTHORIZED, cookie, body))
}

/// `?basic=true` asks for a 401 when anonymous, as CouchDB does.
#[derive(Deserialize)]
pub(crate) struct SessionQuery {
    basic: Option<String>,
}

/// `GET /_session`.
pub(crate) async fn get_session(
    State(state): State<AppState>,
    Query(q): Query<SessionQuery>,
    renewed: Option<axum::Extension<RenewedCookie>>,
    peer: Peer,
    headers: HeaderMap,
) -> Result<Json<Value>, HttpError> {
    let renewed = renewed.map(|axum::Extension(r)| r);
    let (caller, how) = state
        .users()
        .authenticate_headers(&headers, renewed.as_ref(), peer)
        .await?;
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
pub(crate) async fn delete_session(State(state): State<AppState>) -> Response {
    let s = state.users().session();
    with_cookie(
        StatusCode::OK,
        set_cookie("", s, now_secs()),
        json!({"ok": true}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::cookie::{SessionSettings, verify};
    use axum::http::header::COOKIE;
    use base64::Engine as _;

    fn users() -> Users {
        let settings = super::super::auth::AuthSettings {
            iterations: 2,
            session: SessionSettings {
                secret: "s3cr3t".into(),
                timeout_secs: 600,
                same_site: None,
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
                same_site: None,
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
        let mut s = SessionSettings {
            secret: "x".into(),
            timeout_secs: 600,
            same_site: None,
        };
        let c = set_cookie("v", &s, 0);
        assert_eq!(
            c,
            "AuthSession=v; Version=1; Expires=Thu, 01-Jan-1970 00:10:00 GMT; Max-Age=600; Path=/; HttpOnly"
        );
        s.same_site = Some("Lax".into());
        assert!(set_cookie("v", &s, 0).ends_with("; HttpOnly; SameSite=Lax"));
    }
}
