//! A real etcd cluster of 1 or 3 members on free loopback ports, each member a child process
//! known by pid with its data in a temp dir, killed when the [`EtcdCluster`] is dropped (and
//! asked by the kernel to die with the test process). Tests skip, saying why, when the `etcd`
//! binary is missing (`ETCD_BIN`, else `etcd` on PATH; `bash scripts/deps` installs it).
//! Self-contained so that benches can include it with `#[path]`.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One member: its ports and process.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    token: String,
    /// Serve clients over TLS: the directory holding `ca.pem`, `server.pem` and
    /// `server-key.pem`, client certificates required.
    tls: Option<PathBuf>,
}

/// A client of `endpoints` that trusts `tls`'s CA and presents `client_cert`/`client_key`
/// (plain without `tls`).
async fn client_of(
    endpoints: &[String],
    tls: Option<&PathBuf>,
) -> Result<etcd_client::Client, String> {
    let mut config = couch_replicator::store::etcd::EtcdConfig::new(endpoints.to_vec());
    if let Some(dir) = tls {
        config.ca_file = Some(dir.join("ca.pem"));
        config.cert_file = Some(dir.join("inter-client.pem"));
        config.key_file = Some(dir.join("inter-client-key.pem"));
    }
    config.client().await.map_err(|e| e.to_string())
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// The etcd binary, or `None` when it is not installed.
pub fn etcd_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("ETCD_BIN") {
        return Some(PathBuf::from(bin));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster serves a linearizable read; `None`
    /// (after printing why) when etcd is not installed.
    pub async fn start(n: usize) -> Option<Self> {
        Self::start_with(n, None).await
    }

    /// One member serving clients over TLS with the certificates in `pki_dir` (`ca.pem`,
    /// `server.pem`, `server-key.pem`), requiring a client certificate signed by that CA;
    /// the readiness check presents `inter-client.pem`/`inter-client-key.pem`.
    pub async fn start_tls(pki_dir: PathBuf) -> Option<Self> {
        Self::start_with(1, Some(pki_dir)).await
    }

    async fn start_with(n: usize, tls: Option<PathBuf>) -> Option<Self> {
        let Some(bin) = etcd_bin() else {
            println!("skipping: the etcd binary is not installed (bash scripts/deps installs it)");
            return None;
        };
        // A port picked free may be taken by another test's server before the member binds
        // it; that member then exits at once, and the cluster starts again on new ports.
        let mut attempt = 1;
        loop {
            let mut cluster = Self::spawn_all(&bin, n, tls.clone());
            match cluster.wait_ready(Duration::from_secs(30)).await {
                Ok(()) => return Some(cluster),
                Err(e) if attempt < 3 && cluster.a_member_exited() => {
                    eprintln!("etcd cluster, attempt {attempt}: {e}; starting again on new ports");
                    attempt += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// `n` members on free ports, spawned.
    fn spawn_all(bin: &PathBuf, n: usize, tls: Option<PathBuf>) -> Self {
        let members = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = Self {
            members,
            dir: tempfile::tempdir().expect("tempdir"),
            token: format!("t{}", uuid::Uuid::new_v4().simple()),
            tls,
        };
        for i in 0..n {
            cluster.spawn(bin, i);
        }
        cluster
    }

    /// Some member's process has ended (it could not bind its ports, most likely).
    fn a_member_exited(&mut self) -> bool {
        self.members
            .iter_mut()
            .filter_map(|m| m.child.as_mut())
            .any(|c| !matches!(c.try_wait(), Ok(None)))
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, bin: &PathBuf, i: usize) {
        let initial = self.initial_cluster();
        let dir = self.dir.path().to_path_buf();
        let tls = self.tls.clone();
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.log", m.name)))
            .expect("member log");
        let log2 = log.try_clone().expect("log");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut cmd = Command::new(bin);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(dir.join(&m.name))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            // Fast elections on loopback, so a killed leader is replaced in well under a second.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            // Auth tokens unused for 2 s expire (300 s by default), so that a test with
            // authentication on sees a client outlive its token.
            .args(["--auth-token-ttl", "2"])
            .args(["--logger", "zap", "--log-level", "warn"]);
        if let Some(pki) = &tls {
            let file = |n: &str| pki.join(n).display().to_string();
            cmd.args(["--cert-file", &file("server.pem")])
                .args(["--key-file", &file("server-key.pem")])
                .args(["--trusted-ca-file", &file("ca.pem")])
                .arg("--client-cert-auth");
        }
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        // SAFETY: prctl is async-signal-safe; called between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        m.child = Some(cmd.spawn().expect("spawn etcd"));
    }

    async fn wait_ready(&mut self, within: Duration) -> Result<(), String> {
        let started = Instant::now();
        let endpoints = self.endpoints();
        let mut last = String::new();
        while started.elapsed() < within {
            match client_of(&endpoints, self.tls.as_ref()).await {
                Ok(mut client) => match client.get("ready", None).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
            if self.a_member_exited() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "etcd not ready after {:?}: {last}; logs in {}",
            started.elapsed(),
            self.dir.path().display()
        ))
    }

    /// Client URLs of the members (running or not).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| {
                let scheme = if self.tls.is_some() { "https" } else { "http" };
                format!("{scheme}://127.0.0.1:{}", m.client_port)
            })
            .collect()
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.endpoints()[i].clone()
    }

    /// The pid of member `i`, if running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// SIGKILLs member `i` (its data stays for [`EtcdCluster::restart`]).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data dir.
    pub fn restart(&mut self, i: usize) {
        let bin = etcd_bin().expect("etcd binary");
        self.spawn(&bin, i);
    }

    /// `etcdctl endpoint hashkv` of each running member that answers (at its latest
    /// revision), via the API: (name, hash, revision).
    pub async fn hashkv(&self) -> Vec<(String, u32, i64)> {
        let mut out = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let Ok(mut client) = etcd_client::Client::connect([self.endpoint(i)], None).await
            else {
                continue;
            };
            if let Ok(resp) = client.hash_kv(0).await {
                let rev = resp.header().map_or(0, |h| h.revision());
                out.push((m.name.clone(), resp.hash(), rev));
            }
        }
        out
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
