//! The chaos test's expectations: what add/resubmit/finish do to a job by the state diagram,
//! and how an acknowledged or timed-out step must have left it.

use std::collections::BTreeSet;

use couch_replicator::jobs::{JobState, JobsError};
use couch_replicator::store::StoreError;

use super::{Jobs, Seen};

/// A step's result: `Ok` with a note, or the error the caller saw.
pub type Outcome = Result<String, JobsError>;

/// The transaction ran out of time: it may or may not have been applied.
pub fn timed_out(e: &JobsError) -> bool {
    matches!(e, JobsError::Store(StoreError::TimedOut))
}

/// The effect of add/resubmit at `stime` on a job (`None` before = a new job).
pub fn resubmitted(b: Option<&Seen>, stime: i64) -> Seen {
    match b {
        Some(b) if b.state == JobState::Running => Seen {
            resubmit: true,
            stime,
            ..b.clone()
        },
        Some(b) if b.state == JobState::Pending && b.stime == stime => b.clone(),
        _ => Seen::pending(stime),
    }
}

pub fn finished(b: &Seen) -> Seen {
    if b.resubmit {
        return Seen::pending(b.stime);
    }
    Seen {
        state: JobState::Finished,
        jlock: None,
        stime: b.stime,
        resubmit: false,
        vs: None,
    }
}

pub fn only(touched: &BTreeSet<String>, ids: &[&str]) -> Result<(), String> {
    match touched.iter().find(|id| !ids.contains(&id.as_str())) {
        Some(id) => Err(format!("{id} changed although the step did not touch it")),
        None => Ok(()),
    }
}

/// `after` is `expected` when acknowledged, `before` or `expected` when timed out.
pub fn settles(
    id: &str,
    outcome: &Outcome,
    before: &Jobs,
    after: &Jobs,
    expected: Option<Seen>,
    renews_vs: bool,
) -> Result<(), String> {
    let got = after.get(id);
    let is_expected = match (got, &expected) {
        (Some(g), Some(e)) if renews_vs => {
            g.same_but_vs(e) && g.vs != before.get(id).and_then(|b| b.vs.clone())
        }
        (g, e) => g == e.as_ref(),
    };
    match outcome {
        Ok(_) if is_expected => Ok(()),
        Err(e) if timed_out(e) && (is_expected || got == before.get(id)) => Ok(()),
        _ => Err(format!("{id}: expected {expected:?}, found {got:?}")),
    }
}
