//! Shared helpers of the steps integration tests: a cluster of steps nodes on one real
//! on-disk embedded store (each node with its own couch_jobs handle and background
//! processes, as separate processes would have), and a recording action.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_replicator::jobs::{Background, Jobs, JobsConfig, JobsOptions};
use couch_replicator::steps::{
    Action, ActionContext, ActionError, ActionOutcome, Steps, StepsConfig, StepsNode, WriteStats,
};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use futures::future::BoxFuture;
use tokio::time::Instant;

/// Steps settings for tests: 1 s activity timeout, fast idle rechecks.
pub fn test_config() -> StepsConfig {
    StepsConfig {
        activity_timeout_secs: 1,
        idle_recheck: Duration::from_millis(500),
        ..StepsConfig::default()
    }
}

/// couch_jobs settings for tests: types discovered within half a second.
pub fn jobs_config() -> JobsConfig {
    JobsConfig {
        type_check_period: Duration::from_millis(300),
        type_check_max_jitter: Duration::from_millis(100),
        activity_monitor_max_jitter: Duration::from_millis(200),
        ..JobsConfig::default()
    }
}

struct RunningNode {
    node: StepsNode,
    background: Background,
}

/// Several steps nodes sharing one embedded store.
pub struct Cluster {
    _dir: tempfile::TempDir,
    pub db: Db,
    pub stats: Arc<WriteStats>,
    pub config: StepsConfig,
    nodes: HashMap<String, RunningNode>,
}

impl Cluster {
    pub async fn open(config: StepsConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("steps.redb")).unwrap();
        Self {
            _dir: dir,
            db: Db::new(Arc::new(store)),
            stats: Arc::default(),
            config,
            nodes: HashMap::new(),
        }
    }

    pub fn jobs(&self) -> Jobs {
        Jobs::new(
            self.db.clone(),
            JobsOptions {
                config: jobs_config(),
                ..JobsOptions::default()
            },
        )
    }

    /// An API handle on a node that runs no workers.
    pub fn api(&self, name: &str) -> Steps {
        Steps::with_stats(self.jobs(), name, self.config.clone(), self.stats.clone()).unwrap()
    }

    pub async fn start_node(&mut self, name: &str, workers: usize, action: Arc<dyn Action>) {
        let config = self.config.clone();
        self.start_node_with(name, workers, action, config).await;
    }

    /// Starts a node with its own steps settings.
    pub async fn start_node_with(
        &mut self,
        name: &str,
        workers: usize,
        action: Arc<dyn Action>,
        config: StepsConfig,
    ) {
        let jobs = self.jobs();
        let background = jobs.start_background().await.unwrap();
        let steps = Steps::with_stats(jobs, name, config, self.stats.clone()).unwrap();
        let node = StepsNode::start(steps, action, workers).await.unwrap();
        self.nodes
            .insert(name.to_string(), RunningNode { node, background });
    }

    /// Kills a node: workers dropped mid-step, couch_jobs background killed.
    pub async fn kill_node(&mut self, name: &str) {
        let n = self.nodes.remove(name).unwrap();
        n.node.kill().await;
        n.background.kill().await;
    }

    /// A running node.
    pub fn node(&self, name: &str) -> &StepsNode {
        &self.nodes[name].node
    }

    /// Stops one node gracefully (running steps may end within `grace`).
    pub async fn stop_node(&mut self, name: &str, grace: Duration) {
        let n = self.nodes.remove(name).unwrap();
        n.node.stop(grace).await;
        n.background.stop().await;
    }

    pub async fn stop_all(&mut self) {
        for (_, n) in self.nodes.drain() {
            n.node.stop(Duration::from_secs(5)).await;
            n.background.stop().await;
        }
    }
}

/// One event of the recording action.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub job: String,
    pub step: usize,
    pub node: String,
    pub worker: String,
    pub attempt: u32,
    pub alternative: bool,
    pub command: String,
    pub start: Instant,
    /// `None` while running (or if the run was dropped).
    pub end: Option<Instant>,
}

/// Runs test commands in-process and records every run:
/// `sleep <secs>` exits 0 after the sleep; `exit <code>` exits at once with `code`;
/// `flaky <n>` fails (exit 1) on attempts 1..=n and then exits 0; `panic once` panics the
/// first time it runs in the process and exits 0 afterwards; `panic always` always panics.
#[derive(Default, Clone)]
pub struct Recorder {
    pub log: Arc<Mutex<Vec<Event>>>,
}

impl Recorder {
    pub fn events(&self) -> Vec<Event> {
        self.log.lock().unwrap().clone()
    }
}

impl Action for Recorder {
    fn run<'a>(
        &'a self,
        command: &'a str,
        ctx: &'a ActionContext,
    ) -> BoxFuture<'a, Result<ActionOutcome, ActionError>> {
        Box::pin(async move {
            let index = {
                let mut log = self.log.lock().unwrap();
                log.push(Event {
                    job: ctx.job_id.clone(),
                    step: ctx.step,
                    node: ctx.node.clone(),
                    worker: ctx.worker.clone(),
                    attempt: ctx.attempt,
                    alternative: ctx.alternative,
                    command: command.to_string(),
                    start: Instant::now(),
                    end: None,
                });
                log.len() - 1
            };
            let words: Vec<&str> = command.split_whitespace().collect();
            let outcome = match words.as_slice() {
                ["sleep", secs] => {
                    let secs: f64 = secs
                        .parse()
                        .map_err(|_| ActionError::Unsupported(command.into()))?;
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                    ActionOutcome::exited(0, format!("slept {secs}"))
                }
                ["exit", code] => {
                    let code: i32 = code
                        .parse()
                        .map_err(|_| ActionError::Unsupported(command.into()))?;
                    ActionOutcome::exited(code, format!("exit {code}"))
                }
                ["panic", "once"] => {
                    if ctx.attempt == 1 && !PANICKED.swap(true, std::sync::atomic::Ordering::SeqCst)
                    {
                        panic!("test action panics once");
                    }
                    ActionOutcome::exited(0, "no panic this time")
                }
                ["panic", "always"] => panic!("test action always panics"),
                ["flaky", n] => {
                    let n: u32 = n
                        .parse()
                        .map_err(|_| ActionError::Unsupported(command.into()))?;
                    let code = if ctx.attempt > n { 0 } else { 1 };
                    ActionOutcome::exited(code, format!("attempt {}", ctx.attempt))
                }
                _ => return Err(ActionError::Unsupported(command.into())),
            };
            self.log.lock().unwrap()[index].end = Some(Instant::now());
            Ok(outcome)
        })
    }

    fn name(&self) -> &'static str {
        "test recorder"
    }
}

static PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The admin of the test HTTP servers.
pub const ADMIN: (&str, &str) = ("adm", "s3cret");

/// Serves the `/_steps` routes of `steps` on a free loopback port; returns the base URL.
/// The server lives until the returned task is aborted (or the runtime ends).
pub async fn serve_steps(steps: Steps) -> (String, tokio::task::JoinHandle<()>) {
    use couch_replicator::http::steps::{StepsHttp, basic_admin, router};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(StepsHttp {
        steps,
        admin: basic_admin(ADMIN.0, ADMIN.1),
    });
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}"), task)
}
