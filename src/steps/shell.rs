//! The shell action: runs a step's command with `/bin/sh -c`, only when the host chooses it.
//!
//! Each command runs in its own process group with a cleared environment (only the named
//! variables are passed on), stdin closed, stdout and stderr captured up to a byte limit
//! (the rest is read and discarded so the command never blocks on a full pipe). When the
//! timeout expires, or when the worker drops the run (lost step lock, node shutdown), the
//! whole process group is killed, so background children of the command die too.

use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::action::{Action, ActionContext, ActionError, ActionOutcome};

/// Runs commands through `/bin/sh -c`. Never the default: the host must construct it.
#[derive(Debug, Clone)]
pub struct ShellAction {
    /// Kill the command (and its process group) after this long.
    pub timeout: Duration,
    /// Environment variables passed through from the host's environment; all others are
    /// cleared.
    pub keep_env: Vec<String>,
    /// Bytes of stdout and of stderr kept.
    pub output_limit: usize,
}

impl ShellAction {
    /// Runs commands with `timeout`, passing only `PATH` through and keeping 4096 bytes of
    /// output.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            keep_env: vec!["PATH".into()],
            output_limit: 4096,
        }
    }

    async fn run_shell(&self, command: &str) -> Result<ActionOutcome, ActionError> {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(command)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        for name in &self.keep_env {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| ActionError::Failed(format!("spawn /bin/sh: {e}")))?;
        let _group = child.id().map(GroupKiller);
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let limit = self.output_limit;
        let work = async {
            let (out, err, status) = tokio::join!(
                read_limited(stdout, limit),
                read_limited(stderr, limit),
                child.wait()
            );
            (out, err, status)
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok((out, err, status)) => {
                let status = status.map_err(|e| ActionError::Failed(format!("wait: {e}")))?;
                let mut output = String::from_utf8_lossy(&out).into_owned();
                if !err.is_empty() {
                    output.push_str("\n[stderr]\n");
                    output.push_str(&String::from_utf8_lossy(&err));
                }
                Ok(ActionOutcome {
                    exit_status: exit_code(&status),
                    output,
                    timed_out: false,
                })
            }
            // `_group` kills the process group when this function returns.
            Err(_) => Ok(ActionOutcome {
                exit_status: None,
                output: format!("killed after the {:?} timeout", self.timeout),
                timed_out: true,
            }),
        }
    }
}

/// Kills a process group (the command and everything it started) when dropped.
struct GroupKiller(u32);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.0) {
            // SAFETY: kill(2) with a negative pid signals a process group; it has no memory
            // effects. The group id is the pid of the child we spawned as group leader.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

fn exit_code(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s))
}

/// Reads a pipe to its end, keeping at most `limit` bytes.
async fn read_limited<R: AsyncRead + Unpin>(pipe: Option<R>, limit: usize) -> Vec<u8> {
    let Some(mut pipe) = pipe else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

impl Action for ShellAction {
    fn run<'a>(
        &'a self,
        command: &'a str,
        _ctx: &'a ActionContext,
    ) -> BoxFuture<'a, Result<ActionOutcome, ActionError>> {
        Box::pin(self.run_shell(command))
    }

    fn name(&self) -> &'static str {
        "shell (/bin/sh -c)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ActionContext {
        ActionContext {
            job_id: "j".into(),
            step: 0,
            attempt: 1,
            alternative: false,
            node: "a".into(),
            worker: "a/0".into(),
        }
    }

    #[tokio::test]
    async fn captures_exit_status_and_output() {
        let a = ShellAction::new(Duration::from_secs(10));
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            a.run("echo hi; echo oops >&2; exit 3", &ctx()),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(out.exit_status, Some(3));
        assert_eq!(out.output, "hi\n\n[stderr]\noops\n");
        assert!(!out.succeeded());
    }

    #[tokio::test]
    async fn environment_is_cleared_except_named_variables() {
        // SAFETY: test-only; no other thread of this test reads these variables.
        unsafe {
            std::env::set_var("STEPS_TEST_KEEP", "kept");
            std::env::set_var("STEPS_TEST_SECRET", "leaked");
        }
        let a = ShellAction {
            keep_env: vec!["STEPS_TEST_KEEP".into()],
            ..ShellAction::new(Duration::from_secs(10))
        };
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            a.run(
                "echo \"$STEPS_TEST_KEEP-${STEPS_TEST_SECRET:-none}\"",
                &ctx(),
            ),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(out.output, "kept-none\n");
    }

    #[tokio::test]
    async fn output_is_limited_and_timeout_kills_the_group() {
        let a = ShellAction {
            output_limit: 10,
            ..ShellAction::new(Duration::from_millis(300))
        };
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            a.run("yes | head -c 100000; exit 0", &ctx()),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(out.output.len(), 10);
        assert!(out.succeeded());
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("late");
        // The background child would create the marker after 1 s unless the group is killed.
        let cmd = format!("(sleep 1; touch {}) & sleep 30", marker.display());
        let t0 = std::time::Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(10), a.run(&cmd, &ctx()))
            .await
            .unwrap()
            .unwrap();
        assert!(out.timed_out);
        assert_eq!(out.exit_status, None);
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !marker.exists(),
            "a child of the timed-out command survived"
        );
    }
}
