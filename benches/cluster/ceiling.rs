//! The ceiling of part 1: couch_jobs cycles as an ideal client would send them to etcd.
//!
//! The ideal client has no read versions, no reads, no clock and no client logic: it knows
//! every mod revision because it wrote every key itself, and sends only what couch_jobs'
//! key layout (`src/jobs/keys.rs`) makes a cycle write, with one compare for each row its
//! reads would check:
//!
//! | step | compares | writes |
//! |---|---|---|
//! | add | DATA absent | put DATA, put PENDING, put WATCHES_PENDING |
//! | accept | PENDING, DATA unchanged | delete PENDING, put DATA, put ACTIVITY, put WATCHES_ACTIVITY |
//! | update | DATA unchanged | put DATA, delete old ACTIVITY, put new ACTIVITY, put WATCHES_ACTIVITY |
//! | finish | DATA unchanged | put DATA, delete ACTIVITY, put WATCHES_ACTIVITY |
//!
//! `workers` virtual workers are driven in lockstep by `workers / per_txn` tasks: each task
//! sends one `Txn` per step holding that step of each of its `per_txn` workers (the
//! watch keys written once per `Txn`, as the engine's batches fold them), so `per_txn` 1 is
//! one `Txn` per transaction and larger values are perfect batching. No real client can do
//! better than the best of these, so the ratio it reaches bounds
//! `jobs_cycles_etcd_over_raw_txn` on the machine that runs it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use couch_replicator::store::etcd::EtcdConfig;
use etcd_client::{Compare, CompareOp, KvClient, Txn, TxnOp};

use super::BenchResult;

/// A job row's size in the benchmark's cycles (couch_jobs' encoded row with the bench's
/// three-field job data).
const ROW: usize = 160;

/// One virtual worker's job: its keys and the mod revisions it wrote them at.
struct Job {
    data: Vec<u8>,
    pending: Vec<u8>,
    activity: Vec<u8>,
    data_rev: i64,
    pending_rev: i64,
}

impl Job {
    fn new(prefix: &str, worker: usize, n: u64) -> Self {
        Self {
            data: format!("{prefix}/d/{worker}-{n}").into_bytes(),
            pending: format!("{prefix}/p/{worker}-{n}").into_bytes(),
            activity: format!("{prefix}/a/{worker}-{n}-0").into_bytes(),
            data_rev: 0,
            pending_rev: 0,
        }
    }

    /// Step `step`'s compares and writes (watch keys excluded).
    fn step(&mut self, step: usize) -> (Vec<Compare>, Vec<TxnOp>) {
        let row = vec![b'x'; ROW];
        let data_is = Compare::mod_revision(self.data.clone(), CompareOp::Equal, self.data_rev);
        let put_data = TxnOp::put(self.data.clone(), row.clone(), None);
        match step {
            0 => (
                vec![data_is],
                vec![put_data, TxnOp::put(self.pending.clone(), Vec::new(), None)],
            ),
            1 => {
                let pending_is =
                    Compare::mod_revision(self.pending.clone(), CompareOp::Equal, self.pending_rev);
                let ops = vec![
                    TxnOp::delete(self.pending.clone(), None),
                    put_data,
                    TxnOp::put(self.activity.clone(), row, None),
                ];
                (vec![pending_is, data_is], ops)
            }
            2 => {
                let old = self.activity.clone();
                self.activity.push(b'1');
                let ops = vec![
                    put_data,
                    TxnOp::delete(old, None),
                    TxnOp::put(self.activity.clone(), row, None),
                ];
                (vec![data_is], ops)
            }
            _ => {
                let ops = vec![put_data, TxnOp::delete(self.activity.clone(), None)];
                (vec![data_is], ops)
            }
        }
    }

    /// Records that step `step` landed at `revision`.
    fn landed(&mut self, step: usize, revision: i64) {
        self.data_rev = revision;
        if step == 0 {
            self.pending_rev = revision;
        }
    }
}

/// One task: `per_txn` workers in lockstep, one `Txn` per step; returns the cycles done.
async fn driver(
    mut kv: KvClient,
    prefix: String,
    first: usize,
    per_txn: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> BenchResult<()> {
    // Shared by all drivers, as couch_jobs' watch keys are shared by a type's writers.
    let watch_pending = format!("{prefix}/wp").into_bytes();
    let watch_activity = format!("{prefix}/wa").into_bytes();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let mut jobs: Vec<Job> = (first..first + per_txn)
            .map(|w| Job::new(&prefix, w, n))
            .collect();
        for step in 0..4 {
            let (mut compares, mut ops) = (Vec::new(), Vec::new());
            for job in &mut jobs {
                let (c, o) = job.step(step);
                compares.extend(c);
                ops.extend(o);
            }
            let watch = if step == 0 {
                &watch_pending
            } else {
                &watch_activity
            };
            ops.push(TxnOp::put(watch.clone(), b"w".to_vec(), None));
            let resp = kv.txn(Txn::new().when(compares).and_then(ops)).await?;
            if !resp.succeeded() {
                return Err("the ideal client's Txn failed a compare".into());
            }
            let revision = resp.header().map_or(0, |h| h.revision());
            jobs.iter_mut().for_each(|j| j.landed(step, revision));
        }
        done.fetch_add(per_txn as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Runs `workers` virtual workers, `per_txn` to a `Txn`, for `run_for`: (cycles, elapsed).
pub async fn ideal_cycles(
    endpoints: &[String],
    workers: usize,
    per_txn: usize,
    run_for: Duration,
) -> BenchResult<(u64, Duration)> {
    let client = EtcdConfig::new(endpoints.to_vec()).client().await?;
    let (stop, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let start = Instant::now();
    let tasks: Vec<_> = (0..workers / per_txn.max(1))
        .map(|d| {
            let kv = client.kv_client();
            let (stop, done) = (stop.clone(), done.clone());
            tokio::spawn(driver(
                kv,
                format!("ideal-{per_txn}"),
                d * per_txn,
                per_txn,
                stop,
                done,
            ))
        })
        .collect();
    super::job_cycles::stop_after(tasks, &stop, &done, start, run_for).await
}
