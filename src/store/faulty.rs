//! A seeded fault-injecting wrapper around any [`Store`]: FoundationDB's failure modes
//! without FoundationDB, one level above the engine (FDB itself is tested the same way, with
//! "buggify" in deterministic simulation).
//!
//! Every fault surfaces as the [`StoreError`] the FDB adapter produces for the same event
//! (both go through `super::fdb_errors::classify`):
//!
//! | fault | what the caller sees | FDB |
//! |---|---|---|
//! | spurious conflict (nothing applied) | [`StoreError::Conflict`] | 1020 `not_committed` |
//! | unknown result, commit applied | [`StoreError::CommitUnknown`] | 1021 `commit_unknown_result` |
//! | unknown result, nothing applied | [`StoreError::CommitUnknown`] | 1021 |
//! | read version too old (on a read) | [`StoreError::TooOld`] | 1007 `transaction_too_old` |
//! | commit hangs (applied or not) | [`StoreError::TimedOut`] from [`Db::run`](super::Db::run)'s timeout | 1031 `transaction_timed_out` |
//! | delay before / after the commit | nothing but time | slow proxies / resolvers |
//! | watch fires late | the watch resolves after an extra delay | watches are asynchronous |
//! | watch fires spuriously | the watch resolves with no change | FDB fires on ABA changes and after errors such as 1009 `future_version` |
//!
//! Off unless wrapped: production code never builds one. Decisions come from one seeded RNG
//! drawn in call order, so a sequential history with the same seed sees the same faults.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::fdb_errors::{COMMIT_UNKNOWN_RESULT, NOT_COMMITTED, TRANSACTION_TOO_OLD, store_error};
use super::{CommitStamp, KeyValue, RangeOptions, Store, StoreError, Transaction, Watch};

/// How often each fault happens: probabilities in `0..=1` per decision point (commit, read
/// or watch). The commit faults are exclusive and drawn together, so their sum should stay
/// below 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultRates {
    /// Per commit: [`StoreError::Conflict`], nothing applied.
    pub conflict: f64,
    /// Per commit: applied, then [`StoreError::CommitUnknown`].
    pub unknown_applied: f64,
    /// Per commit: nothing applied, [`StoreError::CommitUnknown`].
    pub unknown_not_applied: f64,
    /// Per commit: never returns (applied or not, a coin flip); only a timeout ends it.
    pub hang: f64,
    /// Per commit: sleep up to `max_delay` before it, and (independently) after it.
    pub delay: f64,
    /// Per read (`get`, `get_range`): [`StoreError::TooOld`].
    pub too_old: f64,
    /// Per watch: fires only after an extra delay up to `max_delay`.
    pub watch_late: f64,
    /// Per watch: fires at once although nothing changed.
    pub watch_spurious: f64,
    /// Longest injected delay.
    pub max_delay: Duration,
}

impl FaultRates {
    /// No faults at all.
    pub fn none() -> Self {
        Self {
            conflict: 0.0,
            unknown_applied: 0.0,
            unknown_not_applied: 0.0,
            hang: 0.0,
            delay: 0.0,
            too_old: 0.0,
            watch_late: 0.0,
            watch_spurious: 0.0,
            max_delay: Duration::ZERO,
        }
    }

    /// Every fault kind at `rate` (hangs at a tenth of it: each costs a whole timeout).
    pub fn uniform(rate: f64) -> Self {
        Self {
            conflict: rate,
            unknown_applied: rate,
            unknown_not_applied: rate,
            hang: rate / 10.0,
            delay: rate,
            too_old: rate,
            watch_late: rate,
            watch_spurious: rate,
            max_delay: Duration::from_millis(200),
        }
    }
}

/// The fault kinds, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// A spurious conflict (FDB 1020).
    Conflict,
    /// `commit_unknown_result` (1021) after a commit that landed.
    UnknownApplied,
    /// `commit_unknown_result` (1021) after a commit that did not land.
    UnknownNotApplied,
    /// A commit that never answers (until the timeout, 1031), after landing.
    HangApplied,
    /// A commit that never answers (until the timeout, 1031), without landing.
    HangNotApplied,
    /// A pause before the commit reaches the engine.
    DelayBeforeCommit,
    /// A pause after the commit landed, before the caller hears of it.
    DelayAfterCommit,
    /// `transaction_too_old` (1007) on a read.
    TooOld,
    /// A watch that fires late.
    WatchLate,
    /// A watch that fires although its key did not change.
    WatchSpurious,
}

