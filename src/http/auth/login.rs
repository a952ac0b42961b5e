//! Checking a name and password for a request ([`Users::login_from`]): CouchDB's lockout
//! first (`super::super::lockout`), then the remembered digest, then PBKDF2 on tokio's
//! blocking pool with at most `Inner::hashing` runs in flight, so a burst of wrong passwords
//! queues there instead of starving the async runtime. A name this node does not know is
//! hashed against a decoy, so answer times do not tell which names exist.

use std::net::{IpAddr, Ipv4Addr};

use super::super::error::HttpError;
use super::super::password::StoredPassword;
use super::super::peer::Peer;
use super::{Account, Users, cache_id, ctx_of};
use crate::replicator::replicator_db::request::UserCtx;

impl Users {
    /// Whether `password` opens `acct`: the remembered digest, else PBKDF2 on the blocking
    /// pool (a permit of `hashing` held meanwhile).
    async fn check_off_runtime(&self, acct: &Account, name: &str, password: &str) -> bool {
        let id = cache_id(acct.admin, name);
        if self.remembered(&id, password) {
            return true;
        }
        let ok = self.hash_off_runtime(acct.stored.clone(), password).await;
        if ok {
            self.remember(&id, password);
        }
        ok
    }

    async fn hash_off_runtime(&self, stored: StoredPassword, password: &str) -> bool {
        let Ok(_permit) = self.inner.hashing.acquire().await else {
            return false;
        };
        let password = password.to_owned();
        tokio::task::spawn_blocking(move || stored.verify(&password))
            .await
            .unwrap_or(false)
    }

    /// The caller a name and password identify (admins first), `None` when they do not, or
    /// 403 while the name is locked out for `peer`. Hashing runs off the async runtime; an
    /// unknown name costs what a known one does (without a CouchDB to ask about it).
    pub(crate) async fn login_from(
        &self,
        peer: Peer,
        name: &str,
        password: &str,
    ) -> Result<Option<UserCtx>, HttpError> {
        let accounts: Vec<&Account> = [self.inner.admins.get(name), self.inner.users.get(name)]
            .into_iter()
            .flatten()
            .collect();
        if accounts.is_empty() {
            if self.couchdb.is_none() {
                let (prf, rounds) = (self.inner.prf, self.inner.iterations);
                let decoy = self.inner.decoy.get_or_init(|| {
                    StoredPassword::hash_plain(&uuid::Uuid::new_v4().to_string(), prf, rounds)
                });
                self.hash_off_runtime(decoy.clone(), password).await;
            }
            return Ok(None);
        }
        let peer = peer.0.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        self.inner.lockout.check(peer, name)?;
        for acct in accounts {
            if self.check_off_runtime(acct, name, password).await {
                return Ok(Some(ctx_of(name, acct)));
            }
        }
        self.inner.lockout.failed(peer, name);
        Ok(None)
    }
}
