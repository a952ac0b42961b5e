//! Model-based chaos test of couch_jobs under every store fault kind.
//!
//! Each history is a seeded random sequence of add / resubmit / remove / accept / update /
//! finish by several workers, worker deaths, activity-monitor checks and clock ticks, run
//! through the fault-injecting wrapper (spurious conflicts, `commit_unknown_result` after a
//! commit that did or did not land, `transaction_too_old`, delays, hung commits that end in
//! the run's timeout) over the serial memory engine, in paused tokio time. After every step
//! the rows are read straight from the engine and checked:
//!
//! - the indexes match the rows (no stale pending or activity key, none missing);
//! - only the jobs the step may touch changed, and each change is the state diagram's
//!   (so no job is lost, resurrected or changed behind the model's back, and an
//!   acknowledged `finish` stays durable);
//! - acknowledged results are true: an `Ok` update/finish came from the current lock
//!   holder (never two valid holders, never a job finished twice), a `Halt` only from a
//!   stale one, `NotFound` only when nothing matched, one accept locks at most one job;
//! - a timed-out step (outcome unknown) left either the old or the new state;
//! - the activity monitor re-enqueues exactly the jobs without activity since the check
//!   `n` checks ago;
//! - at the end, with all workers dead, every job is re-enqueued and can be finished.
//!
//! `cargo nextest run --test jobs_chaos --no-capture` prints
//! `chaos: N histories, V violations, seed S`. `CHAOS_HISTORIES=N` runs more (default
//! 10,000), `CHAOS_BASE_SEED=S` starts from another seed (history `i` has seed `S + i`),
//! `CHAOS_SEED=S` replays one history exactly, printing every step.

