//! A real Apache CouchDB 3.4.3 for tests that need CouchDB's own behaviour (replication ids,
//! checkpoints, JSON shapes), the oracle we compare against. It is started by the script named in
//! `COUCHDB_PEER_SCRIPT` (`.ci/run` sets it; a user points it at their own copy of the peer
//! script). Tests that need it carry `#[cfg_attr(not(couchdb_peer), ignore = ...)]`: `build.rs`
//! sets `couchdb_peer` when the variable is set at build time, so without it they are reported
//! as ignored, not passed. Run anyway (`--run-ignored`) without the variable, [`CouchPeer::start`]
//! prints why and returns `None`; with it, a CouchDB that does not start fails the test.

use std::path::PathBuf;
use std::process::Command;

use super::server::free_port;

/// The environment variable naming the start/stop script of the real CouchDB.
pub const PEER_SCRIPT_VAR: &str = "COUCHDB_PEER_SCRIPT";

/// A running CouchDB (single node, admin `admin:admin`), stopped when dropped.
pub struct CouchPeer {
    script: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

impl CouchPeer {
    /// Starts one on a free loopback port with the given server uuid (32 hex digits), or `None`
    /// (after printing why) when `COUCHDB_PEER_SCRIPT` is not set.
    pub fn start(test: &str, uuid: Option<&str>) -> Option<Self> {
        let Some(script) = std::env::var_os(PEER_SCRIPT_VAR) else {
            eprintln!(
                "{test}: skipped: {PEER_SCRIPT_VAR} is not set (no real CouchDB to compare with)"
            );
            return None;
        };
        let script = PathBuf::from(script);
        let mut last = String::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("temp dir for CouchDB");
            let port = free_port();
            let mut cmd = Command::new("bash");
            cmd.arg(&script)
                .arg("start")
                .arg(port.to_string())
                .arg(dir.path());
            if let Some(uuid) = uuid {
                cmd.env("COUCHDB_UUID", uuid);
            }
            let out = cmd.output().expect("run the CouchDB peer script");
            if out.status.success() {
                return Some(Self { script, dir, port });
            }
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = Command::new("bash")
                .arg(&script)
                .arg("stop")
                .arg(dir.path())
                .status();
        }
        panic!("{test}: CouchDB did not start ({PEER_SCRIPT_VAR} is set): {last}");
    }

    /// `http://127.0.0.1:PORT` (no trailing slash, no credentials).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `http://admin:admin@127.0.0.1:PORT` for requests that need the admin.
    pub fn admin_url(&self) -> String {
        format!("http://admin:admin@127.0.0.1:{}", self.port)
    }

    /// Logs in once before replicating: a fresh CouchDB creates its cookie secret at the
    /// first login, and concurrent first logins (source and target clients) can race.
    /// Also waits for `_users`: a single-node CouchDB creates its system databases just after
    /// it starts answering `_up`, so a test's first user could otherwise meet a 404.
    pub async fn warm_up_sessions(&self) {
        let http = reqwest::Client::new();
        let r = http
            .post(format!("{}/_session", self.url()))
            .json(&serde_json::json!({"name": "admin", "password": "admin"}))
            .send()
            .await
            .expect("POST _session");
        assert!(r.status().is_success(), "_session: {}", r.status());
        let users = format!("{}/_users", self.admin_url());
        for _ in 0..300 {
            let r = http.get(&users).send().await;
            if r.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("CouchDB did not create _users within 30 s");
    }

    /// Turns HTTPS on with `[ssl]` keys `ssl` (besides `enable` and `port`) on a fresh free
    /// port, restarts CouchDB so its HTTPS listener reads them (the peer script writes
    /// `local.ini` at each start, so the keys go through `_config`, which CouchDB persists)
    /// and returns the HTTPS port once it accepts connections. A fresh port each time makes
    /// the wait unambiguous when called again with other keys.
    pub async fn enable_ssl(&self, ssl: &[(&str, &str)]) -> u16 {
        let port = free_port();
        let http = reqwest::Client::new();
        let port_s = port.to_string();
        let mut keys = vec![("enable", "true"), ("port", port_s.as_str())];
        keys.extend_from_slice(ssl);
        for (k, v) in keys {
            let r = http
                .put(format!("{}/_node/_local/_config/ssl/{k}", self.admin_url()))
                .json(&v)
                .send()
                .await
                .expect("PUT _config/ssl");
            assert!(r.status().is_success(), "_config/ssl/{k}: {}", r.status());
        }
        let r = http
            .post(format!("{}/_node/_local/_restart", self.admin_url()))
            .send()
            .await
            .expect("POST _restart");
        assert!(r.status().is_success(), "_restart: {}", r.status());
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                let up = http.get(format!("{}/_up", self.url())).send().await;
                if up.is_ok_and(|r| r.status().is_success()) {
                    return port;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("CouchDB's HTTPS listener did not come up on {port}");
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding its `local.ini`, data and log.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for CouchPeer {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}
