//! N real `couch-replicator serve` processes sharing one etcd cluster, as N machines would:
//! each with its own config file (the same `[couchdb] uuid`, its own `node_name`), data dir
//! and free port, known by pid, asked by the kernel to die with the process that started
//! them, killed (SIGKILL) on drop. [`ServeCluster::kill`] is a crash (`kill -9`),
//! [`ServeCluster::restart`] starts the node again on the same config.
//! Self-contained (the binary's path is passed in) so that the cluster example and the
//! benches can include it with `#[path]`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// libfaketime's preload library, when installed (`apt-get install faketime`).
pub fn libfaketime() -> Option<&'static str> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
}

/// The server admin of every node.
pub const ADMIN: (&str, &str) = ("admin", "admin");

/// One `serve` process.
pub struct ServeNode {
    /// Its node name (`nodeI@127.0.0.1`).
    pub name: String,
    /// `http://127.0.0.1:PORT` of its current (or last) run.
    pub base: String,
    child: Option<Child>,
    /// This node's own etcd endpoints (e.g. through relays), instead of the cluster's.
    endpoints: Option<String>,
    /// Environment variables of this node's process (e.g. libfaketime's).
    env: Vec<(String, String)>,
}

/// N `serve` processes on one etcd.
pub struct ServeCluster {
    bin: PathBuf,
    endpoints: String,
    dir: tempfile::TempDir,
    /// The nodes, index 0..N (`node1`..`nodeN`).
    pub nodes: Vec<ServeNode>,
    http: reqwest::Client,
}

impl ServeCluster {
    /// Starts `n` nodes of binary `bin` on the etcd `endpoints` (comma separated; none: each
    /// node on its own embedded store, for a single-node comparison); `ini` is
    /// added to every node's config file (e.g. `[replicator]\nmax_jobs = 500\n`; later keys
    /// win over the defaults written here: 1 s interval, 5 s activity timeout).
    pub async fn start(bin: &Path, endpoints: &str, n: usize, ini: &str) -> Result<Self, String> {
        let mut cluster = Self::prepare(bin, endpoints, n, ini)?;
        // One after the other: the first records the cluster's uuid in the store.
        for i in 0..n {
            cluster.restart(i).await?;
        }
        Ok(cluster)
    }

    /// As [`ServeCluster::start`] without starting any node (see [`ServeCluster::restart`]).
    pub fn prepare(bin: &Path, endpoints: &str, n: usize, ini: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let uuid = format!("cluster-{}", std::process::id());
        let mut cluster = Self {
            bin: bin.to_path_buf(),
            endpoints: endpoints.to_owned(),
            dir,
            nodes: Vec::new(),
            http: reqwest::Client::new(),
        };
        for i in 0..n {
            let name = format!("node{}@127.0.0.1", i + 1);
            let cfg = format!(
                "[replicator]\ninterval_sec = 1\nstartup_jitter = 100\njob_timeout_sec = 5\n\
                 cluster_quiet_period = 1\ncluster_start_period = 1\n\
                 [admins]\n{} = {}\n[couchdb]\nuuid = {uuid}\nnode_name = {name}\n{ini}",
                ADMIN.0, ADMIN.1
            );
            std::fs::write(cluster.config_path(i), cfg).map_err(|e| format!("config: {e}"))?;
            cluster.nodes.push(ServeNode {
                name,
                base: String::new(),
                child: None,
                endpoints: None,
                env: Vec::new(),
            });
        }
        Ok(cluster)
    }

