//! Endpoint authentication (CouchDB's couch_replicator_httpc.erl `auth_plugins`): a `_session` cookie when the server
//! grants one, refreshed on 401/403 or after `session_refresh_interval_sec`, else HTTP basic.
//! Takes the endpoint's credentials; gives the header to put on each request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

use base64::Engine as _;
use tokio::sync::Mutex;

use super::session_cache::{SessionCache, Slot, Verdict};
use crate::replication::endpoint::database::{Credentials, Endpoint};

/// How endpoints authenticate (`[replicator] auth_plugins`, `session_refresh_interval_sec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuthPolicy {
    /// Try a `_session` cookie first (`couch_replicator_auth_session` listed); else Basic only.
    pub session: bool,
    /// Refresh a cookie after this long (CouchDB: 550 s).
    pub refresh: Duration,
}

impl Default for AuthPolicy {
    fn default() -> Self {
        Self {
            session: true,
            refresh: Duration::from_secs(550),
        }
    }
}
/// Do not refresh again within this window after a refresh.
const MIN_REFRESH_GAP: Duration = Duration::from_secs(5);

enum Mode {
    /// Not decided yet: try `_session` first.
    Unknown,
    Basic,
    Session {
        cookie: String,
        at: Instant,
    },
}

/// Per-endpoint authentication state. `Debug` shows only the mode, never the secrets.
pub(crate) struct Auth {
    creds: Option<Credentials>,
    basic: Option<String>,
    root: String,
    refresh: Duration,
    mode: Mutex<Mode>,
    /// The node's shared verdict for these credentials, if the client is on shared transports.
    shared: Option<Slot>,
    /// The last login was answered 401 (see [`Auth::login_refused`]).
    refused: AtomicBool,
    /// A cookie refused as soon as it was obtained has been replaced once already (see
    /// [`Auth::on_rejected`]).
    fresh_refusal_retried: AtomicBool,
    /// How many times the mode changed (a login, a shared verdict taken): a request sent
    /// before the latest change is retried with what replaced its credentials.
    generation: AtomicU64,
    /// How many connections to open ahead while the first login runs (see [`Auth::warm_up`]).
    warm: usize,
    /// Connections were opened ahead for the requests waiting on the first login.
    warmed: AtomicBool,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.mode.try_lock().as_deref() {
            Ok(Mode::Unknown) => "unknown",
            Ok(Mode::Basic) => "basic",
            Ok(Mode::Session { .. }) => "session",
            Err(_) => "busy",
        };
        f.debug_struct("Auth")
            .field("user", &self.creds.as_ref().map(|c| c.username.as_str()))
            .field("mode", &mode)
            .finish()
    }
}

