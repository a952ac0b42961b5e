//! Real CouchDB 3.4.3 processes for the scheduler benchmark (started through the script named
//! by `COUCHDB_PEER_SCRIPT`, stopped on drop), and the `/proc` readings the benchmark compares:
//! a process's CPU seconds and RSS, and the established TCP connections it holds to a port.

use std::collections::HashSet;
use std::net::TcpListener;
use std::process::Command;

/// One CouchDB node.
pub struct Couch {
    script: String,
    dir: tempfile::TempDir,
    /// Its HTTP port.
    pub port: u16,
    /// Its Erlang VM (beam) process.
    pub beam: u32,
}

impl Drop for Couch {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

impl Couch {
    /// Starts one on a free loopback port.
    pub fn start() -> Result<Self, String> {
        let script = std::env::var("COUCHDB_PEER_SCRIPT")
            .map_err(|_| "set COUCHDB_PEER_SCRIPT to the CouchDB 3.4.3 peer script".to_owned())?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let out = Command::new(&script)
            .arg("start")
            .arg(port.to_string())
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run {script}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "CouchDB did not start: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let mut couch = Self {
            script,
            dir,
            port,
            beam: 0,
        };
        couch.beam = find_beam(couch.dir.path())
            .ok_or("cannot find the beam process of the CouchDB just started")?;
        Ok(couch)
    }

    /// `http://admin:admin@127.0.0.1:{port}/{path}`.
    pub fn url(&self, path: &str) -> String {
        url_at(self.port, path)
    }
}

/// `http://admin:admin@127.0.0.1:{port}/{path}`: a node's URL from its port alone, for the
/// sampling thread, which does not hold the node.
pub fn url_at(port: u16, path: &str) -> String {
    format!("http://admin:admin@127.0.0.1:{port}/{path}")
}

/// The beam process whose command line names `dir` (its args file lives there).
fn find_beam(dir: &std::path::Path) -> Option<u32> {
    let needle = dir.to_string_lossy().into_owned();
    for _ in 0..100 {
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            if cmd.contains("beam") && cmd.contains(&needle) {
                return Some(pid);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    None
}

/// Resident set size of `pid` in MiB.
pub fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Established TCP connections process `pid` holds to `127.0.0.1:{port}`.
pub fn connections_to(pid: u32, port: u16) -> usize {
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) = (f.get(2), f.get(3), f.get(9)) else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == "01" && remote_port == Some(port) {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|l| inodes.contains(l.to_string_lossy().as_ref()))
        .count()
}