impl FaultKind {
    /// Every kind, in counting order.
    pub(crate) const ALL: [FaultKind; 10] = [
        FaultKind::Conflict,
        FaultKind::UnknownApplied,
        FaultKind::UnknownNotApplied,
        FaultKind::HangApplied,
        FaultKind::HangNotApplied,
        FaultKind::DelayBeforeCommit,
        FaultKind::DelayAfterCommit,
        FaultKind::TooOld,
        FaultKind::WatchLate,
        FaultKind::WatchSpurious,
    ];

    fn index(self) -> usize {
        FaultKind::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }
}

/// A fault forced on the next commit ([`FaultyStore::force_commit_fault`]), for tests that
/// need one exact fault rather than a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFault {
    /// A spurious conflict.
    Conflict,
    /// `commit_unknown_result` after the commit landed.
    UnknownApplied,
    /// `commit_unknown_result` without landing.
    UnknownNotApplied,
    /// Never returns; `applied` says whether the commit landed first.
    Hang {
        /// Whether the commit landed before it stopped answering.
        applied: bool,
    },
}

struct Shared {
    rates: FaultRates,
    forced: Mutex<std::collections::VecDeque<CommitFault>>,
    forced_too_old: AtomicU64,
    rng: Mutex<StdRng>,
    enabled: AtomicBool,
    counts: [AtomicU64; FaultKind::ALL.len()],
}

impl Shared {
    fn rng(&self) -> MutexGuard<'_, StdRng> {
        self.rng.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One draw against `p` (no draw at all while disabled or when `p` is 0, so turning a
    /// kind off does not shift the other kinds' decisions).
    fn read_too_old(&self) -> bool {
        let forced = self
            .forced_too_old
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if forced {
            self.count(FaultKind::TooOld);
            return true;
        }
        self.roll(self.rates.too_old, FaultKind::TooOld)
    }

    fn roll(&self, p: f64, kind: FaultKind) -> bool {
        if p <= 0.0 || !self.enabled.load(Ordering::Relaxed) {
            return false;
        }
        let hit = self.rng().random_bool(p.min(1.0));
        if hit {
            self.count(kind);
        }
        hit
    }

    fn count(&self, kind: FaultKind) {
        self.counts[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    fn delay(&self) -> Duration {
        let max = self.rates.max_delay.as_micros() as u64;
        Duration::from_micros(self.rng().random_range(0..=max))
    }

    fn plan_commit(&self) -> CommitPlan {
        let forced = self
            .forced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        if let Some(fault) = forced {
            return match fault {
                CommitFault::Conflict => CommitPlan::Conflict,
                CommitFault::UnknownApplied => CommitPlan::UnknownApplied,
                CommitFault::UnknownNotApplied => CommitPlan::UnknownNotApplied,
                CommitFault::Hang { applied } => CommitPlan::Hang(Some(applied)),
            };
        }
        if !self.enabled.load(Ordering::Relaxed) {
            return CommitPlan::Normal;
        }
        let r = &self.rates;
        let x: f64 = self.rng().random();
        let plans = [
            (r.conflict, CommitPlan::Conflict),
            (r.unknown_applied, CommitPlan::UnknownApplied),
            (r.unknown_not_applied, CommitPlan::UnknownNotApplied),
            (r.hang, CommitPlan::Hang(None)),
        ];
        let mut edge = 0.0;
        for (p, plan) in plans {
            edge += p;
            if x < edge {
                return plan;
            }
        }
        CommitPlan::Normal
    }
}

#[derive(Clone, Copy)]
enum CommitPlan {
    Normal,
    Conflict,
    UnknownApplied,
    UnknownNotApplied,
    /// `Some(applied)` when forced, `None` = a coin flip.
    Hang(Option<bool>),
}

/// The wrapper. Cheap to clone; clones share the RNG, the switch and the counters.
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore")
            .field("engine", &self.inner.engine_name())
            .field("rates", &self.shared.rates)
            .finish()
    }
}

impl FaultyStore {
    /// Wraps `inner`; faults are on from the start.
    pub fn new(inner: Arc<dyn Store>, rates: FaultRates, seed: u64) -> Self {
        Self {
            inner,
            shared: Arc::new(Shared {
                rates,
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                forced: Mutex::new(Default::default()),
                forced_too_old: AtomicU64::new(0),
                enabled: AtomicBool::new(true),
                counts: Default::default(),
            }),
        }
    }

