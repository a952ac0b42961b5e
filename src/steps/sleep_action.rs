//! The in-process sleep action, for tests and benchmarks: it understands exactly one command,
//! `sleep <seconds>`, and waits that long on tokio's clock (so paused-time tests control it).
//! It never starts a process; any other command is refused as unsupported.

use std::time::Duration;

use futures::future::BoxFuture;

use super::action::{Action, ActionContext, ActionError, ActionOutcome};
use super::model::MAX_SLEEP_SECS;

/// Interprets `sleep <secs>` in-process with `tokio::time::sleep`; exits 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct SleepAction;

/// Parses `sleep <secs>` (seconds may be fractional, 0..=86400).
pub(crate) fn parse_sleep(command: &str) -> Result<Duration, ActionError> {
    let unsupported = || {
        ActionError::Unsupported(format!(
            "sleep action expects `sleep <seconds>`, got {command:?}"
        ))
    };
    let mut words = command.split_whitespace();
    let (Some("sleep"), Some(secs), None) = (words.next(), words.next(), words.next()) else {
        return Err(unsupported());
    };
    let secs: f64 = secs.parse().map_err(|_| unsupported())?;
    if !(0.0..=MAX_SLEEP_SECS).contains(&secs) {
        return Err(unsupported());
    }
    Duration::try_from_secs_f64(secs).map_err(|_| unsupported())
}

impl Action for SleepAction {
    fn run<'a>(
        &'a self,
        command: &'a str,
        _ctx: &'a ActionContext,
    ) -> BoxFuture<'a, Result<ActionOutcome, ActionError>> {
        Box::pin(async move {
            let d = parse_sleep(command)?;
            tokio::time::sleep(d).await;
            Ok(ActionOutcome::exited(0, ""))
        })
    }

    fn name(&self) -> &'static str {
        "sleep (in-process, for tests and benchmarks)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sleep_commands_parse() {
        assert_eq!(
            parse_sleep("sleep 0.5").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_sleep("  sleep   2 ").unwrap(), Duration::from_secs(2));
        for bad in [
            "sleep",
            "sleep -1",
            "sleep x",
            "sleep 1 2",
            "ls",
            "sleep NaN",
            "sleep 1e9",
        ] {
            assert!(
                matches!(parse_sleep(bad), Err(ActionError::Unsupported(_))),
                "{bad}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_on_tokio_time() {
        let ctx = ActionContext {
            job_id: "j".into(),
            step: 0,
            attempt: 1,
            alternative: false,
            node: "a".into(),
            worker: "a/0".into(),
        };
        let t0 = tokio::time::Instant::now();
        let out = SleepAction.run("sleep 3", &ctx).await.unwrap();
        assert!(out.succeeded());
        assert_eq!(t0.elapsed(), Duration::from_secs(3));
    }
}
