//! `accept` (CouchDB's couch_jobs_fdb/couch_jobs_pending accept): dequeue one pending job and lock it for the caller.
//!
//! Scheduled mode reads up to 1024 of the earliest eligible PENDING keys at snapshot
//! isolation, picks one uniformly at random and adds a read conflict on that key only, so
//! concurrent acceptors rarely collide. `no_schedule` mode probes at a random id instead.
//! When nothing is eligible, the same transaction sets a watch on the type's pending counter
//! and [`Jobs::accept`](super::Jobs::accept) waits on it.
//!
//! Concurrent acceptors of one process also see each other's picks ([`Claims`]): a key that
//! another of this process's `accept` transactions is taking is passed over while unclaimed
//! candidates remain, so acceptors that read the same candidates do not all pick one and
//! fail on its conflict (the pick stays uniform among the unclaimed; with none unclaimed it
//! is uniform among all, as before).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::store::{KeyValue, RangeOptions, Tx};

use super::Job;
use super::error::{JobsError, JobsResult};
use super::job_data::{JobData, JobState, new_jlock};
use super::keys::Keys;
use super::lifecycle::{get_row, stamp_running};

/// `RANGE_LIMIT`: how many candidates the random pick chooses among.
pub(crate) const ACCEPT_RANGE_LIMIT: usize = 1024;

/// With `earliest_first`: the fewest candidates the pick still spreads over when few jobs
/// share the earliest scheduled time, so concurrent acceptors rarely take the same one.
const EARLIEST_SPREAD: usize = 8;

/// Default `max_sched_time`: 2^36 seconds (far future).
pub const MAX_SCHED_TIME: i64 = 1 << 36;

/// Options of `accept`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AcceptOpts {
    /// Accept only jobs scheduled at or before this UNIX time (default 2^36, or 0 with
    /// `no_schedule`).
    pub max_sched_time: Option<i64>,
    /// Random-probe dequeue for types whose jobs all have STime 0 and random-looking ids.
    pub no_schedule: bool,
    /// How long to wait for a job: `None` = forever, `Some(ZERO)` = do not wait.
    pub timeout: Option<Duration>,
    /// How many of the earliest eligible jobs the random pick chooses among (default
    /// `ACCEPT_RANGE_LIMIT`, as couch_jobs). Fewer makes the queue nearly first-in
    /// first-out by scheduled time, while concurrent acceptors still rarely pick the same job.
    pub candidates: Option<usize>,
    /// Picks among the candidates scheduled at the earliest time only (at least
    /// `EARLIEST_SPREAD` of them), so a job waiting since long ago is not diluted among
    /// jobs that became eligible a moment ago.
    pub earliest_first: bool,
    /// A field written into the taken job's data by the accept's own transaction.
    pub set_field: Option<(String, serde_json::Value)>,
}

impl AcceptOpts {
    /// Accepts only jobs scheduled at or before UNIX time `t` (seconds).
    pub fn max_sched_time(mut self, t: i64) -> Self {
        self.max_sched_time = Some(t);
        self
    }

    /// Waits at most `t` for an eligible job (`Duration::ZERO`: do not wait).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Picks among the `n` earliest eligible jobs only (at least 1).
    pub fn candidates(mut self, n: usize) -> Self {
        self.candidates = Some(n.max(1));
        self
    }

    /// How many candidates the pick chooses among.
    pub(crate) fn candidate_limit(&self) -> usize {
        self.candidates.unwrap_or(ACCEPT_RANGE_LIMIT).max(1)
    }

    /// Picks among the earliest scheduled candidates only (see [`AcceptOpts::earliest_first`]).
    pub fn earliest_first(mut self) -> Self {
        self.earliest_first = true;
        self
    }

    /// Writes `name = value` into the taken job's data in the accept's own transaction (a
    /// worker's name, say: the job then shows who runs it from the moment it is taken,
    /// without a second transaction).
    pub fn set_field(mut self, name: &str, value: serde_json::Value) -> Self {
        self.set_field = Some((name.to_owned(), value));
        self
    }

    /// Uses the random-probe dequeue; the type's jobs must all be scheduled at time 0.
    #[cfg(any(test, feature = "internals"))]
    pub fn no_schedule(mut self) -> Self {
        self.no_schedule = true;
        self
    }

    /// The effective `max_sched_time`, or the `no_schedule` error.
    pub(crate) fn effective_max_sched_time(&self) -> JobsResult<i64> {
        match (self.no_schedule, self.max_sched_time) {
            (true, None | Some(0)) => Ok(0),
            (true, Some(_)) => Err(JobsError::NoScheduleRequiresZeroMaxSchedTime),
            (false, t) => Ok(t.unwrap_or(MAX_SCHED_TIME)),
        }
    }
}