    /// The wrapper from the environment: `COUCH_STORE_FAULTS=RATE[:SEED]` (for example
    /// `0.01:7`), as [`FaultyStore::from_spec`]; unset returns `inner` unchanged. Test helpers
    /// use it to run whole suites under faults.
    pub fn from_env(inner: Arc<dyn Store>) -> Arc<dyn Store> {
        match std::env::var("COUCH_STORE_FAULTS") {
            Ok(spec) => Self::from_spec(inner, &spec),
            Err(_) => inner,
        }
    }

    /// `inner` wrapped with [`FaultRates::uniform`]`(RATE)` from `spec` = `RATE[:SEED]`, but no
    /// hung commits (each costs a whole 60 s transaction timeout, longer than the time bounds
    /// of the suites this is for; the chaos test and the store fault suite cover hangs); an
    /// unparsable spec returns `inner` unchanged, with a warning.
    pub fn from_spec(inner: Arc<dyn Store>, spec: &str) -> Arc<dyn Store> {
        let mut parts = spec.splitn(2, ':');
        let rate = parts.next().and_then(|r| r.trim().parse::<f64>().ok());
        let seed = parts.next().and_then(|s| s.trim().parse::<u64>().ok());
        match rate {
            Some(rate) if (0.0..=1.0).contains(&rate) => {
                let seed = seed.unwrap_or_else(rand::random);
                tracing::info!(rate, seed, "store fault injection on");
                let rates = FaultRates {
                    hang: 0.0,
                    ..FaultRates::uniform(rate)
                };
                Arc::new(FaultyStore::new(inner, rates, seed))
            }
            _ => {
                tracing::warn!(spec, "store fault spec is not RATE[:SEED]; faults off");
                inner
            }
        }
    }

    /// Turns injection on or off (off: a transparent pass-through that draws nothing).
    pub fn set_enabled(&self, on: bool) {
        self.shared.enabled.store(on, Ordering::Relaxed);
    }

    /// Makes the next commit (of any transaction) fail with `fault`; several queue up.
    /// Works while rates are disabled too.
    pub fn force_commit_fault(&self, fault: CommitFault) {
        self.shared
            .forced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(fault);
    }

    /// Makes the next `n` reads fail with `transaction_too_old`.
    pub fn force_too_old_reads(&self, n: u64) {
        self.shared.forced_too_old.fetch_add(n, Ordering::Relaxed);
    }

    /// How many faults of `kind` were injected so far.
    pub fn count(&self, kind: FaultKind) -> u64 {
        self.shared.counts[kind.index()].load(Ordering::Relaxed)
    }

    /// All injected faults so far.
    pub fn total(&self) -> u64 {
        FaultKind::ALL.iter().map(|k| self.count(*k)).sum()
    }
}

impl Store for FaultyStore {
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn Transaction>, StoreError>> {
        async move {
            let inner = self.inner.begin().await?;
            let tx: Box<dyn Transaction> = Box::new(FaultyTx {
                inner: Mutex::new(Some(Arc::from(inner))),
                shared: self.shared.clone(),
            });
            Ok(tx)
        }
        .boxed()
    }

    fn engine_name(&self) -> &'static str {
        self.inner.engine_name()
    }

    fn counters(&self) -> Vec<crate::store::EngineCounter> {
        self.inner.counters()
    }
}

/// One transaction under faults. The inner transaction is dropped (rolled back) as soon as
/// a fault decides it must not apply, so a serial engine's lock is not held by a hang.
struct FaultyTx {
    inner: Mutex<Option<Arc<dyn Transaction>>>,
    shared: Arc<Shared>,
}

fn gone() -> StoreError {
    StoreError::Invalid("transaction already committed".into())
}

