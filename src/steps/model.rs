//! The steps job document (the thesis' Figure 10 in our own terms) and the job
//! specification a caller submits, with validation.
//!
//! A job is an ordered list of steps; each names a [`Target`] (a node, or `any`), a command,
//! an optional alternative command and a [`RetryStrategy`]. The stored [`JobDoc`] adds what
//! the thesis kept in the same document: creator, current step index, per-step status,
//! executor, times, attempts, exit statuses and truncated output, and the job status
//! (`null` while running, `success`, `failed`). Unlike the thesis there are no claim/winner
//! fields: couch_jobs' `accept` is the claim.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::SpecError;

/// The target that any node may run.
pub(crate) const ANY: &str = "any";
/// Longest node name accepted.
pub(crate) const MAX_NODE_NAME: usize = 64;
/// Most steps in one job.
pub(crate) const MAX_STEPS: usize = 1000;
/// Longest command accepted (bytes).
pub(crate) const MAX_COMMAND_LEN: usize = 64 * 1024;
/// Most retries of one step.
pub(crate) const MAX_RETRIES: u32 = 1000;
/// Longest retry sleep accepted (seconds): one day.
pub(crate) const MAX_SLEEP_SECS: f64 = 86_400.0;

/// Checks a node name: 1-64 ASCII letters, digits, `-`, `_`, `.`; never `any` (any case).
pub(crate) fn validate_node_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if name.len() > MAX_NODE_NAME {
        return Err("longer than 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("only ASCII letters, digits, '-', '_' and '.' are allowed");
    }
    if name.eq_ignore_ascii_case(ANY) {
        return Err("\"any\" is reserved for steps any node may run");
    }
    Ok(())
}

/// Where a step may run: one named node, or any node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Any node's workers may run the step (the shared `any` queue).
    Any,
    /// Only workers on the node with this name may run the step.
    Node(String),
}

impl Target {
    /// Parses `any` or a valid node name.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        if s == ANY {
            return Ok(Target::Any);
        }
        validate_node_name(s)?;
        Ok(Target::Node(s.to_string()))
    }

    /// `"any"` or the node name, as stored and shown in the API.
    pub fn as_str(&self) -> &str {
        match self {
            Target::Any => ANY,
            Target::Node(n) => n,
        }
    }

    /// Whether a worker on `node` may run a step for this target.
    #[cfg(any(test, feature = "internals"))]
    pub fn admits(&self, node: &str) -> bool {
        match self {
            Target::Any => true,
            Target::Node(n) => n == node,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Target::parse(&s).map_err(|reason| serde::de::Error::custom(format!("{s:?}: {reason}")))
    }
}

/// How a failing command is retried: up to `max_retries` more attempts, sleeping `sleep`
/// seconds before the first retry and multiplying by `sleep_factor` each time, never more
/// than `sleep_max` (see [`super::retry`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryStrategy {
    /// Attempts after the first one that failed (0 = run once, at most 1000).
    pub max_retries: u32,
    /// Seconds before the first retry.
    pub sleep: f64,
    /// Growth of the sleep per retry (>= 1).
    pub sleep_factor: f64,
    /// Cap of one sleep, seconds (`None` = no cap).
    pub sleep_max: Option<f64>,
}

impl Default for RetryStrategy {
    fn default() -> Self {
        Self {
            max_retries: 0,
            sleep: 0.0,
            sleep_factor: 1.0,
            sleep_max: None,
        }
    }
}

impl RetryStrategy {
    fn validate(&self, step: usize) -> Result<(), SpecError> {
        let bad = |field, reason| SpecError::BadRetry {
            step,
            field,
            reason,
        };
        if self.max_retries > MAX_RETRIES {
            return Err(bad("max_retries", "must be at most 1000"));
        }
        let secs = |field, v: f64| {
            if !v.is_finite() {
                Err(bad(field, "must be a finite number"))
            } else if v < 0.0 {
                Err(bad(field, "must not be negative"))
            } else if v > MAX_SLEEP_SECS {
                Err(bad(field, "must be at most 86400 seconds"))
            } else {
                Ok(())
            }
        };
        secs("sleep", self.sleep)?;
        if let Some(max) = self.sleep_max {
            secs("sleep_max", max)?;
        }
        if !self.sleep_factor.is_finite() || self.sleep_factor < 1.0 {
            return Err(bad("sleep_factor", "must be a finite number >= 1"));
        }
        Ok(())
    }
}

