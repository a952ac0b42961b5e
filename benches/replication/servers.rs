//! pouchdb-server instances for the benchmark: each runs `--in-memory` on a free loopback
//! port with its working directory (config.json, log.txt) in its own temp dir, and is killed
//! when dropped. Exposes its pid so the benchmark can read the server's CPU time.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::measure::proc_cpu_seconds;

/// One running pouchdb-server.
pub struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts a server and waits until it answers `GET /`.
    pub async fn start(http: &reqwest::Client) -> Result<Self, String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let bin = root.join("node_modules/.bin/pouchdb-server");
        if !bin.exists() {
            return Err(format!("{} missing: run `npm ci` first", bin.display()));
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let child = Command::new(&bin)
            .args([
                "--in-memory",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start pouchdb-server: {e}"))?;
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = http.get(server.root()).send().await
                && r.status().is_success()
            {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err("pouchdb-server did not answer within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn root(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// The URL of database `db`.
    pub fn db(&self, db: &str) -> String {
        format!("http://127.0.0.1:{}/{db}", self.port)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU seconds (user + system) the server process has used so far.
    pub fn cpu_seconds(&self) -> f64 {
        proc_cpu_seconds(self.child.id()).unwrap_or(0.0)
    }

    /// Creates database `db`.
    pub async fn create_db(&self, http: &reqwest::Client, db: &str) -> Result<(), String> {
        let r = http
            .put(self.db(db))
            .send()
            .await
            .map_err(|e| format!("PUT {db}: {e}"))?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!("PUT {db} answered {}", r.status()))
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
