//! Who is calling: HTTP Basic credentials or an `AuthSession` cookie (`super::session`)
//! checked against the node's configured users (`[admins]`, and optional non-admin `[users]`),
//! then, when one is configured, against a CouchDB ([`super::couchdb_auth`]: its `_users` and
//! admins, so a CouchDB user keeps their name and roles here).
//! Entries are CouchDB password hashes ([`super::password`]); plain ones are hashed when the
//! node starts, so no password is kept in clear. Handlers ask for a [`Caller`] and call
//! [`Caller::require_admin`] / [`Caller::require_user`] before changing state. A password that
//! passed PBKDF2 once is remembered as a keyed digest, so later requests cost one HMAC
//! instead of CouchDB's 600,000 rounds (CouchDB keeps a cache for the same reason).
//!
//! Requests are authenticated in `auth/caller.rs` (cookie, then Basic, then the CouchDB: the
//! [`Caller`]) and check passwords through `auth/login.rs` (the lockout, then PBKDF2 off the
//! async runtime, a decoy for unknown names).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rand::RngCore as _;

use super::cookie::{SessionSettings, SessionUsers, hmac_sha256};
use super::couchdb_auth::CouchDbAuth;
use super::error::HttpError;
use super::lockout::{Lockout, LockoutSettings};
use super::password::{Prf, StoredPassword, same_bytes};

mod caller;
mod login;
use crate::replicator::replicator_db::request::UserCtx;
pub use caller::Caller;
pub(crate) use caller::{AuthMethod, HasUsers, RenewedCookie};

/// How plain entries are hashed at start and how sessions are signed (`[chttpd_auth]`).
#[derive(Clone)]
pub struct AuthSettings {
    /// PBKDF2 rounds for plain entries (`iterations`, CouchDB: 600,000).
    pub iterations: u32,
    /// PRF for plain entries (`pbkdf2_prf`, CouchDB: sha256).
    pub prf: Prf,
    /// Cookie signing secret and lifetime.
    pub session: SessionSettings,
    /// `[chttpd_auth_lockout]`.
    pub lockout: LockoutSettings,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            iterations: 600_000,
            prf: Prf::Sha256,
            session: SessionSettings::default(),
            lockout: LockoutSettings::default(),
        }
    }
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("iterations", &self.iterations)
            .field("prf", &self.prf)
            .field("timeout_secs", &self.session.timeout_secs)
            .finish()
    }
}

struct Account {
    stored: StoredPassword,
    admin: bool,
}

struct Inner {
    admins: HashMap<String, Account>,
    users: HashMap<String, Account>,
    session: SessionSettings,
    /// Keys the remembered-password digests; random per start.
    cache_key: [u8; 32],
    /// Per account (`admin:` / `user:` + name): digest of the password that last verified.
    verified: Mutex<HashMap<String, [u8; 32]>>,
    lockout: Lockout,
    /// PBKDF2 runs in flight at most.
    hashing: tokio::sync::Semaphore,
    /// What an unknown name's password is hashed against (made on first use).
    decoy: OnceLock<StoredPassword>,
    prf: Prf,
    iterations: u32,
}

/// The users this node knows, and the CouchDB asked about the others. `Debug` shows names
/// only. Cheap to clone.
#[derive(Clone)]
pub struct Users {
    inner: Arc<Inner>,
    couchdb: Option<Arc<CouchDbAuth>>,
}

impl Default for Users {
    fn default() -> Self {
        Self::build(HashMap::new(), HashMap::new(), &AuthSettings::default())
    }
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut a: Vec<_> = self.inner.admins.keys().collect();
        a.sort();
        let mut u: Vec<_> = self.inner.users.keys().collect();
        u.sort();
        f.debug_struct("Users")
            .field("admins", &a)
            .field("users", &u)
            .field("couchdb", &self.couchdb.as_ref().map(|c| c.url()))
            .finish()
    }
}

/// Hashes or parses configured entries; errors name the entry, never its value.
fn accounts(
    entries: impl IntoIterator<Item = (String, String)>,
    admin: bool,
    s: &AuthSettings,
    seed: &mut Vec<(String, String)>,
) -> Result<HashMap<String, Account>, String> {
    let mut out = HashMap::new();
    for (name, value) in entries {
        let section = if admin { "admins" } else { "users" };
        let stored = match StoredPassword::parse(&value) {
            Ok(Some(h)) => h,
            Ok(None) => {
                seed.push((cache_id(admin, &name), value.clone()));
                StoredPassword::hash_plain(&value, s.prf, s.iterations)
            }
            Err(e) => return Err(format!("[{section}] {name}: {e}")),
        };
        out.insert(name, Account { stored, admin });
    }
    Ok(out)
}