/// One step as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// A node name or `any`.
    pub target: String,
    /// The command the step's action runs (not blank, at most 64 KiB).
    pub command: String,
    /// Run once after every attempt of `command` failed (the step still fails).
    #[serde(default)]
    pub alt_command: Option<String>,
    /// How failed attempts of `command` are retried (default: no retry).
    #[serde(default)]
    pub retry: RetryStrategy,
}

// Builders for the crate's tests; the API reads steps from JSON.
#[cfg(any(test, feature = "internals"))]
impl StepSpec {
    /// A step with no retries and no alternative command.
    pub fn new(target: impl Into<String>, command: impl Into<String>) -> Self {
        Self {
            target: target.into(),
            command: command.into(),
            alt_command: None,
            retry: RetryStrategy::default(),
        }
    }

    /// Sets the alternative command run after every attempt failed.
    pub fn with_alt(mut self, alt: impl Into<String>) -> Self {
        self.alt_command = Some(alt.into());
        self
    }

    /// Sets how failed attempts are retried.
    pub fn with_retry(mut self, retry: RetryStrategy) -> Self {
        self.retry = retry;
        self
    }
}

/// A job as submitted: its steps in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The steps, run one after the other (1 to 1000 of them).
    pub steps: Vec<StepSpec>,
}

impl JobSpec {
    /// A job of these steps; [`JobSpec::validate`] checks it.
    #[cfg(any(test, feature = "internals"))]
    pub fn new(steps: Vec<StepSpec>) -> Self {
        Self { steps }
    }

    /// Checks every rule and returns the parsed step targets.
    pub fn validate(&self) -> Result<Vec<Target>, SpecError> {
        if self.steps.is_empty() {
            return Err(SpecError::NoSteps);
        }
        if self.steps.len() > MAX_STEPS {
            return Err(SpecError::TooManySteps {
                max: MAX_STEPS,
                got: self.steps.len(),
            });
        }
        let mut targets = Vec::with_capacity(self.steps.len());
        for (i, step) in self.steps.iter().enumerate() {
            let target = Target::parse(&step.target).map_err(|reason| SpecError::BadTarget {
                step: i,
                target: step.target.clone(),
                reason,
            })?;
            if step.command.trim().is_empty() {
                return Err(SpecError::EmptyCommand { step: i });
            }
            let too_long = |c: &str| c.len() > MAX_COMMAND_LEN;
            if too_long(&step.command) || step.alt_command.as_deref().is_some_and(too_long) {
                return Err(SpecError::CommandTooLong {
                    step: i,
                    max: MAX_COMMAND_LEN,
                });
            }
            if step
                .alt_command
                .as_deref()
                .is_some_and(|c| c.trim().is_empty())
            {
                return Err(SpecError::EmptyAltCommand { step: i });
            }
            step.retry.validate(i)?;
            targets.push(target);
        }
        Ok(targets)
    }
}

/// The thesis' `job_status`: `null` while the job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobOutcome {
    /// Every step succeeded.
    Success,
    /// A step failed; the steps after it were skipped.
    Failed,
}

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// An earlier step has not finished yet.
    Waiting,
    /// In its target's queue, waiting for a worker.
    Pending,
    /// A worker accepted it.
    Running,
    /// Its command exited with status 0 (possibly after retries).
    Succeeded,
    /// Every attempt failed (the alternative command, if any, ran).
    Failed,
    /// Never ran because an earlier step failed.
    Skipped,
}

/// Which worker ran (or runs) a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Executor {
    /// The node the worker runs on.
    pub node: String,
    /// The worker's name, `<node>/<index>`.
    pub worker: String,
}