/// The random choices of `accept` (which candidate, which probe): seeded for tests that
/// replay a history exactly, from the OS otherwise.
#[derive(Debug)]
pub struct AcceptRng(Mutex<StdRng>);

impl AcceptRng {
    /// Seeded with `seed` (replayable), or from the OS when `None`.
    pub fn new(seed: Option<u64>) -> Self {
        Self(Mutex::new(match seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        }))
    }

    fn with<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn index(&self, n: usize) -> usize {
        self.with(|r| r.random_range(0..n))
    }

    /// A random probe id (32 hex characters, like a job lock).
    fn probe_id(&self) -> String {
        self.with(|r| format!("{:032x}", r.random::<u128>()))
    }
}

/// The pending keys this process's `accept` transactions are taking right now.
#[derive(Debug, Default)]
pub struct Claims(Mutex<HashSet<Vec<u8>>>);

impl Claims {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Vec<u8>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Picks one of `candidates`: uniformly among those nobody here is taking, or among all
    /// when every one is taken (so the pick only ever differs from a plain uniform pick while
    /// another acceptor holds a claim); the pick is claimed until the returned guard drops.
    fn pick(self: &Arc<Self>, candidates: &[KeyValue], rng: &AcceptRng) -> (usize, Claim) {
        let mut taken = self.lock();
        let free: Vec<usize> = (0..candidates.len())
            .filter(|&i| !taken.contains(&candidates[i].key))
            .collect();
        let pick = if taken.is_empty() || free.is_empty() {
            rng.index(candidates.len())
        } else {
            free[rng.index(free.len())]
        };
        let key = candidates[pick].key.clone();
        let owned = taken.insert(key.clone());
        let claim = Claim {
            claims: self.clone(),
            key: owned.then_some(key),
        };
        (pick, claim)
    }
}

/// A claimed pending key, released on drop (when the `accept` transaction committed or failed).
#[derive(Debug)]
pub struct Claim {
    claims: Arc<Claims>,
    /// `None` when another acceptor claimed the key first (it releases it).
    key: Option<Vec<u8>>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.claims.lock().remove(&key);
        }
    }
}

/// Tries once to dequeue and lock a job in `tx`. `Ok(None)` when nothing is eligible.
pub async fn try_accept(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    opts: &AcceptOpts,
    rng: &AcceptRng,
) -> JobsResult<Option<(Job, JobData)>> {
    let claims = Arc::new(Claims::default());
    let found = try_accept_claimed(keys, tx, ty, opts, rng, &claims).await?;
    Ok(found.map(|(job, data, _)| (job, data)))
}

/// [`try_accept`] passing over the keys in `claims`; the key taken stays claimed until the
/// returned [`Claim`] drops (hold it until the transaction ends).
pub(crate) async fn try_accept_claimed(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    opts: &AcceptOpts,
    rng: &AcceptRng,
    claims: &Arc<Claims>,
) -> JobsResult<Option<(Job, JobData, Claim)>> {
    let mut candidates = if opts.no_schedule {
        probe_random(keys, tx, ty, rng).await?
    } else {
        let (begin, end) = keys.pending_range(ty, opts.effective_max_sched_time()?);
        tx.get_range(
            &begin,
            &end,
            RangeOptions::all().snapshot().limit(opts.candidate_limit()),
        )
        .await?
    };
    if opts.earliest_first {
        keep_earliest(keys, &mut candidates);
    }
    while !candidates.is_empty() {
        let (pick, claim) = claims.pick(&candidates, rng);
        let KeyValue { key, .. } = candidates.swap_remove(pick);
        tx.add_read_conflict_key(&key);
        tx.clear(&key);
        let (_stime, id) = keys.decode_pending_key(&key)?;
        let row = get_row(keys, tx, ty, &id, false).await?;
        let Some(mut row) = row.filter(|r| r.state() == JobState::Pending) else {
            // A pending key without a pending DATA row is stale: clearing it (above) repairs
            // the index instead of crashing the acceptor as CouchDB would.
            tracing::warn!(job_type = ty, job_id = %id, "stale pending key removed");
            continue;
        };
        let jlock = new_jlock();
        row.jlock = Some(jlock.clone());
        row.resubmit = false;
        if let Some((name, value)) = &opts.set_field {
            row.data.insert(name.clone(), value.clone());
        }
        stamp_running(keys, tx, ty, &id, &mut row);
        let job = Job {
            job_type: ty.to_string(),
            id,
            jlock,
            resubmit: false,
            stime: Some(row.stime),
        };
        return Ok(Some((job, row.data, claim)));
    }
    Ok(None)
}

