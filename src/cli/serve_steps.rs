//! The `[steps]` part of `serve`: the steps handle behind `/_steps` (always mounted, so any
//! node takes submissions) and this node's steps workers, started only when `[steps]
//! workers` is above 0.
//!
//! Settings (`[steps]`): `workers` (default 0: none), `action` (`disabled`, the default,
//! `shell` or `sleep`), `shell_timeout` (seconds, default 60), `activity_timeout` (seconds,
//! default 30), `node` (the name steps target; default the part of the node name before
//! `@`, since steps node names allow only letters, digits, `-`, `_` and `.`).

use std::sync::Arc;
use std::time::Duration;

use crate::jobs::Jobs;
use crate::steps::{
    Action, DisabledAction, ShellAction, SleepAction, Steps, StepsConfig, StepsNode,
};

use super::config_file::ConfigFile;

/// What `[steps]` asks of this node.
#[derive(Debug, Clone, PartialEq)]
pub struct StepsSetup {
    /// Steps node name.
    pub node: String,
    /// Workers to start (0: this node only takes submissions).
    pub workers: usize,
    /// `disabled`, `shell` or `sleep`.
    pub action: String,
    /// Shell command timeout.
    pub shell_timeout: Duration,
    /// Job type settings.
    pub config: StepsConfig,
}

/// The `[steps]` keys read here.
pub const STEPS_KEYS: &[&str] = &[
    "workers",
    "action",
    "shell_timeout",
    "activity_timeout",
    "node",
];

fn num<T: std::str::FromStr>(cfg: &ConfigFile, key: &str, default: T) -> Result<T, String> {
    match cfg.get("steps", key) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("[steps] {key} must be a number, not `{v}`")),
    }
}

impl StepsSetup {
    /// Reads `[steps]`; `node_name` is the replicator node name.
    pub fn from_config(cfg: &ConfigFile, node_name: &str) -> Result<Self, String> {
        let node = cfg.get("steps", "node").map_or_else(
            || node_name.split('@').next().unwrap_or(node_name).to_owned(),
            str::to_owned,
        );
        let action = cfg.get("steps", "action").unwrap_or("disabled").to_owned();
        if !matches!(action.as_str(), "disabled" | "shell" | "sleep") {
            return Err(format!(
                "[steps] action must be disabled, shell or sleep, not `{action}`"
            ));
        }
        let config = StepsConfig {
            activity_timeout_secs: num(cfg, "activity_timeout", 30i64)?.max(1),
            ..StepsConfig::default()
        };
        Ok(Self {
            node,
            workers: num(cfg, "workers", 0usize)?,
            action,
            shell_timeout: Duration::from_secs(num(cfg, "shell_timeout", 60u64)?),
            config,
        })
    }

    /// The steps handle on the node's job store.
    pub fn steps(&self, jobs: Jobs) -> Result<Steps, String> {
        Steps::new(jobs, &self.node, self.config.clone()).map_err(|e| format!("[steps] {e}"))
    }

    fn action(&self) -> Arc<dyn Action> {
        match self.action.as_str() {
            "shell" => Arc::new(ShellAction::new(self.shell_timeout)),
            "sleep" => Arc::new(SleepAction),
            _ => Arc::new(DisabledAction),
        }
    }

    /// Starts the workers when `workers > 0`.
    pub async fn start_workers(&self, steps: Steps) -> Result<Option<StepsNode>, String> {
        if self.workers == 0 {
            return Ok(None);
        }
        StepsNode::start(steps, self.action(), self.workers)
            .await
            .map(Some)
            .map_err(|e| format!("steps workers: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors() {
        let s = StepsSetup::from_config(&ConfigFile::default(), "node1@127.0.0.1").unwrap();
        assert_eq!(s.node, "node1");
        assert_eq!(s.workers, 0);
        assert_eq!(s.action, "disabled");
        let cfg = ConfigFile::parse("[steps]\nworkers = 3\naction = shell\nnode = b-2\n").unwrap();
        let s = StepsSetup::from_config(&cfg, "n@h").unwrap();
        assert_eq!(
            (s.workers, s.action.as_str(), s.node.as_str()),
            (3, "shell", "b-2")
        );
        let bad = ConfigFile::parse("[steps]\naction = rm\n").unwrap();
        assert!(
            StepsSetup::from_config(&bad, "n")
                .unwrap_err()
                .contains("action")
        );
        let bad = ConfigFile::parse("[steps]\nworkers = many\n").unwrap();
        assert!(
            StepsSetup::from_config(&bad, "n")
                .unwrap_err()
                .contains("workers")
        );
    }
}
