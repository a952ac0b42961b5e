//! What a step's command does: the [`Action`] trait the host implements, the context a
//! command runs in, its outcome, and the default [`DisabledAction`] that runs nothing.
//!
//! Command execution is off unless the host chooses an action (docs/architecture.md, "Steps jobs"): the
//! library default fails every step with "command execution is disabled". The shell action
//! ([`super::shell::ShellAction`]) and the in-process sleep action
//! ([`super::sleep_action::SleepAction`]) must be chosen explicitly.

use futures::future::BoxFuture;

/// Where a command runs: which job, step, attempt and worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionContext {
    /// The steps job's id.
    pub job_id: String,
    /// 0-based step index.
    pub step: usize,
    /// 1-based attempt of this command (retries count up; the alternative command is 1).
    pub attempt: u32,
    /// True when this is the step's alternative command, run after every attempt failed.
    pub alternative: bool,
    /// The node the worker runs on.
    pub node: String,
    /// The worker's name, `<node>/<index>`.
    pub worker: String,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ActionOutcome {
    /// The exit status; `None` when there is none (killed, timed out).
    pub exit_status: Option<i32>,
    /// What the command printed (the worker truncates it to the configured limit).
    pub output: String,
    /// The command was killed because it ran past its timeout.
    pub timed_out: bool,
}

impl ActionOutcome {
    /// A command that exited with `code`.
    pub fn exited(code: i32, output: impl Into<String>) -> Self {
        Self {
            exit_status: Some(code),
            output: output.into(),
            timed_out: false,
        }
    }

    /// Success is exit status 0, as for shell commands.
    pub fn succeeded(&self) -> bool {
        self.exit_status == Some(0)
    }
}

/// Why an action could not run a command at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// The host did not enable command execution.
    #[error("command execution is disabled")]
    Disabled,
    /// The action does not understand this command.
    #[error("unsupported command: {0}")]
    Unsupported(String),
    /// The command could not be started or watched (spawn or I/O failure).
    #[error("command could not run: {0}")]
    Failed(String),
}

impl ActionError {
    /// Retrying cannot help: the same command will be refused again.
    pub fn is_permanent(&self) -> bool {
        matches!(self, ActionError::Disabled | ActionError::Unsupported(_))
    }
}

/// Runs step commands. Implemented by the host; must be cancel-safe (a worker that loses its
/// step lock drops the future, and whatever the command started must stop then).
pub trait Action: Send + Sync + 'static {
    /// Runs `command` to completion.
    fn run<'a>(
        &'a self,
        command: &'a str,
        ctx: &'a ActionContext,
    ) -> BoxFuture<'a, Result<ActionOutcome, ActionError>>;

    /// A short name for logs.
    fn name(&self) -> &'static str;
}

/// The default: runs nothing and fails every step clearly.
#[derive(Debug, Clone, Copy, Default)]
pub struct DisabledAction;

impl Action for DisabledAction {
    fn run<'a>(
        &'a self,
        _command: &'a str,
        _ctx: &'a ActionContext,
    ) -> BoxFuture<'a, Result<ActionOutcome, ActionError>> {
        Box::pin(async { Err(ActionError::Disabled) })
    }

    fn name(&self) -> &'static str {
        "disabled"
    }
}

/// Cuts `text` to at most `limit` bytes on a character boundary, marking the cut.
pub fn truncate_output(mut text: String, limit: usize) -> String {
    const MARK: &str = "\n[output truncated]";
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(MARK);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_default_action_refuses_to_run_anything() {
        let ctx = ActionContext {
            job_id: "j".into(),
            step: 0,
            attempt: 1,
            alternative: false,
            node: "a".into(),
            worker: "a/0".into(),
        };
        let err = DisabledAction.run("rm -rf /", &ctx).await.unwrap_err();
        assert_eq!(err.to_string(), "command execution is disabled");
        assert!(err.is_permanent());
        assert!(!ActionError::Failed("x".into()).is_permanent());
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_output("abc".into(), 3), "abc");
        assert_eq!(truncate_output("abcd".into(), 2), "ab\n[output truncated]");
        // 'é' is two bytes: cutting at 1 must not split it.
        assert_eq!(truncate_output("éa".into(), 1), "\n[output truncated]");
    }
}