impl Auth {
    /// Authentication for an endpoint under `policy`.
    pub(crate) fn with_policy(ep: &Endpoint, policy: AuthPolicy) -> Self {
        let basic = ep.credentials.as_ref().map(|c| {
            let raw = format!("{}:{}", c.username, c.password);
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(raw)
            )
        });
        Self {
            creds: ep.credentials.clone(),
            basic,
            root: ep.server_root(),
            refresh: policy.refresh,
            mode: Mutex::new(if policy.session {
                Mode::Unknown
            } else {
                Mode::Basic
            }),
            shared: None,
            refused: AtomicBool::new(false),
            fresh_refusal_retried: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            warm: 2,
            warmed: AtomicBool::new(false),
        }
    }

    /// Opens `n` connections ahead while the first login runs (2 by default: the start's
    /// requests that wait on the login are the source's database and checkpoint and the
    /// target's creation; a replication's first wave of batches needs about as many as its
    /// window starts with).
    pub(crate) fn warming(mut self, n: usize) -> Self {
        self.warm = n;
        self
    }

    /// Whether the server refused these credentials at `_session`: an endpoint's 401 is then
    /// CouchDB's `replication_auth_error`, not a database the user may not open.
    pub(crate) fn login_refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// Shares logins with every other client of the same server and credentials through
    /// `cache`: a fresh cookie (or "no sessions here") found there is used without a login.
    pub fn share_through(&mut self, cache: &SessionCache) {
        if let Some(creds) = &self.creds {
            self.shared = Some(cache.slot(&self.root, creds));
        }
    }

    /// The header to send, obtaining or refreshing a session cookie when due, and the
    /// credentials' generation it belongs to (for [`Auth::on_rejected`]).
    pub(crate) async fn header(
        &self,
        http: &reqwest::Client,
    ) -> (Option<(&'static str, String)>, u64) {
        let Some(creds) = self.creds.as_ref() else {
            return (None, self.generation());
        };
        let mut mode = self.mode.lock().await;
        let due = match &*mode {
            Mode::Unknown => true,
            Mode::Session { at, .. } => at.elapsed() > self.refresh,
            Mode::Basic => false,
        };
        if due {
            let started = Instant::now();
            let warming = match *mode {
                Mode::Unknown => self.warm_up(http),
                _ => None,
            };
            *mode = self.obtain(http, creds).await;
            if let Some(warming) = warming {
                // Started with the login, they normally are done with it; a connection still
                // opening when the waiting requests go would be opened twice.
                let _ = tokio::time::timeout(started.elapsed() / 4, warming).await;
            }
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        let header = match &*mode {
            Mode::Session { cookie, .. } => Some(("cookie", cookie.clone())),
            _ => self.basic.clone().map(|b| ("authorization", b)),
        };
        (header, self.generation())
    }

    /// Before the first login: opens the configured number of connections to the server with
    /// `GET /` (no credentials, so nothing a server could count as a failed login), unless a
    /// fresh shared verdict makes the login unnecessary. Over a long link the requests waiting
    /// on the login then find open connections instead of paying a handshake each after it
    /// (a round trip, and more with TLS). CouchDB's replicator sends no such request.
    /// Returns what completes once they are back in the pool.
    fn warm_up(&self, http: &reqwest::Client) -> Option<impl Future<Output = ()> + use<>> {
        let fresh = self.shared.as_ref().is_some_and(|slot| {
            slot.try_lock()
                .is_ok_and(|v| v.as_ref().is_some_and(|v| v.at().elapsed() <= self.refresh))
        });
        if fresh || self.warmed.swap(true, Ordering::Relaxed) {
            return None;
        }
        let opened: Vec<_> = (0..self.warm)
            .map(|_| {
                let get = http.get(&self.root).header("accept", "application/json");
                tokio::spawn(async move {
                    // The body is read so the connection goes back to the pool; one longer
                    // or slower than a welcome message is dropped with its connection.
                    let drain = async {
                        let Ok(mut r) = get.send().await else { return };
                        let mut room: usize = 64 << 10;
                        while let Ok(Some(c)) = r.chunk().await {
                            let Some(left) = room.checked_sub(c.len()) else {
                                return;
                            };
                            room = left;
                        }
                    };
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), drain).await;
                })
            })
            .collect();
        Some(async move {
            futures::future::join_all(opened).await;
        })
    }

    /// The credentials' generation now.
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Called on 401/403 of a request sent at credentials generation `sent`: retry at once
    /// when they changed since (another request replaced them), else refresh the cookie
    /// unless it was just refreshed. Returns true when
    /// a retry with a new cookie makes sense. A cookie refused just after it was obtained is
    /// replaced once all the same: a CouchDB that has no `[chttpd_auth] secret` yet makes one
    /// at its first logins, and of two logins at that moment one gets a cookie signed with a
    /// secret the server then drops (seen on a fresh CouchDB 3.4.3 when source and target
    /// logged in at once).
    pub(crate) async fn on_rejected(&self, http: &reqwest::Client, sent: u64) -> bool {
        let Some(creds) = self.creds.as_ref() else {
            return false;
        };
        let mut mode = self.mode.lock().await;
        if self.generation() != sent {
            return true;
        }
        let Mode::Session { cookie: used, at } = &*mode else {
            return false;
        };
        let just_refreshed = at.elapsed() <= MIN_REFRESH_GAP
            && self.fresh_refusal_retried.swap(true, Ordering::Relaxed);
        let Some(slot) = &self.shared else {
            if just_refreshed {
                return false;
            }
            *mode = self.login(http, creds).await;
            self.generation.fetch_add(1, Ordering::AcqRel);
            return matches!(*mode, Mode::Session { .. });
        };
        let mut shared = slot.lock().await;
        // Another client may already have replaced the cookie that was just refused.
        if let Some(Verdict::Session { cookie, at }) = &*shared
            && cookie != used
        {
            *mode = Mode::Session {
                cookie: cookie.clone(),
                at: *at,
            };
            self.generation.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        if just_refreshed {
            return false;
        }
        *mode = self.login(http, creds).await;
        self.generation.fetch_add(1, Ordering::AcqRel);
        *shared = Some(self.verdict_of(&mode));
        matches!(*mode, Mode::Session { .. })
    }

    /// A login, or the shared verdict when a fresh one exists (then no request is made).
    async fn obtain(&self, http: &reqwest::Client, creds: &Credentials) -> Mode {
        let Some(slot) = &self.shared else {
            return self.login(http, creds).await;
        };
        let mut shared = slot.lock().await;
        match &*shared {
            Some(Verdict::Session { cookie, at }) if at.elapsed() <= self.refresh => {
                return Mode::Session {
                    cookie: cookie.clone(),
                    at: *at,
                };
            }
            Some(Verdict::Basic { at, refused }) if at.elapsed() <= self.refresh => {
                self.refused.store(*refused, Ordering::Relaxed);
                return Mode::Basic;
            }
            _ => {}
        }
        let mode = self.login(http, creds).await;
        *shared = Some(self.verdict_of(&mode));
        mode
    }

    async fn login(&self, http: &reqwest::Client, creds: &Credentials) -> Mode {
        let body = serde_json::json!({"name": creds.username, "password": creds.password});
        let resp = http
            .post(format!("{}_session", self.root))
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(body.to_string())
            .send()
            .await;
        let refused = resp
            .as_ref()
            .is_ok_and(|r| r.status() == reqwest::StatusCode::UNAUTHORIZED);
        self.refused.store(refused, Ordering::Relaxed);
        let cookie = resp.ok().filter(|r| r.status().is_success()).and_then(|r| {
            r.headers()
                .get_all("set-cookie")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find(|v| v.starts_with("AuthSession="))
                .and_then(|v| v.split(';').next())
                .map(str::to_owned)
        });
        match cookie {
            Some(cookie) => Mode::Session {
                cookie,
                at: Instant::now(),
            },
            None => Mode::Basic,
        }
    }
}

