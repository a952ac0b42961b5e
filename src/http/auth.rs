//! Who is calling: HTTP Basic credentials checked against the node's configured users
//! (`[admins]`, and optional non-admin `[users]`). Handlers ask for a [`Caller`] and call
//! [`Caller::require_admin`] / [`Caller::require_user`] before changing state. Passwords are
//! compared without early exit and never logged or echoed.

use std::collections::HashMap;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use base64::Engine as _;

use super::error::HttpError;
use crate::replicator::rep_doc::UserCtx;

/// The users this node knows. `Debug` shows names only.
#[derive(Clone, Default)]
pub struct Users {
    admins: HashMap<String, String>,
    users: HashMap<String, String>,
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut a: Vec<_> = self.admins.keys().collect();
        a.sort();
        let mut u: Vec<_> = self.users.keys().collect();
        u.sort();
        f.debug_struct("Users")
            .field("admins", &a)
            .field("users", &u)
            .finish()
    }
}

impl Users {
    /// Server admins and plain users, `(name, password)` each.
    pub fn new(
        admins: impl IntoIterator<Item = (String, String)>,
        users: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        Self {
            admins: admins.into_iter().collect(),
            users: users.into_iter().collect(),
        }
    }

    /// True when no admin is configured (every state change is then refused).
    pub fn has_no_admins(&self) -> bool {
        self.admins.is_empty()
    }

    /// Checks an `Authorization` header value.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Caller, HttpError> {
        let Some(h) = header else {
            return Ok(Caller::Anonymous);
        };
        let Some((name, password)) = decode_basic(h) else {
            return Err(HttpError::unauthorized(
                "only Basic authentication with name:password is supported",
            ));
        };
        if let Some(p) = self.admins.get(&name)
            && same(p, &password)
        {
            return Ok(Caller::User(UserCtx {
                name: Some(name),
                roles: vec!["_admin".into()],
            }));
        }
        if let Some(p) = self.users.get(&name)
            && same(p, &password)
        {
            return Ok(Caller::User(UserCtx {
                name: Some(name),
                roles: Vec::new(),
            }));
        }
        Err(HttpError::unauthorized("Name or password is incorrect."))
    }
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

/// `(name, password)` of a `Basic` `Authorization` header value.
pub(crate) fn decode_basic(h: &str) -> Option<(String, String)> {
    let (scheme, rest) = h.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (n, p) = s.split_once(':')?;
    Some((n.to_owned(), p.to_owned()))
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
                "authentication required: send Basic credentials",
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
    pub fn is_admin(&self) -> bool {
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
pub trait HasUsers {
    /// The configured users.
    fn users(&self) -> &Users;
}

impl<S: HasUsers + Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let h = match parts.headers.get(AUTHORIZATION) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| {
                HttpError::unauthorized("the Authorization header is not valid text")
            })?),
        };
        state.users().authenticate(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(u: &str, p: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        )
    }

    #[test]
    fn admins_users_and_failures() {
        let users = Users::new(
            [("adm".to_string(), "pw:with:colons".to_string())],
            [("bob".to_string(), "b".to_string())],
        );
        let a = users
            .authenticate(Some(&basic("adm", "pw:with:colons")))
            .unwrap();
        assert!(a.is_admin() && a.require_admin().is_ok());
        let b = users.authenticate(Some(&basic("bob", "b"))).unwrap();
        assert_eq!(b.name(), Some("bob"));
        assert_eq!(
            b.require_admin().unwrap_err().status,
            axum::http::StatusCode::FORBIDDEN
        );
        assert_eq!(
            Caller::Anonymous.require_user().unwrap_err().status,
            axum::http::StatusCode::UNAUTHORIZED
        );
        // An admin name with a user's password, wrong passwords, other schemes: all 401.
        for h in [
            basic("adm", "b"),
            basic("bob", "pw"),
            "Bearer x".into(),
            "Basic !!".into(),
        ] {
            let e = users.authenticate(Some(&h)).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::UNAUTHORIZED, "{h}");
            assert!(!e.reason.contains("pw:with"));
        }
        assert!(!format!("{users:?}").contains("pw"));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