impl FaultyTx {
    fn slot(&self) -> MutexGuard<'_, Option<Arc<dyn Transaction>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tx(&self) -> Option<Arc<dyn Transaction>> {
        self.slot().clone()
    }

    fn take(&self) -> Option<Arc<dyn Transaction>> {
        self.slot().take()
    }

    fn write(&self, op: impl FnOnce(&dyn Transaction)) {
        if let Some(tx) = self.tx() {
            op(tx.as_ref());
        }
    }

    async fn faulty_commit(&self) -> Result<Option<CommitStamp>, StoreError> {
        let shared = &self.shared;
        let plan = shared.plan_commit();
        if shared.roll(shared.rates.delay, FaultKind::DelayBeforeCommit) {
            tokio::time::sleep(shared.delay()).await;
        }
        let tx = self.take().ok_or_else(gone)?;
        match plan {
            CommitPlan::Normal => {
                let result = tx.commit().await;
                drop(tx);
                if shared.roll(shared.rates.delay, FaultKind::DelayAfterCommit) {
                    tokio::time::sleep(shared.delay()).await;
                }
                result
            }
            CommitPlan::Conflict => {
                shared.count(FaultKind::Conflict);
                Err(store_error(NOT_COMMITTED))
            }
            CommitPlan::UnknownNotApplied => {
                shared.count(FaultKind::UnknownNotApplied);
                Err(store_error(COMMIT_UNKNOWN_RESULT))
            }
            CommitPlan::UnknownApplied => {
                shared.count(FaultKind::UnknownApplied);
                tx.commit().await?;
                Err(store_error(COMMIT_UNKNOWN_RESULT))
            }
            CommitPlan::Hang(forced) => {
                let applied = forced.unwrap_or_else(|| shared.rng().random_bool(0.5));
                if applied {
                    shared.count(FaultKind::HangApplied);
                    let _ = tx.commit().await;
                } else {
                    shared.count(FaultKind::HangNotApplied);
                }
                drop(tx);
                futures::future::pending().await
            }
        }
    }
}

impl Transaction for FaultyTx {
    fn get<'a>(
        &'a self,
        key: &'a [u8],
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        let too_old = self.shared.read_too_old();
        let tx = self.tx();
        async move {
            let tx = tx.ok_or_else(gone)?;
            if too_old {
                return Err(store_error(TRANSACTION_TOO_OLD));
            }
            tx.get(key, snapshot).await
        }
        .boxed()
    }

    fn get_range<'a>(
        &'a self,
        begin: &'a [u8],
        end: &'a [u8],
        options: RangeOptions,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>, StoreError>> {
        let too_old = self.shared.read_too_old();
        let tx = self.tx();
        async move {
            let tx = tx.ok_or_else(gone)?;
            if too_old {
                return Err(store_error(TRANSACTION_TOO_OLD));
            }
            tx.get_range(begin, end, options).await
        }
        .boxed()
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.write(|tx| tx.set(key, value));
    }

    fn clear(&self, key: &[u8]) {
        self.write(|tx| tx.clear(key));
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.write(|tx| tx.clear_range(begin, end));
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.write(|tx| tx.atomic_add(key, delta));
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.write(|tx| tx.set_versionstamped_key(key, value));
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.write(|tx| tx.set_versionstamped_value(key, value));
    }

    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) {
        self.write(|tx| tx.add_read_conflict_range(begin, end));
    }

    fn watch(&self, key: &[u8]) -> Watch {
        let Some(tx) = self.tx() else {
            return futures::future::ready(Err(gone())).boxed();
        };
        let watch = tx.watch(key);
        let shared = self.shared.clone();
        if shared.roll(shared.rates.watch_spurious, FaultKind::WatchSpurious) {
            drop(watch);
            return futures::future::ready(Ok(())).boxed();
        }
        if shared.roll(shared.rates.watch_late, FaultKind::WatchLate) {
            let late = shared.delay();
            return async move {
                watch.await?;
                tokio::time::sleep(late).await;
                Ok(())
            }
            .boxed();
        }
        watch
    }

    fn commit(&self) -> BoxFuture<'_, Result<Option<CommitStamp>, StoreError>> {
        self.faulty_commit().boxed()
    }
}