impl Auth {
    /// What to share of a login's outcome.
    fn verdict_of(&self, mode: &Mode) -> Verdict {
        match mode {
            Mode::Session { cookie, at } => Verdict::Session {
                cookie: cookie.clone(),
                at: *at,
            },
            Mode::Unknown | Mode::Basic => Verdict::Basic {
                at: Instant::now(),
                refused: self.login_refused(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        let ep = Endpoint::parse("http://bob:pa55word@127.0.0.1:5984/db").unwrap();
        let a = Auth::with_policy(&ep, AuthPolicy::default());
        let shown = format!("{a:?}");
        assert!(shown.contains("bob"), "{shown}");
        assert!(
            !shown.contains("pa55word") && !shown.contains("Basic"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn basic_only_policy_never_asks_for_a_session() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let ep = Endpoint::parse(&format!("http://bob:pw@127.0.0.1:{port}/db")).unwrap();
        let policy = AuthPolicy {
            session: false,
            ..AuthPolicy::default()
        };
        let a = Auth::with_policy(&ep, policy);
        let (k, v) = a.header(&reqwest::Client::new()).await.0.unwrap();
        assert_eq!(k, "authorization");
        assert!(v.starts_with("Basic "));
        // A session login would have connected (and waited for an answer) before `header`
        // returned; the wait only bounds the check that nothing did.
        let accepted = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
        assert!(accepted.is_err(), "a connection was made");
    }
}