fn cache_id(admin: bool, name: &str) -> String {
    format!("{}:{name}", if admin { "admin" } else { "user" })
}

impl Users {
    /// Server admins and plain users, `(name, password or CouchDB hash)` each, with CouchDB's
    /// hashing defaults. Entries that are malformed hashes are left out (and logged); use
    /// [`Users::configure`] to refuse them instead.
    // Users without configuration checks, for the crate's tests.
    #[cfg(any(test, feature = "internals"))]
    pub fn new(
        admins: impl IntoIterator<Item = (String, String)>,
        users: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        let keep = |v: Vec<(String, String)>| {
            v.into_iter()
                .filter(|(n, p)| {
                    let ok = StoredPassword::parse(p).is_ok();
                    if !ok {
                        tracing::warn!(user = %n, "ignoring a malformed password hash");
                    }
                    ok
                })
                .collect::<Vec<_>>()
        };
        let a = keep(admins.into_iter().collect());
        let u: Vec<(String, String)> = keep(users.into_iter().collect())
            .into_iter()
            .filter(|(n, _)| {
                let admin = a.iter().any(|(an, _)| an == n);
                if admin {
                    tracing::warn!(user = %n, "ignoring a [users] entry that names an admin");
                }
                !admin
            })
            .collect();
        Self::configure(a, u, &AuthSettings::default()).unwrap_or_default()
    }

    /// Users from configuration: plain entries are hashed with `settings`, CouchDB hashes are
    /// kept as they are; a malformed hash is an error naming the entry.
    pub fn configure(
        admins: impl IntoIterator<Item = (String, String)>,
        users: impl IntoIterator<Item = (String, String)>,
        settings: &AuthSettings,
    ) -> Result<Self, String> {
        let mut seed = Vec::new();
        let admins = accounts(admins, true, settings, &mut seed)?;
        let users = accounts(users, false, settings, &mut seed)?;
        // One name, two passwords: either would open the account, and a cookie names only
        // the account, so a user's login would have minted an admin's session.
        if let Some(name) = users.keys().find(|n| admins.contains_key(*n)) {
            return Err(format!(
                "`{name}` is in both [admins] and [users]: a name may be one account only"
            ));
        }
        let me = Self::build(admins, users, settings);
        // A plain entry was just hashed from the password at hand: remember it verified, so
        // the first login does not pay PBKDF2 again.
        for (id, pw) in seed {
            me.remember(&id, &pw);
        }
        Ok(me)
    }

