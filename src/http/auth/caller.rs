//! Who is calling a request: its `AuthSession` cookie, else its Basic credentials, checked
//! against this node's users, then against the authentication CouchDB when one is configured
//! ([`Users::authenticate_headers`]); the [`Caller`] handlers extract, how it authenticated
//! ([`AuthMethod`]), and the CouchDB cookie renewed on the way ([`RenewedCookie`]).

use std::sync::{Arc, Mutex};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::super::cookie;
use super::super::couchdb_auth::{CouchDbAuthError, Credential, Verdict};
use super::super::error::HttpError;
use super::super::peer::Peer;
use super::Users;
use crate::replication::endpoint::database::decode_basic;
use crate::replicator::replicator_db::request::UserCtx;

/// How a request was authenticated (`info.authenticated` of `GET /_session`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthMethod {
    /// An `AuthSession` cookie from `POST /_session` (`"cookie"`).
    Cookie,
    /// HTTP Basic (`"default"`).
    Basic,
}

impl AuthMethod {
    /// CouchDB's handler name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cookie => "cookie",
            Self::Basic => "default",
        }
    }
}

impl Users {
    /// Checks an `Authorization` header value against the configured users only.
    #[cfg(any(test, feature = "internals"))]
    pub fn authenticate(&self, header: Option<&str>) -> Result<Caller, HttpError> {
        let Some(h) = header else {
            return Ok(Caller::Anonymous);
        };
        let (name, password) = basic_pair(h)?;
        self.login(&name, &password)
            .map(Caller::User)
            .ok_or_else(wrong_password)
    }

    /// Authenticates a request as CouchDB does: a valid `AuthSession` cookie first, then
    /// Basic credentials; neither is anonymous. A cookie that cannot be decoded is 400.
    /// Configured users are checked first, then the CouchDB, if any (503 when it cannot
    /// answer: the credentials may be fine).
    /// A CouchDB cookie that CouchDB renewed is left in `renewed` for the response.
    pub(crate) async fn authenticate_headers(
        &self,
        headers: &axum::http::HeaderMap,
        renewed: Option<&RenewedCookie>,
        peer: Peer,
    ) -> Result<(Caller, Option<AuthMethod>), HttpError> {
        if let Some(cookie) = cookie::cookie_value(headers) {
            if let Some(u) = cookie::verify(self, &cookie, cookie::now_secs())? {
                return Ok((Caller::User(u), Some(AuthMethod::Cookie)));
            }
            if let Some(c) = &self.couchdb {
                let (verdict, set_cookie) = c
                    .check(Credential::Cookie(&cookie))
                    .await
                    .map_err(unavailable)?;
                if let (Some(slot), Some(v)) = (renewed, set_cookie) {
                    slot.set(v);
                }
                match verdict {
                    Verdict::User(u) => {
                        let u = self.not_local(u)?;
                        return Ok((Caller::User(u), Some(AuthMethod::Cookie)));
                    }
                    Verdict::BadCookie(reason) => return Err(HttpError::bad_request(reason)),
                    // Expired or not CouchDB's either: on to Basic, as CouchDB goes on.
                    Verdict::Rejected => {}
                }
            }
        }
        let Some(h) = headers.get(AUTHORIZATION) else {
            return Ok((Caller::Anonymous, None));
        };
        let h = h
            .to_str()
            .map_err(|_| HttpError::unauthorized("the Authorization header is not valid text"))?;
        let (name, password) = basic_pair(h)?;
        if let Some(u) = self.login_from(peer, &name, &password).await? {
            return Ok((Caller::User(u), Some(AuthMethod::Basic)));
        }
        let Some(c) = &self.couchdb else {
            return Err(wrong_password());
        };
        let cred = Credential::Basic {
            name: &name,
            password: &password,
        };
        match c.check(cred).await.map_err(unavailable)?.0 {
            Verdict::User(u) => Ok((Caller::User(self.not_local(u)?), Some(AuthMethod::Basic))),
            Verdict::Rejected | Verdict::BadCookie(_) => Err(wrong_password()),
        }
    }
}

/// Where authentication leaves a `Set-Cookie` to send with the response: a CouchDB cookie
/// CouchDB renewed while checking it. The cookie middleware puts one in every request's
/// extensions and adds what it holds to the response.
#[derive(Clone, Default)]
pub(crate) struct RenewedCookie(Arc<Mutex<Option<String>>>);

impl RenewedCookie {
    fn set(&self, v: String) {
        if let Ok(mut g) = self.0.lock() {
            *g = Some(v);
        }
    }

    /// The renewed cookie, if any.
    pub(crate) fn take(&self) -> Option<String> {
        self.0.lock().ok().and_then(|mut g| g.take())
    }
}

fn wrong_password() -> HttpError {
    HttpError::unauthorized("Name or password is incorrect.")
}

fn unavailable(e: CouchDbAuthError) -> HttpError {
    HttpError::unavailable(e.to_string())
}

/// The name and password of a Basic header, or 401.
fn basic_pair(h: &str) -> Result<(String, String), HttpError> {
    decode_basic(h)
        .map(|c| (c.username, c.password))
        .ok_or_else(|| {
            HttpError::unauthorized("only Basic authentication with name:password is supported")
        })
}

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No credentials were sent.
    Anonymous,
    /// Valid credentials.
    User(UserCtx),
}

impl Caller {
    /// The caller's user context, or 401.
    pub fn require_user(&self) -> Result<&UserCtx, HttpError> {
        match self {
            Caller::User(u) => Ok(u),
            Caller::Anonymous => Err(HttpError::unauthorized(
                "authentication required: send Basic credentials or an AuthSession cookie",
            )),
        }
    }

    /// The admin's user context, 401 when anonymous, 403 for a non-admin.
    pub fn require_admin(&self) -> Result<&UserCtx, HttpError> {
        let u = self.require_user()?;
        if u.is_admin() {
            Ok(u)
        } else {
            Err(HttpError::forbidden("You are not a server admin."))
        }
    }

    /// True for a server admin.
    pub(crate) fn is_admin(&self) -> bool {
        matches!(self, Caller::User(u) if u.is_admin())
    }

    /// The user name, if authenticated.
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::User(u) => u.name.as_deref(),
            Caller::Anonymous => None,
        }
    }
}

/// Gives handlers access to the node's users.
pub(crate) trait HasUsers {
    /// The configured users.
    fn users(&self) -> &Users;
}

impl<S: HasUsers + Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let renewed = parts.extensions.get::<RenewedCookie>().cloned();
        state
            .users()
            .authenticate_headers(&parts.headers, renewed.as_ref(), Peer::of(parts))
            .await
            .map(|(c, _)| c)
    }
}