mod chaos_support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use chaos_support::model::{Outcome, finished, only, resubmitted, settles, timed_out};
use chaos_support::{Jobs as Seen_, Seen, changed, observe};
use couch_replicator::jobs::activity_monitor::ActivityMonitor;
use couch_replicator::jobs::{
    AcceptOpts, Clock, Job, JobState, Jobs, JobsConfig, JobsError, JobsOptions, ManualClock,
};
use couch_replicator::store::faulty::{FaultRates, FaultyStore};
use couch_replicator::store::memory::MemoryStore;
use couch_replicator::store::{Db, RetryPolicy, StoreError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TY: &str = "chaos";
const IDS: [&str; 4] = ["a", "b", "c", "d"];
const WORKERS: usize = 3;
const STEPS: usize = 24;
const DEFAULT_HISTORIES: u64 = 10_000;
const BASE_SEED: u64 = 0xC0C0_0015;

fn rates() -> FaultRates {
    FaultRates {
        conflict: 0.05,
        unknown_applied: 0.05,
        unknown_not_applied: 0.05,
        hang: 0.01,
        delay: 0.05,
        too_old: 0.03,
        watch_late: 0.05,
        watch_spurious: 0.05,
        max_delay: Duration::from_millis(300),
    }
}

#[derive(Debug, Clone)]
enum Step {
    Add(usize, i64),
    Resubmit(usize),
    Remove(usize),
    Accept(usize),
    Update(usize),
    Finish(usize),
    Kill(usize),
    Monitor,
    Tick,
}

/// One history's world: the faulty jobs handle, the raw engine and what the model knows.
struct World {
    raw: MemoryStore,
    faulty: FaultyStore,
    jobs: Jobs,
    clock: Arc<ManualClock>,
    monitor: ActivityMonitor,
    checks: usize,
    /// Worker i's job, if it holds one.
    held: [Option<Job>; WORKERS],
    /// Step index of the successful monitor checks still in its window.
    marks: VecDeque<usize>,
    /// Per job: the step of its last activity (accept/update) and whether it is known to
    /// have landed (a timed-out one may or may not have).
    activity: std::collections::HashMap<String, (usize, bool)>,
    trace: Option<Vec<String>>,
}

impl World {
    async fn new(seed: u64) -> World {
        let raw = MemoryStore::new();
        let faulty = FaultyStore::new(Arc::new(raw.clone()), rates(), seed);
        faulty.set_enabled(false);
        let db = Db::new(Arc::new(faulty.clone())).with_retry(RetryPolicy {
            initial_delay: Duration::ZERO,
            ..RetryPolicy::default()
        });
        let clock = Arc::new(ManualClock::new(1_000_000));
        let config = JobsConfig::default();
        let jobs = Jobs::new(
            db.clone(),
            JobsOptions {
                clock: clock.clone(),
                config: config.clone(),
                rng_seed: Some(seed),
                ..JobsOptions::default()
            },
        );
        jobs.set_type_timeout(TY, 30).await.expect("type timeout");
        faulty.set_enabled(true);
        let monitor = ActivityMonitor::new(db, jobs.keys().clone(), TY, &config);
        World {
            raw,
            faulty,
            jobs,
            clock,
            monitor,
            checks: config.activity_monitor_checks_per_timeout.max(1) as usize,
            held: Default::default(),
            marks: VecDeque::new(),
            activity: Default::default(),
            trace: None,
        }
    }

    fn now(&self) -> i64 {
        self.clock.now_ms() / 1000
    }

    fn observe(&self) -> Result<Seen_, String> {
        observe(&self.raw, self.jobs.keys(), TY)
    }

    fn pick(&self, rng: &mut StdRng) -> Step {
        let holders: Vec<usize> = (0..WORKERS).filter(|w| self.held[*w].is_some()).collect();
        let idle: Vec<usize> = (0..WORKERS).filter(|w| self.held[*w].is_none()).collect();
        let id = rng.random_range(0..IDS.len());
        match rng.random_range(0..100) {
            0..20 => Step::Add(id, rng.random_range(-1..=2)),
            20..28 => Step::Resubmit(id),
            28..34 => Step::Remove(id),
            34..40 => Step::Kill(rng.random_range(0..WORKERS)),
            40..52 => Step::Monitor,
            52..55 => Step::Tick,
            n if !holders.is_empty() && n < 75 => Step::Update(holders[n % holders.len()]),
            n if !holders.is_empty() && n < 90 => Step::Finish(holders[n % holders.len()]),
            n if !idle.is_empty() => Step::Accept(idle[n % idle.len()]),
            _ => Step::Monitor,
        }
    }

    async fn run(&mut self, t: usize, step: &Step) -> (Result<(), String>, Outcome) {
        let before = match self.observe() {
            Ok(b) => b,
            Err(e) => return (Err(e), Ok(String::new())),
        };
        let ctx = Ctx {
            t,
            now: self.now(),
            held: self.held.clone(),
            marks: self.marks.clone(),
        };
        let outcome = self.exec(t, step).await;
        if let Some(trace) = &mut self.trace {
            trace.push(format!("{t}: {step:?} -> {outcome:?}"));
        }
        let checked = self
            .observe()
            .and_then(|after| self.check(&ctx, step, &outcome, &before, &after))
            .map_err(|e| format!("step {t} {step:?} -> {outcome:?}: {e}"));
        (checked, outcome)
    }

    async fn exec(&mut self, t: usize, step: &Step) -> Outcome {
        let jobs = self.jobs.clone();
        match *step {
            Step::Add(i, dt) => {
                let stime = self.now() + dt;
                jobs.add(TY, IDS[i], Default::default(), stime).await?;
                Ok(format!("added at {stime}"))
            }
            Step::Resubmit(i) => jobs
                .resubmit(TY, IDS[i], None, None)
                .await
                .map(|_| "ok".into()),
            Step::Remove(i) => jobs.remove(TY, IDS[i]).await.map(|_| "ok".into()),
            Step::Accept(w) => {
                let opts = AcceptOpts::default()
                    .timeout(Duration::ZERO)
                    .max_sched_time(self.now());
                let (job, _) = jobs.accept(TY, opts).await?;
                let id = job.id.clone();
                self.held[w] = Some(job);
                Ok(id)
            }
            Step::Update(w) | Step::Finish(w) => {
                let Some(job) = self.held[w].clone() else {
                    return Ok("idle".into());
                };
                let result = if matches!(step, Step::Update(_)) {
                    jobs.update(&job, None).await.map(|_| ())
                } else {
                    jobs.finish(&job, None).await
                };
                let keep = matches!(step, Step::Update(_))
                    && matches!(
                        &result,
                        Ok(()) | Err(JobsError::Store(StoreError::TimedOut))
                    );
                if !keep {
                    self.held[w] = None;
                }
                result.map(|_| job.id)
            }
            Step::Kill(w) => {
                self.held[w] = None;
                Ok("killed".into())
            }
            Step::Monitor => {
                let n = self.monitor.check_once().await?;
                self.marks.push_back(t);
                while self.marks.len() > self.checks {
                    self.marks.pop_front();
                }
                Ok(n.to_string())
            }
            Step::Tick => {
                self.clock.advance_ms(1000);
                Ok("tick".into())
            }
        }
    }
}

/// What the model knew just before a step.
struct Ctx {
    t: usize,
    now: i64,
    held: [Option<Job>; WORKERS],
    marks: VecDeque<usize>,
}

impl World {
    fn check(
        &mut self,
        ctx: &Ctx,
        step: &Step,
        outcome: &Outcome,
        before: &Seen_,
        after: &Seen_,
    ) -> Result<(), String> {
        let touched = changed(before, after);
        if let Err(e) = outcome
            && !timed_out(e)
            && !matches!(e, JobsError::NotFound | JobsError::Halt)
        {
            return Err(format!("unexpected error {e}"));
        }
        match *step {
            Step::Add(i, dt) => {
                only(&touched, &[IDS[i]])?;
                let expected = resubmitted(before.get(IDS[i]), ctx.now + dt);
                settles(IDS[i], outcome, before, after, Some(expected), false)
            }
            Step::Resubmit(i) | Step::Remove(i) => {
                let id = IDS[i];
                only(&touched, &[id])?;
                let b = before.get(id);
                if matches!(outcome, Err(JobsError::NotFound)) || b.is_none() {
                    return match (b, outcome) {
                        (None, Err(JobsError::NotFound)) => Ok(()),
                        _ => Err(format!("{id}: NotFound iff missing, was {b:?}")),
                    };
                }
                let expected = match (step, b) {
                    (Step::Resubmit(_), Some(b)) => Some(resubmitted(Some(b), b.stime)),
                    _ => None,
                };
                settles(id, outcome, before, after, expected, false)
            }
            Step::Accept(w) => self.check_accept(ctx, w, outcome, before, after, &touched),
            Step::Update(w) | Step::Finish(w) => {
                let Some(job) = &ctx.held[w] else {
                    return only(&touched, &[]);
                };
                let id = job.id.as_str();
                only(&touched, &[id])?;
                let b = before.get(id);
                let current = b.is_some_and(|b| b.jlock.as_deref() == Some(job.jlock.as_str()));
                match outcome {
                    Err(JobsError::Halt) if !current => return Ok(()),
                    Err(JobsError::Halt) => return Err(format!("{id}: Halt for the lock holder")),
                    _ if !current => {
                        return Err(format!("{id}: a stale lock was accepted ({outcome:?})"));
                    }
                    _ => {}
                }
                let b = b.cloned().unwrap_or_else(|| Seen::pending(0));
                if matches!(step, Step::Update(_)) {
                    let known = outcome.is_ok();
                    self.activity.insert(id.to_string(), (ctx.t, known));
                    settles(id, outcome, before, after, Some(b), true)
                } else {
                    settles(id, outcome, before, after, Some(finished(&b)), false)
                }
            }
            Step::Kill(_) | Step::Tick => only(&touched, &[]),
            Step::Monitor => self.check_monitor(ctx, outcome, before, after, &touched),
        }
    }

    fn check_accept(
        &mut self,
        ctx: &Ctx,
        w: usize,
        outcome: &Outcome,
        before: &Seen_,
        after: &Seen_,
        touched: &std::collections::BTreeSet<String>,
    ) -> Result<(), String> {
        let eligible = |id: &str| {
            before
                .get(id)
                .is_some_and(|b| b.state == JobState::Pending && b.stime <= ctx.now)
        };
        if touched.len() > 1 {
            return Err(format!("one accept changed {touched:?}"));
        }
        match outcome {
            Err(JobsError::NotFound) => match before.keys().find(|id| eligible(id)) {
                Some(id) => Err(format!("NotFound although {id} was eligible")),
                None => only(touched, &[]),
            },
            Err(JobsError::Halt) => Err("accept cannot halt".into()),
            Ok(_) | Err(_) => {
                let id = match (outcome, touched.first()) {
                    (Ok(id), _) => id.as_str(),
                    (Err(_), Some(t)) => t.as_str(),
                    (Err(_), None) => return Ok(()),
                };
                let jlock = match outcome {
                    Ok(_) => self.held[w].as_ref().map(|j| j.jlock.clone()),
                    Err(_) => after.get(id).and_then(|a| a.jlock.clone()),
                };
                let b = before.get(id);
                let a = after.get(id);
                let ok = eligible(id)
                    && a.is_some_and(|a| {
                        a.state == JobState::Running
                            && a.jlock == jlock
                            && a.stime == b.map_or(-1, |b| b.stime)
                            && !a.resubmit
                    });
                self.activity
                    .insert(id.to_string(), (ctx.t, outcome.is_ok()));
                if ok {
                    Ok(())
                } else {
                    Err(format!("accept of {id}: {b:?} -> {a:?}"))
                }
            }
        }
    }

    fn check_monitor(
        &self,
        ctx: &Ctx,
        outcome: &Outcome,
        before: &Seen_,
        after: &Seen_,
        touched: &std::collections::BTreeSet<String>,
    ) -> Result<(), String> {
        let front = (ctx.marks.len() >= self.checks).then(|| ctx.marks[0]);
        for id in touched {
            let b = before.get(id).filter(|b| b.state == JobState::Running);
            let expected = b.map(|b| Seen::pending(b.stime));
            if b.is_none() || after.get(id) != expected.as_ref() {
                return Err(format!(
                    "monitor changed {id}: {b:?} -> {:?}",
                    after.get(id)
                ));
            }
            match (front, self.activity.get(id)) {
                (None, _) => return Err(format!("monitor re-enqueued {id} before its window")),
                (Some(m), Some((s, true))) if *s > m => {
                    return Err(format!(
                        "monitor re-enqueued {id}, active at step {s} > {m}"
                    ));
                }
                _ => {}
            }
        }
        let (Ok(n), Some(m)) = (outcome, front) else {
            return Ok(());
        };
        // A batch that timed out is retried smaller (as CouchDB's monitor does after 1031);
        // if it had landed, its jobs are re-enqueued but not counted: never more, though.
        if n.parse::<usize>().map_or(true, |n| n > touched.len()) {
            return Err(format!("monitor said {n}, changed {touched:?}"));
        }
        for (id, b) in before {
            let idle = self.activity.get(id).is_some_and(|(s, _)| *s < m);
            if b.state == JobState::Running && idle && !touched.contains(id) {
                return Err(format!(
                    "monitor left {id} running, idle since before step {m}"
                ));
            }
        }
        Ok(())
    }

    /// All workers die; the monitor must re-enqueue every running job and every job must
    /// then be acceptable and finishable (faults off: this checks liveness, not faults).
    async fn drain(&mut self, faulty_off: impl Fn()) -> Result<(), String> {
        faulty_off();
        self.held = Default::default();
        let count = self.observe()?.len();
        for _ in 0..=self.checks {
            self.monitor.check_once().await.map_err(|e| e.to_string())?;
        }
        if let Some((id, _)) = self
            .observe()?
            .iter()
            .find(|(_, s)| s.state == JobState::Running)
        {
            return Err(format!(
                "drain: {id} still running after the monitor's window"
            ));
        }
        let opts = AcceptOpts::default()
            .timeout(Duration::ZERO)
            .max_sched_time(i64::from(u32::MAX));
        loop {
            match self.jobs.accept(TY, opts.clone()).await {
                Ok((job, _)) => self
                    .jobs
                    .finish(&job, None)
                    .await
                    .map_err(|e| e.to_string())?,
                Err(JobsError::NotFound) => break,
                Err(e) => return Err(format!("drain accept: {e}")),
            }
        }
        let end = self.observe()?;
        match end.iter().find(|(_, s)| s.state != JobState::Finished) {
            Some((id, s)) => Err(format!("drain: {id} ended {s:?}")),
            None if end.len() != count => Err(format!("drain: {count} jobs became {}", end.len())),
            None => Ok(()),
        }
    }
}

/// What the histories exercised (printed, so a run that tests nothing is visible).
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    steps: u64,
    faults: u64,
    finished: u64,
    requeued: u64,
    timed_out: u64,
}