    fn build(
        admins: HashMap<String, Account>,
        users: HashMap<String, Account>,
        settings: &AuthSettings,
    ) -> Self {
        let mut cache_key = [0u8; 32];
        rand::rng().fill_bytes(&mut cache_key);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            inner: Arc::new(Inner {
                admins,
                users,
                session: settings.session.clone(),
                cache_key,
                verified: Mutex::new(HashMap::new()),
                lockout: Lockout::new(settings.lockout.clone()),
                hashing: tokio::sync::Semaphore::new((cores / 2).max(1)),
                decoy: OnceLock::new(),
                prf: settings.prf,
                iterations: settings.iterations,
            }),
            couchdb: None,
        }
    }

    /// The same users; callers they do not know are checked by `couchdb`.
    pub fn with_couchdb(mut self, couchdb: Arc<CouchDbAuth>) -> Self {
        self.couchdb = Some(couchdb);
        self
    }

    /// The CouchDB that checks the callers this node does not know, if any.
    pub fn couchdb(&self) -> Option<&Arc<CouchDbAuth>> {
        self.couchdb.as_ref()
    }

    /// True when no admin is configured and no CouchDB can vouch for one (every state change
    /// is then refused).
    pub fn has_no_admins(&self) -> bool {
        self.inner.admins.is_empty() && self.couchdb.is_none()
    }

    /// The session settings (cookie lifetime and secret).
    pub fn session(&self) -> &SessionSettings {
        &self.inner.session
    }

    /// The salt and context of `name` for cookies (see [`SessionUsers`]).
    pub(crate) fn session_user(&self, name: &str) -> Option<(&str, UserCtx)> {
        self.session_user_of(name)
    }

    fn digest(&self, password: &str) -> [u8; 32] {
        hmac_sha256(&self.inner.cache_key, &[password.as_bytes()])
    }

    /// Whether `password` is the one last verified for `id` (its keyed digest is remembered,
    /// so a known password skips the hashing).
    fn remembered(&self, id: &str, password: &str) -> bool {
        let d = self.digest(password);
        let known = self
            .inner
            .verified
            .lock()
            .ok()
            .and_then(|m| m.get(id).copied());
        known.is_some_and(|k| same_bytes(&k, &d))
    }

    fn remember(&self, id: &str, password: &str) {
        let d = self.digest(password);
        if let Ok(mut m) = self.inner.verified.lock() {
            m.insert(id.to_owned(), d);
        }
    }

    #[cfg(any(test, feature = "internals"))]
    fn check(&self, acct: &Account, name: &str, password: &str) -> bool {
        let id = cache_id(acct.admin, name);
        if self.remembered(&id, password) {
            return true;
        }
        let ok = acct.stored.verify(password);
        if ok {
            self.remember(&id, password);
        }
        ok
    }

    /// The caller a name and password identify (admins first), or `None`; hashes on the
    /// calling thread and counts no failure (tests and tools; requests use `login_from`).
    #[cfg(any(test, feature = "internals"))]
    pub fn login(&self, name: &str, password: &str) -> Option<UserCtx> {
        for acct in [self.inner.admins.get(name), self.inner.users.get(name)]
            .into_iter()
            .flatten()
        {
            if self.check(acct, name, password) {
                return Some(ctx_of(name, acct));
            }
        }
        None
    }

    /// The account's cookie salt and user context, for a name an `AuthSession` cookie names.
    fn session_user_of(&self, name: &str) -> Option<(&str, UserCtx)> {
        let acct = self
            .inner
            .admins
            .get(name)
            .or_else(|| self.inner.users.get(name))?;
        Some((acct.stored.salt(), ctx_of(name, acct)))
    }

    /// A user the authentication CouchDB vouches for, unless the name is one of this node's
    /// own (`[admins]`, `[users]`): a CouchDB user who signs up as `admin` must not see or
    /// cancel the jobs of this node's `admin`. 401, as a wrong password.
    pub(crate) fn not_local(&self, u: UserCtx) -> Result<UserCtx, HttpError> {
        let name = u.name.as_deref().unwrap_or("");
        if self.inner.admins.contains_key(name) || self.inner.users.contains_key(name) {
            tracing::info!(user = %name, "a CouchDB user named like a local account was refused");
            return Err(HttpError::unauthorized(
                "Name or password is incorrect. (this name belongs to an account of this node: \
                 its users from the authentication CouchDB cannot use it)",
            ));
        }
        Ok(u)
    }
}

impl SessionUsers for Users {
    fn session(&self) -> &SessionSettings {
        Users::session(self)
    }

    fn session_user(&self, name: &str) -> Option<(&str, UserCtx)> {
        self.session_user_of(name)
    }
}

fn ctx_of(name: &str, acct: &Account) -> UserCtx {
    UserCtx {
        name: Some(name.to_owned()),
        roles: if acct.admin {
            vec!["_admin".into()]
        } else {
            Vec::new()
        },
    }
}

/// Compares two secrets in time independent of where they differ.
#[cfg(any(test, feature = "internals"))]
pub(crate) fn same(a: &str, b: &str) -> bool {
    same_bytes(a.as_bytes(), b.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn basic(u: &str, p: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        )
    }

    #[test]
    fn a_name_in_both_admins_and_users_is_refused() {
        let e = Users::configure(
            [("bob".to_owned(), "a".to_owned())],
            [("bob".to_owned(), "b".to_owned())],
            &AuthSettings {
                iterations: 1,
                ..AuthSettings::default()
            },
        )
        .unwrap_err();
        assert!(e.contains("`bob` is in both [admins] and [users]"), "{e}");
        let lenient = Users::new(
            [("bob".to_owned(), "a".to_owned())],
            [("bob".to_owned(), "b".to_owned())],
        );
        assert!(
            lenient.login("bob", "b").is_none(),
            "the user entry is dropped"
        );
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
