//! A real Apache CouchDB 3.4.3 for tests that need CouchDB's own behaviour (replication ids,
//! checkpoints, JSON shapes), the oracle we compare against. It is started by the script named in
//! `COUCHDB_PEER_SCRIPT` (`.ci/run` sets it; a user points it at their own copy of the peer
//! script). Without the variable, [`CouchPeer::start`] prints why and returns `None` so the test
//! can skip; with it, a CouchDB that does not start fails the test.

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
    pub async fn warm_up_sessions(&self) {
        let r = reqwest::Client::new()
            .post(format!("{}/_session", self.url()))
            .json(&serde_json::json!({"name": "admin", "password": "admin"}))
            .send()
            .await
            .expect("POST _session");
        assert!(r.status().is_success(), "_session: {}", r.status());
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