/// Narrows key-ordered pending `candidates` to those at the first one's scheduled time, or to
/// the first `EARLIEST_SPREAD` when fewer share it. Undecodable keys stay, for the pick loop
/// to report.
fn keep_earliest(keys: &Keys, candidates: &mut Vec<KeyValue>) {
    let stime = |kv: &KeyValue| keys.decode_pending_key(&kv.key).ok().map(|(t, _)| t);
    let Some(first) = candidates.first().and_then(stime) else {
        return;
    };
    let same = candidates
        .iter()
        .take_while(|kv| stime(kv).is_none_or(|t| t == first))
        .count();
    candidates.truncate(same.max(EARLIEST_SPREAD));
}

/// `no_schedule` probe: the first pending key at or after a random id, or the last before it
/// (a coin flip picks the side tried first so ids near either end are not starved).
async fn probe_random(
    keys: &Keys,
    tx: &Tx,
    ty: &str,
    rng: &AcceptRng,
) -> JobsResult<Vec<KeyValue>> {
    let (begin, end) = keys.pending_range(ty, 0);
    let probe = keys.pending(ty, 0, &rng.probe_id());
    let forward_first = rng.index(2) == 0;
    for forward in [forward_first, !forward_first] {
        let rows = if forward {
            tx.get_range(&probe, &end, RangeOptions::all().snapshot().limit(1))
                .await?
        } else {
            tx.get_range(
                &begin,
                &probe,
                RangeOptions::all().snapshot().limit(1).reverse(),
            )
            .await?
        };
        if !rows.is_empty() {
            return Ok(rows);
        }
    }
    Ok(Vec::new())
}

/// How long an empty accept waits on the pending watch (CouchDB's couch_jobs_fdb/couch_jobs_pending accept): the time until
/// `max_sched_time` (at least 100 ms; infinite in `no_schedule` mode or when ≥ 2^32-1 ms),
/// capped by the caller's remaining timeout. `None` = forever.
pub(crate) fn wait_timeout(
    no_schedule: bool,
    max_sched_time: i64,
    now_ms: i64,
    remaining: Option<Duration>,
) -> Option<Duration> {
    let sched = if no_schedule {
        None
    } else {
        let ms = max_sched_time
            .saturating_mul(1000)
            .saturating_sub(now_ms)
            .max(100);
        (ms < (1i64 << 32) - 1).then(|| Duration::from_millis(ms as u64))
    };
    match (sched, remaining) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_timeout_follows_couch_rules() {
        let s = Duration::from_secs;
        // Far-future max_sched_time → infinity unless the caller limits it.
        assert_eq!(wait_timeout(false, MAX_SCHED_TIME, 0, None), None);
        assert_eq!(
            wait_timeout(false, MAX_SCHED_TIME, 0, Some(s(3))),
            Some(s(3))
        );
        // max_sched_time = now + 5 → wakes after ~5 s.
        assert_eq!(wait_timeout(false, 105, 100_000, None), Some(s(5)));
        // In the past → at least 100 ms.
        assert_eq!(
            wait_timeout(false, 1, 100_000, None),
            Some(Duration::from_millis(100))
        );
        assert_eq!(wait_timeout(true, 0, 100_000, None), None);
        assert_eq!(wait_timeout(true, 0, 100_000, Some(s(1))), Some(s(1)));
    }

    #[test]
    fn claimed_candidates_are_passed_over_while_others_remain() {
        let kv = |k: &str| KeyValue {
            key: k.as_bytes().to_vec(),
            value: Vec::new(),
        };
        let candidates = vec![kv("a"), kv("b"), kv("c")];
        let claims = Arc::new(Claims::default());
        let rng = AcceptRng::new(Some(7));
        let (first, held) = claims.pick(&candidates, &rng);
        for _ in 0..20 {
            let (pick, _claim) = claims.pick(&candidates, &rng);
            assert_ne!(pick, first, "a claimed key is picked only when all are");
        }
        // All claimed: the pick is among all again, and a second claim of a key is not an
        // owner (dropping it keeps the first claim).
        let (_, b) = claims.pick(&candidates[..1], &rng);
        let (_, c) = claims.pick(&candidates[..1], &rng);
        drop(c);
        assert!(claims.lock().contains(&candidates[0].key));
        drop((b, held));
        assert!(claims.lock().is_empty());
    }

    #[test]
    fn no_schedule_needs_zero_max_sched_time() {
        assert_eq!(
            AcceptOpts::default()
                .no_schedule()
                .effective_max_sched_time(),
            Ok(0)
        );
        assert_eq!(
            AcceptOpts::default()
                .no_schedule()
                .max_sched_time(5)
                .effective_max_sched_time(),
            Err(JobsError::NoScheduleRequiresZeroMaxSchedTime)
        );
        assert_eq!(
            AcceptOpts::default().effective_max_sched_time(),
            Ok(MAX_SCHED_TIME)
        );
    }
}