/// One step of a stored job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepDoc {
    /// Where the step may run.
    pub target: Target,
    /// The step's command.
    pub command: String,
    /// The command run after every attempt of `command` failed, if any.
    pub alt_command: Option<String>,
    /// How failed attempts are retried.
    pub retry: RetryStrategy,
    /// Where the step stands.
    pub status: StepStatus,
    /// The worker that last accepted the step.
    pub executor: Option<Executor>,
    /// UNIX milliseconds of the (latest) start.
    pub started_at: Option<i64>,
    /// UNIX milliseconds when the step ended.
    pub finished_at: Option<i64>,
    /// Attempts of the command in the run that finished (1 + retries used).
    pub attempts: u32,
    /// How many times the step was dispatched: counted when a worker accepts it (in the
    /// same write that marks it running), so a worker that dies after accepting but before
    /// its command starts still counts. More than 1 only after a worker died or stalled;
    /// the command itself ran at most `runs` times.
    pub runs: u32,
    /// Exit status of the last attempt (`None`: killed, timed out, or not run).
    pub exit_status: Option<i32>,
    /// Exit status of the alternative command, if it ran and exited.
    pub alt_exit_status: Option<i32>,
    /// Output of the last attempt, truncated.
    pub output: Option<String>,
    /// Output of the alternative command, truncated, if it ran.
    pub alt_output: Option<String>,
    /// Why the last attempt could not produce an exit status, if so.
    pub error: Option<String>,
}

/// A stored steps job: the one source of truth about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDoc {
    /// The job's id (also its couch_jobs job id).
    pub id: String,
    /// The node whose API created it.
    pub creator: String,
    /// UNIX milliseconds.
    pub created_at: i64,
    /// Index of the step to run next (or running); equals the step count when done.
    pub current_step: usize,
    /// The steps with their progress.
    pub steps: Vec<StepDoc>,
    /// `None` while the job runs.
    pub status: Option<JobOutcome>,
    /// UNIX milliseconds when the job ended.
    pub finished_at: Option<i64>,
}

impl JobDoc {
    /// A new job from a validated spec: step 0 pending, the rest waiting.
    pub fn new(
        id: String,
        creator: String,
        created_at: i64,
        spec: JobSpec,
        targets: Vec<Target>,
    ) -> Self {
        let steps = spec
            .steps
            .into_iter()
            .zip(targets)
            .enumerate()
            .map(|(i, (s, target))| StepDoc {
                target,
                command: s.command,
                alt_command: s.alt_command,
                retry: s.retry,
                status: if i == 0 {
                    StepStatus::Pending
                } else {
                    StepStatus::Waiting
                },
                executor: None,
                started_at: None,
                finished_at: None,
                attempts: 0,
                runs: 0,
                exit_status: None,
                alt_exit_status: None,
                output: None,
                alt_output: None,
                error: None,
            })
            .collect();
        Self {
            id,
            creator,
            created_at,
            current_step: 0,
            steps,
            status: None,
            finished_at: None,
        }
    }

    /// The step to run next, if the job is not done.
    pub fn current(&self) -> Option<&StepDoc> {
        if self.status.is_some() {
            return None;
        }
        self.steps.get(self.current_step)
    }

