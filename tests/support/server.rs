//! A real `pouchdb-server --in-memory` on a free loopback port, its working files in a temp
//! dir. The node process runs in its own process group, killed (whole group) when the
//! [`PouchServer`] is dropped — also while a failing test unwinds — and asked by the kernel to
//! die with the test process (PR_SET_PDEATHSIG), so no test leaves orphans behind.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running pouchdb-server.
pub struct PouchServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// A free loopback port (bound then released; the race window is tiny).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// True when process `pid` holds the listening socket of loopback port `port`. A port from
/// [`free_port`] can be taken by another test's server before ours binds it (ours then exits
/// with EADDRINUSE), and until it does, `GET /` on that port reaches the other server: a
/// start counts only once the listener is our child's.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Fields: sl, local address, remote address, state (0A = LISTEN), ..., inode.
            (f.len() > 9 && f[1] == local && f[3] == "0A").then(|| f[9].to_owned())
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let t = target.to_string_lossy();
            inodes.iter().any(|i| t == format!("socket:[{i}]"))
        })
    })
}

fn server_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("node_modules/.bin/pouchdb-server")
}

impl PouchServer {
    /// Starts a server and waits (up to 30 s) until it answers `GET /`.
    pub async fn start() -> Self {
        let mut last_err = String::new();
        for _ in 0..3 {
            match Self::try_start().await {
                Ok(s) => return s,
                Err(e) => last_err = e,
            }
        }
        panic!("pouchdb-server did not start: {last_err}");
    }

    async fn try_start() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = free_port();
        let log =
            std::fs::File::create(dir.path().join("stdout.txt")).map_err(|e| e.to_string())?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(server_bin());
        cmd.args([
            "--in-memory",
            "--no-stdout-logs",
            "--host",
            "127.0.0.1",
            "--port",
        ])
        .arg(port.to_string())
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .process_group(0);
        // SAFETY: prctl is async-signal-safe; called between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawn {:?}: {e}", server_bin()))?;
        let mut server = Self { child, port, dir };
        let http = reqwest::Client::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("exited with {status}; output: {}", server.output()));
            }
            if let Ok(r) = http.get(server.root()).send().await
                && r.status().is_success()
                && listens_on(server.child.id(), port)
            {
                return Ok(server);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "not ready on port {port} after 30 s; output: {}",
            server.output()
        ))
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn root(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// The URL of database `db`.
    pub fn db_url(&self, db: &str) -> String {
        format!("http://127.0.0.1:{}/{db}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node process id (its process group id too).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process runs (it crashes on some inputs, see the notes).
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the server printed (for failure messages).
    pub fn output(&self) -> String {
        let s = std::fs::read_to_string(self.dir.path().join("stdout.txt")).unwrap_or_default();
        let tail: String = s.chars().rev().take(2000).collect();
        tail.chars().rev().collect()
    }
}

impl Drop for PouchServer {
    fn drop(&mut self) {
        let pgid = self.child.id() as i32;
        // SAFETY: signalling the process group we created for this child.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}