    fn config_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node{}.ini", i + 1))
    }

    /// Where node `i` logs (its stderr, appended across restarts).
    pub fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node{}.log", i + 1))
    }

    /// Node `i` reaches etcd at `endpoints` (comma separated) from its next start on, e.g.
    /// through relays a test can block to cut it off.
    pub fn set_endpoints(&mut self, i: usize, endpoints: String) {
        self.nodes[i].endpoints = Some(endpoints);
    }

    /// Adds `text` to node `i`'s config file, from its next start on (later keys win).
    pub fn append_config(&mut self, i: usize, text: &str) -> Result<(), String> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.config_path(i))
            .map_err(|e| format!("config: {e}"))?;
        writeln!(f, "{text}").map_err(|e| format!("config: {e}"))
    }

    /// Node `i` runs with `key=value` in its environment from its next start on.
    pub fn set_env(&mut self, i: usize, key: &str, value: &str) {
        self.nodes[i].env.push((key.to_owned(), value.to_owned()));
    }

    /// Starts node `i` (again), on a new free port, and waits until it listens.
    pub async fn restart(&mut self, i: usize) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .map_err(|e| format!("log: {e}"))?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("data{}", i + 1)))
            .arg("--config")
            .arg(self.config_path(i))
            .args(["--port", "0"])
            .env(
                "RUST_LOG",
                std::env::var("CLUSTER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(self.nodes[i].env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; called between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let endpoints = self.nodes[i].endpoints.as_ref().unwrap_or(&self.endpoints);
        if !endpoints.is_empty() {
            cmd.args(["--etcd-endpoints", endpoints]);
        }
        let mut child = cmd.spawn().map_err(|e| format!("spawn serve: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .map_err(|_| format!("node {} did not listen within 60 s", i + 1))?
            .map_err(|e| format!("stdout: {e}"))?
            .ok_or_else(|| {
                let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "node {} exited before listening; the end of its log:\n{}",
                    i + 1,
                    lines[lines.len().saturating_sub(20)..].join("\n")
                )
            })?;
        let base = first
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected line {first}"))?
            .to_owned();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.nodes[i].base = base;
        self.nodes[i].child = Some(child);
        Ok(())
    }

    /// Stops node `i` as an operator does (SIGTERM) and waits for it to exit.
    pub async fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            if let Some(pid) = child.id() {
                // SAFETY: kill(2) with a pid this process started.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
        }
    }

    /// SIGKILLs node `i` (`kill -9`): no graceful stop, its jobs keep their locks until the
    /// activity timeout or a neighbour's removal hands them on.
    pub async fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// The pid of node `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().and_then(Child::id)
    }

    /// Indexes of the nodes that run.
    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].child.is_some())
            .collect()
    }

    /// `METHOD base_of_node_i/path` as the admin, with an optional JSON body; the status
    /// and the JSON answer.
    pub async fn call(
        &self,
        i: usize,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let url = format!("{}/{}", self.nodes[i].base, path.trim_start_matches('/'));
        let mut req = self
            .http
            .request(method, &url)
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .timeout(Duration::from_secs(30));
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status().as_u16();
        let json = resp.json().await.unwrap_or(Value::Null);
        Ok((status, json))
    }

    /// Every active job as node `i`'s `_scheduler/jobs` lists it: (replication id,
    /// `running` when it has a `pid` else `pending`, node).
    pub async fn jobs(&self, i: usize) -> Result<Vec<(String, String, String)>, String> {
        let (status, body) = self
            .call(
                i,
                reqwest::Method::GET,
                "_scheduler/jobs?limit=100000",
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("_scheduler/jobs answered {status}: {body}"));
        }
        let s = |j: &Value, k: &str| j[k].as_str().unwrap_or("").to_owned();
        Ok(body["jobs"]
            .as_array()
            .map(|jobs| {
                jobs.iter()
                    .map(|j| {
                        let state = if j["pid"].is_null() {
                            "pending"
                        } else {
                            "running"
                        };
                        (s(j, "id"), state.to_owned(), s(j, "node"))
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The ids of the jobs node `i`'s process runs itself (`_node/_local/_replicator_jobs`).
    pub async fn local_jobs(&self, i: usize) -> Result<Vec<String>, String> {
        let (status, body) = self
            .call(
                i,
                reqwest::Method::GET,
                "_node/_local/_replicator_jobs",
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("_replicator_jobs answered {status}: {body}"));
        }
        Ok(body["jobs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl ServeCluster {
    /// The last `n` lines each node logged.
    pub fn log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        for i in 0..self.nodes.len() {
            let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(n)..];
            out.push_str(&format!(
                "--- last lines of node{} ---\n{}\n",
                i + 1,
                tail.join("\n")
            ));
        }
        out
    }
}

impl Drop for ServeCluster {
    /// A failing test shows the last lines each node logged: the processes and their temp
    /// dir go with the cluster, so this is the only trace left of what they did.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails(40));
        }
    }
}