    /// The document as stored: JSON.
    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings, numbers and options always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses a stored document; [`SpecError::Malformed`] for bad JSON or an out-of-range step
    /// index.
    pub fn decode(bytes: &[u8]) -> Result<Self, SpecError> {
        let doc: JobDoc =
            serde_json::from_slice(bytes).map_err(|e| SpecError::Malformed(e.to_string()))?;
        if doc.steps.is_empty() || doc.current_step > doc.steps.len() {
            return Err(SpecError::Malformed("step index out of range".into()));
        }
        Ok(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(target: &str) -> JobSpec {
        JobSpec::new(vec![StepSpec::new(target, "sleep 1")])
    }

    #[test]
    fn targets_parse_and_reject_bad_names() {
        assert_eq!(Target::parse("any"), Ok(Target::Any));
        assert_eq!(
            Target::parse("node-a.1"),
            Ok(Target::Node("node-a.1".into()))
        );
        for bad in ["", "ANY", "a b", "a/b", "ä", &"x".repeat(65)] {
            assert!(Target::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(
            spec("a:b").validate(),
            Err(SpecError::BadTarget { step: 0, .. })
        ));
        assert!(Target::Node("a".into()).admits("a"));
        assert!(!Target::Node("a".into()).admits("b"));
        assert!(Target::Any.admits("b"));
    }

    #[test]
    fn validation_names_the_problem() {
        assert_eq!(JobSpec::new(vec![]).validate(), Err(SpecError::NoSteps));
        let mut s = spec("a");
        s.steps[0].command = "  ".into();
        assert_eq!(s.validate(), Err(SpecError::EmptyCommand { step: 0 }));
        let mut s = spec("a");
        s.steps.push(StepSpec::new("b", "x").with_alt(""));
        assert_eq!(s.validate(), Err(SpecError::EmptyAltCommand { step: 1 }));
        let mut s = spec("a");
        s.steps[0].retry.sleep = -1.0;
        assert_eq!(
            s.validate(),
            Err(SpecError::BadRetry {
                step: 0,
                field: "sleep",
                reason: "must not be negative"
            })
        );
        let mut s = spec("a");
        s.steps[0].retry.sleep_max = Some(f64::NAN);
        assert!(matches!(
            s.validate(),
            Err(SpecError::BadRetry {
                field: "sleep_max",
                ..
            })
        ));
        let mut s = spec("a");
        s.steps[0].retry.sleep_factor = 0.5;
        assert!(matches!(
            s.validate(),
            Err(SpecError::BadRetry {
                field: "sleep_factor",
                ..
            })
        ));
        let s = JobSpec::new(vec![StepSpec::new("a", "x"); MAX_STEPS + 1]);
        assert!(matches!(s.validate(), Err(SpecError::TooManySteps { .. })));
        let s = JobSpec::new(vec![StepSpec::new("a", "x".repeat(MAX_COMMAND_LEN + 1))]);
        assert!(matches!(
            s.validate(),
            Err(SpecError::CommandTooLong { step: 0, .. })
        ));
    }

    #[test]
    fn spec_json_rejects_unknown_fields_and_bad_types() {
        let ok: JobSpec = serde_json::from_str(
            r#"{"steps":[{"target":"any","command":"sleep 1",
                "retry":{"max_retries":2,"sleep":1,"sleep_factor":2,"sleep_max":3}}]}"#,
        )
        .unwrap();
        assert_eq!(ok.steps[0].retry.max_retries, 2);
        assert!(
            serde_json::from_str::<JobSpec>(r#"{"steps":[{"target":"a","cmd":"x"}]}"#).is_err()
        );
        assert!(
            serde_json::from_str::<JobSpec>(
                r#"{"steps":[{"target":"a","command":"x","retry":{"max_retries":-1}}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn docs_round_trip_and_start_with_step_zero_pending() {
        let s = JobSpec::new(vec![StepSpec::new("a", "x"), StepSpec::new("any", "y")]);
        let targets = s.validate().unwrap();
        let doc = JobDoc::new("id1".into(), "a".into(), 5, s, targets);
        assert_eq!(doc.steps[0].status, StepStatus::Pending);
        assert_eq!(doc.steps[1].status, StepStatus::Waiting);
        assert_eq!(
            doc.current().map(|s| &s.target),
            Some(&Target::Node("a".into()))
        );
        let back = JobDoc::decode(&doc.encode()).unwrap();
        assert_eq!(back, doc);
        let json: serde_json::Value = serde_json::from_slice(&doc.encode()).unwrap();
        assert_eq!(json["status"], serde_json::Value::Null);
        assert_eq!(json["steps"][1]["target"], "any");
        assert!(JobDoc::decode(b"{}").is_err());
        assert!(JobDoc::decode(b"\xff").is_err());
    }
}