impl Stats {
    fn add(&mut self, o: Stats) {
        self.steps += o.steps;
        self.faults += o.faults;
        self.finished += o.finished;
        self.requeued += o.requeued;
        self.timed_out += o.timed_out;
    }
}

/// Runs one seeded history; `Err` names the first violation.
async fn history(seed: u64, trace: bool) -> (Result<(), String>, Stats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut world = World::new(seed).await;
    if trace {
        world.trace = Some(Vec::new());
    }
    let mut result = Ok(());
    let mut stats = Stats::default();
    for t in 0..STEPS {
        let step = world.pick(&mut rng);
        let (r, outcome) = world.run(t, &step).await;
        result = r;
        stats.steps += 1;
        match (&step, &outcome) {
            (Step::Finish(_), Ok(_)) => stats.finished += 1,
            (Step::Monitor, Ok(n)) => stats.requeued += n.parse::<u64>().unwrap_or(0),
            (_, Err(e)) if timed_out(e) => stats.timed_out += 1,
            _ => {}
        }
        if result.is_err() {
            break;
        }
    }
    stats.faults = world.faulty.total();
    if result.is_ok() {
        let faulty = world.faulty.clone();
        result = world.drain(move || faulty.set_enabled(false)).await;
    }
    if let Some(trace) = &world.trace {
        for line in trace {
            println!("{line}");
        }
    }
    (result, stats)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn chaos_histories_keep_couch_jobs_invariants() {
    if let Some(seed) = env_u64("CHAOS_SEED") {
        let rt = paused_runtime();
        let (result, stats) = rt.block_on(history(seed, true));
        println!("{stats:?}");
        println!(
            "chaos: 1 histories, {} violations, seed {seed}",
            u8::from(result.is_err())
        );
        if let Err(e) = result {
            panic!("seed {seed}: {e}");
        }
        return;
    }
    let n = env_u64("CHAOS_HISTORIES").unwrap_or(DEFAULT_HISTORIES);
    let base = env_u64("CHAOS_BASE_SEED").unwrap_or(BASE_SEED);
    let threads = std::thread::available_parallelism()
        .map_or(2, |p| p.get())
        .min(4) as u64;
    let workers: Vec<_> = (0..threads)
        .map(|k| {
            std::thread::spawn(move || {
                let rt = paused_runtime();
                let mut failures = Vec::new();
                let mut stats = Stats::default();
                for i in (k..n).step_by(threads as usize) {
                    let seed = base.wrapping_add(i);
                    let (result, s) = rt.block_on(history(seed, false));
                    stats.add(s);
                    if let Err(e) = result {
                        failures.push((seed, e));
                    }
                }
                (failures, stats)
            })
        })
        .collect();
    let mut failures: Vec<(u64, String)> = Vec::new();
    let mut stats = Stats::default();
    for w in workers {
        let (f, s) = w.join().expect("chaos worker");
        failures.extend(f);
        stats.add(s);
    }
    failures.sort();
    for (seed, e) in failures.iter().take(8) {
        println!("violation: seed {seed}: {e}");
    }
    println!("chaos exercised: {stats:?}");
    assert!(
        stats.faults > n && stats.finished > n / 2 && stats.requeued > 0 && stats.timed_out > 0,
        "the histories exercised too little: {stats:?}"
    );
    println!(
        "chaos: {n} histories, {} violations, seed {base}",
        failures.len()
    );
    if let Some((seed, e)) = failures.first() {
        panic!(
            "{} violating histories; first: seed {seed}: {e}\nreplay: CHAOS_SEED={seed} cargo nextest run --test jobs_chaos --no-capture",
            failures.len()
        );
    }
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}
