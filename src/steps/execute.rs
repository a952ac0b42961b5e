//! Running one step: its command, retried as its strategy says, then the alternative
//! command if every attempt failed. Store-independent, so retry timing is tested on paused
//! tokio time; the worker wraps it with keep-alives and the finishing transaction.

use super::action::{Action, ActionContext, truncate_output};
use super::model::StepDoc;
use super::retry::retry_delay;

/// Who runs the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// The steps job's id.
    pub job_id: String,
    /// The 0-based index of the step.
    pub step: usize,
    /// The node the worker runs on.
    pub node: String,
    /// The worker's name, `<node>/<index>`.
    pub worker: String,
}

/// What running a step produced; copied into the step's document.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepResult {
    /// Whether an attempt of the main command exited with status 0.
    pub succeeded: bool,
    /// Attempts of the main command.
    pub attempts: u32,
    /// Exit status of the last attempt of the main command, if it exited.
    pub exit_status: Option<i32>,
    /// Output of the last attempt of the main command, truncated.
    pub output: Option<String>,
    /// Set when the alternative command ran.
    pub alt_ran: bool,
    /// Exit status of the alternative command, if it ran and exited.
    pub alt_exit_status: Option<i32>,
    /// Output of the alternative command, truncated, if it ran.
    pub alt_output: Option<String>,
    /// Why the last attempt (or the alternative) produced no exit status, if so.
    pub error: Option<String>,
}

/// Runs the step's command with retries, then its alternative command if all failed.
/// Cancel-safe: dropping the future drops the running command.
pub async fn run_step(
    step: &StepDoc,
    action: &dyn Action,
    who: &RunIdentity,
    output_limit: usize,
) -> StepResult {
    let mut result = StepResult::default();
    let ctx = |attempt, alternative| ActionContext {
        job_id: who.job_id.clone(),
        step: who.step,
        attempt,
        alternative,
        node: who.node.clone(),
        worker: who.worker.clone(),
    };
    let total = step.retry.max_retries.saturating_add(1);
    for attempt in 1..=total {
        if attempt > 1 {
            tokio::time::sleep(retry_delay(&step.retry, attempt - 2)).await;
        }
        result.attempts = attempt;
        match action.run(&step.command, &ctx(attempt, false)).await {
            Ok(out) => {
                let succeeded = out.succeeded();
                result.exit_status = out.exit_status;
                result.error = out.timed_out.then(|| "timed out".to_string());
                result.output = Some(truncate_output(out.output, output_limit));
                if succeeded {
                    result.succeeded = true;
                    return result;
                }
            }
            Err(e) => {
                result.exit_status = None;
                result.output = None;
                result.error = Some(e.to_string());
                if e.is_permanent() {
                    break;
                }
            }
        }
    }
    if let Some(alt) = &step.alt_command {
        result.alt_ran = true;
        match action.run(alt, &ctx(1, true)).await {
            Ok(out) => {
                result.alt_exit_status = out.exit_status;
                result.alt_output = Some(truncate_output(out.output, output_limit));
            }
            Err(e) => {
                result.error = Some(match result.error.take() {
                    Some(first) => format!("{first}; alternative: {e}"),
                    None => format!("alternative: {e}"),
                });
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use futures::future::BoxFuture;
    use tokio::time::Instant;

    use super::*;
    use crate::steps::action::{ActionError, ActionOutcome};
    use crate::steps::model::{JobDoc, JobSpec, RetryStrategy, StepSpec};

    /// Fails the main command `fails` times (exit 7), then succeeds; the alternative exits 2.
    struct Scripted {
        fails: u32,
        log: Mutex<Vec<(Instant, bool, u32)>>,
    }

    impl Action for Scripted {
        fn run<'a>(
            &'a self,
            command: &'a str,
            ctx: &'a ActionContext,
        ) -> BoxFuture<'a, Result<ActionOutcome, ActionError>> {
            Box::pin(async move {
                self.log
                    .lock()
                    .unwrap()
                    .push((Instant::now(), ctx.alternative, ctx.attempt));
                if ctx.alternative {
                    return Ok(ActionOutcome::exited(2, format!("alt {command}")));
                }
                let code = if ctx.attempt > self.fails { 0 } else { 7 };
                Ok(ActionOutcome::exited(
                    code,
                    format!("attempt {}", ctx.attempt),
                ))
            })
        }
        fn name(&self) -> &'static str {
            "scripted"
        }
    }

    fn step(retries: u32, alt: bool) -> StepDoc {
        let mut s = StepSpec::new("any", "main").with_retry(RetryStrategy {
            max_retries: retries,
            sleep: 1.0,
            sleep_factor: 2.0,
            sleep_max: Some(3.0),
        });
        if alt {
            s = s.with_alt("fallback");
        }
        let spec = JobSpec::new(vec![s]);
        let t = spec.validate().unwrap();
        JobDoc::new("j".into(), "a".into(), 0, spec, t)
            .steps
            .remove(0)
    }

    fn who() -> RunIdentity {
        RunIdentity {
            job_id: "j".into(),
            step: 0,
            node: "a".into(),
            worker: "a/0".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_sleep_by_the_strategy_then_succeed() {
        let action = Scripted {
            fails: 3,
            log: Mutex::default(),
        };
        let t0 = Instant::now();
        let r = run_step(&step(5, true), &action, &who(), 100).await;
        assert!(r.succeeded);
        assert_eq!(r.attempts, 4);
        assert_eq!(r.exit_status, Some(0));
        assert!(!r.alt_ran);
        let offsets: Vec<_> = action
            .log
            .lock()
            .unwrap()
            .iter()
            .map(|(t, _, _)| t.duration_since(t0))
            .collect();
        // Sleeps 1, 2, then 4 capped at 3.
        let s = Duration::from_secs;
        assert_eq!(offsets, [s(0), s(1), s(3), s(6)]);
    }

    #[tokio::test(start_paused = true)]
    async fn exhausted_retries_run_the_alternative_and_keep_both_statuses() {
        let action = Scripted {
            fails: 10,
            log: Mutex::default(),
        };
        let t0 = Instant::now();
        let r = run_step(&step(2, true), &action, &who(), 100).await;
        assert!(!r.succeeded);
        assert_eq!((r.attempts, r.exit_status), (3, Some(7)));
        assert_eq!(r.output.as_deref(), Some("attempt 3"));
        assert!(r.alt_ran);
        assert_eq!(r.alt_exit_status, Some(2));
        assert_eq!(r.alt_output.as_deref(), Some("alt fallback"));
        // The alternative runs right after the last failed attempt (1 + 2 s of sleeps).
        let last = action.log.lock().unwrap().last().copied().unwrap();
        assert_eq!(
            (last.0.duration_since(t0), last.1),
            (Duration::from_secs(3), true)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_disabled_action_is_not_retried() {
        let t0 = Instant::now();
        let r = run_step(
            &step(5, false),
            &crate::steps::action::DisabledAction,
            &who(),
            100,
        )
        .await;
        assert!(!r.succeeded);
        assert_eq!(r.attempts, 1);
        assert_eq!(r.error.as_deref(), Some("command execution is disabled"));
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }
}
