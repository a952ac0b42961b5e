//! couch_jobs: the background-jobs framework on the transactional store (docs/architecture.md, "What it is",
//! CouchDB's couch_jobs, fdbarchive branch, RFC 007).
//!
//! A global pending queue per job type ordered by scheduled time, worker locks that fence
//! stale workers, an activity monitor that re-enqueues jobs of dead workers, and
//! subscriptions to job state changes. [`Jobs`] is the handle: every operation runs in its own
//! retried transaction, and has a `*_tx` form that runs inside a caller's transaction so a
//! worker can fence its own writes with [`Jobs::update_tx`]/[`Jobs::finish_tx`].
//! [`Jobs::start_background`] starts the supervised per-node processes (`jobs_sup`: type
//! server, per-type activity monitor and notifier).
//!
//! Choices where sources differ: versionstamps are the 96-bit tuple form (code 0x33, the only
//! one foundationdb-tuple 0.11 has), with a cycling user version so two jobs stamped in one
//! transaction keep distinct ACTIVITY keys; `fold_jobs` is paged over several transactions;
//! `resubmit` with no scheduled time keeps the job's current one (CouchDB defaults to 2^36).

pub mod accept;
pub mod activity_monitor;
mod api;
pub mod clock;
pub(crate) mod config;
pub mod error;
pub(crate) mod event;
pub(crate) mod fold;
pub mod job_data;
pub(crate) mod jobs_sup;
pub(crate) mod keys;
pub mod lifecycle;
pub mod notifier;
pub mod subscription;
pub(crate) mod type_server;

use std::sync::Arc;

use crate::store::{Db, tuple};

pub use accept::{AcceptOpts, MAX_SCHED_TIME};
pub use clock::{Clock, CorrectedClock, SharedClock, SystemClock};
#[cfg(any(test, feature = "internals"))]
pub use clock::{ManualClock, TokioClock};
pub use config::JobsConfig;
pub use error::{JobsError, JobsResult};
#[cfg(any(test, feature = "internals"))]
pub use event::EventState;
pub use job_data::{JobData, JobState};
pub use jobs_sup::Background;
pub use keys::Keys;
pub use subscription::Subscribed;

/// A job held by a worker after `accept`: the lock fences every later `update`/`finish`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The job type (a couch_jobs type such as `"replication"`).
    pub job_type: String,
    /// The job's id, unique within its type.
    pub id: String,
    /// The worker lock (32 hex characters).
    pub jlock: String,
    /// Set when someone resubmitted the job while it ran (known after `update`).
    pub resubmit: bool,
    /// The job's scheduled time (known after `accept`/`update`).
    pub stime: Option<i64>,
}

impl Job {
    /// Whether the job was resubmitted while running: `finish` will put it back to pending.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_resubmitted(&self) -> bool {
        self.resubmit
    }
}

/// How a `Jobs` handle (couch_jobs, internal) is set up.
#[derive(Debug, Clone)]
pub struct JobsOptions {
    /// The layer prefix the jobs key space lives under (`prefix ‖ pack((51, ...))`).
    pub prefix: Vec<u8>,
    /// The wall clock `accept` compares scheduled times with, also read by the layers above
    /// (a manual one in tests).
    pub clock: SharedClock,
    /// The `[couch_jobs]` settings: activity monitor, type server and notifier timing and
    /// batch sizes.
    pub config: JobsConfig,
    /// Seeds `accept`'s random choices (tests that replay histories); `None` = OS entropy.
    pub rng_seed: Option<u64>,
}

impl Default for JobsOptions {
    fn default() -> Self {
        Self {
            prefix: tuple::pack(&(tuple::Bytes::from(&b"couchdb"[..]),)),
            clock: Arc::new(SystemClock),
            config: JobsConfig::default(),
            rng_seed: None,
        }
    }
}

/// The couch_jobs handle: cheap to clone, shared by callers and the background processes.
#[derive(Clone)]
pub struct Jobs {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    keys: Keys,
    clock: SharedClock,
    /// The same clock, to correct (see [`Jobs::corrected_clock`]).
    corrected: Arc<CorrectedClock>,
    config: JobsConfig,
    registry: Arc<type_server::Registry>,
    rng: accept::AcceptRng,
    claims: Arc<accept::Claims>,
    /// Job rows read by [`Jobs::fold_jobs`] so far (a scan of every job shows here).
    rows_listed: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("db", &self.inner.db)
            .field("prefix", &self.inner.keys.jobs_prefix())
            .finish()
    }
}

impl Jobs {
    /// A handle on the jobs key space under `options.prefix` in `db` (its transaction ids go
    /// under that prefix too). Starts nothing: call [`Jobs::start_background`] on each node
    /// that runs workers.
    pub fn new(db: Db, options: JobsOptions) -> Self {
        let corrected = Arc::new(CorrectedClock::new(options.clock));
        Self {
            inner: Arc::new(Inner {
                db: db.with_txid_prefix(&options.prefix),
                keys: Keys::new(&options.prefix),
                clock: corrected.clone(),
                corrected,
                config: options.config,
                registry: Arc::new(type_server::Registry::default()),
                rng: accept::AcceptRng::new(options.rng_seed),
                claims: Arc::default(),
                rows_listed: Default::default(),
            }),
        }
    }

    /// The store handle every operation runs its transactions on.
    pub fn db(&self) -> &Db {
        &self.inner.db
    }

    /// The key layout, for callers that read or write jobs keys in their own transactions.
    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    /// The wall clock of this handle (see [`JobsOptions::clock`]).
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// The wall clock of this handle as a [`CorrectedClock`]: the options' clock, moved by
    /// whatever offset the layers above settle on (a cluster's median clock).
    pub fn corrected_clock(&self) -> &Arc<CorrectedClock> {
        &self.inner.corrected
    }

    /// The `[couch_jobs]` settings this handle was built with.
    pub fn config(&self) -> &JobsConfig {
        &self.inner.config
    }

    /// Job rows read by [`Jobs::fold_jobs`] so far, over every job type.
    pub fn rows_listed(&self) -> u64 {
        self.inner
            .rows_listed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn count_listed(&self, n: usize) {
        self.inner
            .rows_listed
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn rng(&self) -> &accept::AcceptRng {
        &self.inner.rng
    }

    pub(crate) fn claims(&self) -> &Arc<accept::Claims> {
        &self.inner.claims
    }

    pub(crate) fn registry(&self) -> &Arc<type_server::Registry> {
        &self.inner.registry
    }

    /// Starts this node's supervised background processes (`jobs_sup`).
    pub async fn start_background(&self) -> JobsResult<Background> {
        jobs_sup::start(self.clone()).await
    }
}
