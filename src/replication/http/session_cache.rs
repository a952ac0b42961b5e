//! The node's `_session` cookies, shared by every job that reaches the same server as the same
//! user. CouchDB's `couch_replicator_auth_session` logs in once per replication; a node that
//! rotates hundreds of jobs against one server would then `POST /_session` at every job start
//! (two requests and two password hashes on the server per start). Jobs on the shared
//! transports ([`super::transport::Transports`]) look here first and log in only when no
//! fresh verdict exists.
//!
//! Keyed by server root, user name and a SHA-256 of the password, so a job with another (or a
//! wrong) password never gets someone else's cookie. Cookies are credentials: `Debug` shows
//! only how many entries there are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::replication::endpoint::database::Credentials;

/// What a server answered to the last login of a user.
#[derive(Clone)]
pub enum Verdict {
    /// A session cookie (`AuthSession=...`), obtained at `at`.
    Session {
        /// The `name=value` part of the cookie.
        cookie: String,
        /// When it was obtained.
        at: Instant,
    },
    /// The server grants no session: use Basic. Obtained at `at`, asked again after the
    /// refresh interval (the server may have been configured since).
    Basic {
        /// When it was decided.
        at: Instant,
        /// The login was answered 401: the credentials are wrong (CouchDB's
        /// `replication_auth_error` once the endpoint refuses them too).
        refused: bool,
    },
}

impl Verdict {
    /// When the verdict was obtained.
    pub fn at(&self) -> Instant {
        match self {
            Self::Session { at, .. } | Self::Basic { at, .. } => *at,
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    root: String,
    user: String,
    password: [u8; 32],
}

/// One user's slot: its lock makes concurrent job starts wait for one login instead of each
/// logging in.
pub type Slot = Arc<tokio::sync::Mutex<Option<Verdict>>>;

/// The shared verdicts.
#[derive(Default)]
pub struct SessionCache {
    slots: Mutex<HashMap<Key, Slot>>,
}

impl std::fmt::Debug for SessionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionCache({} users)", self.lock().len())
    }
}

impl SessionCache {
    /// The slot of `creds` at the server `root`.
    pub fn slot(&self, root: &str, creds: &Credentials) -> Slot {
        let key = Key {
            root: root.to_owned(),
            user: creds.username.clone(),
            password: Sha256::digest(creds.password.as_bytes()).into(),
        };
        self.lock().entry(key).or_default().clone()
    }

    /// Users with a slot.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no user has a slot.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Slot>> {
        // Every update is one insert: a poisoned map is still consistent.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(user: &str, password: &str) -> Credentials {
        Credentials {
            username: user.into(),
            password: password.into(),
        }
    }

    #[test]
    fn one_slot_per_server_user_and_password() {
        let c = SessionCache::default();
        let a = c.slot("http://h:5984/", &creds("bob", "pw"));
        let a2 = c.slot("http://h:5984/", &creds("bob", "pw"));
        assert!(Arc::ptr_eq(&a, &a2));
        let wrong = c.slot("http://h:5984/", &creds("bob", "other"));
        assert!(!Arc::ptr_eq(&a, &wrong), "another password, another slot");
        let elsewhere = c.slot("http://g:5984/", &creds("bob", "pw"));
        assert!(!Arc::ptr_eq(&a, &elsewhere));
        assert_eq!(c.len(), 3);
        let shown = format!("{c:?}");
        assert!(!shown.contains("bob") && !shown.contains("pw"), "{shown}");
    }
}
