//! The measuring window of the scheduler benchmark, run on a dedicated OS thread with its own
//! single-threaded tokio runtime: which jobs run (every second), the connections the
//! scheduler's process holds to the endpoint, its CPU and RSS, and update-to-target latency
//! probes on running jobs. Our node runs in this process, so everything the bench does to
//! measure it would otherwise be billed to "our" CPU; on its own thread that work is billed to
//! the thread alone, whose CPU time is read at the end and subtracted from ours.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_replicator::replicator::scheduler::job_server::JobServerMsg;
use couch_replicator::telemetry::{NodeMetrics, Series};
use ractor::ActorRef;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::measure::{proc_cpu_seconds, self_cpu_seconds};
use super::peers::{connections_to, rss_mb, url_at};

/// How often the running set is read: 1 s resolves a job's running time to a fifth of the
/// default 5 s interval, so over whole rotations jobs that ran equally differ by a sample or
/// two at most.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Connections are counted every second sample (2 s): the count only moves when jobs rotate,
/// a mean over a window of minutes needs no finer grain, and walking `/proc/net/tcp` and the
/// process's fd table (hundreds of sockets) is the costliest reading; doing it half as often
/// keeps the sampling thread from competing with the scheduler under test for the cores.
/// (A probe in flight may hold one connection of this process to the endpoint at that moment:
/// at most one among hundreds.)
const CONNS_EVERY: u32 = 2;
/// Latency probes spread over the window: enough that the p99 is not the maximum.
const PROBES: u32 = 100;
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the running jobs are read.
pub enum Who {
    /// Our job server, job id -> job index, and the node's metrics (its job counters).
    Ours(
        ActorRef<JobServerMsg>,
        HashMap<String, usize>,
        Arc<NodeMetrics>,
    ),
    /// CouchDB's `_active_tasks` URL and its `couch_replicator/jobs` stats URL.
    Couch {
        /// `_active_tasks`.
        tasks: String,
        /// `_node/_local/_stats/couch_replicator/jobs`.
        stats: String,
    },
}

/// What one window measures.
pub struct Spec {
    /// Jobs (indexes `0..jobs`).
    pub jobs: usize,
    /// Minimum warm-up before the window.
    pub warm_up: Duration,
    /// Whether jobs rotate (more jobs than `max_jobs`): then the warm-up also waits for a
    /// rotation.
    pub rotates: bool,
    /// The window.
    pub window: Duration,
    /// The scheduler's process.
    pub pid: u32,
    /// The endpoint's port.
    pub port: u16,
    /// The target database the scheduler's jobs write to.
    pub target: String,
}

/// The raw figures of one window.
#[derive(Debug, Default)]
pub struct Sampled {
    /// Per job, the samples it was running at.
    pub running: Vec<u32>,
    /// Jobs running at a sample that were not at the previous one.
    pub starts: usize,
    /// Per job, the turns seen starting in the window.
    pub turns: Vec<u32>,
    /// CPU seconds of the scheduler's process over the window, less the sampling thread's
    /// when that process is this one.
    pub cpu_s: f64,
    /// CPU seconds of the sampling thread over the window.
    pub bench_cpu_s: f64,
    /// RSS of the scheduler's process at the end, MiB.
    pub rss_mb: f64,
    /// Mean established connections to the endpoint.
    pub connections: f64,
    /// Update-to-target latencies, ms, sorted (probes that timed out left out).
    pub latencies_ms: Vec<f64>,
    /// Probes that timed out while their job still ran (the scheduler's own delay).
    pub probe_timeouts: usize,
    /// Probes that timed out after their job was rotated out (waiting for its next turn,
    /// not a delay of a running job).
    pub probes_rotated_out: usize,
    /// Samples lost because the running set could not be read.
    pub missed: usize,
    /// The scheduler's own job counters over the window.
    pub own_counts: Option<Counts>,
    /// The most jobs a sample saw running at once (ours: job actors, stopping ones
    /// included; CouchDB: `_active_tasks`).
    pub most_running: usize,
}

/// Runs the window on its own thread and returns its figures.
pub async fn measure(spec: Spec, who: Who) -> Result<Sampled, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bench-sampler".into())
        .spawn(move || {
            let outcome = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("sampling runtime: {e}"))
                .and_then(|rt| rt.block_on(window(&spec, &who)));
            let _ = tx.send(outcome);
        })
        .map_err(|e| format!("sampling thread: {e}"))?;
    rx.await
        .map_err(|_| "the sampling thread died".to_owned())?
}

/// CPU seconds the calling thread has used.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clock id is valid on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn cpu_of(pid: u32) -> f64 {
    if pid == std::process::id() {
        self_cpu_seconds()
    } else {
        proc_cpu_seconds(pid).unwrap_or(0.0)
    }
}

impl Who {
    /// The jobs running now; `None` when the question failed (not "nothing runs": a failed
    /// read taken as an empty set would count every running job as started again).
    async fn running(&self, http: &reqwest::Client) -> Option<Vec<usize>> {
        match self {
            Who::Ours(server, index, _) => supervisors::observe(server).await.map(|o| {
                o.jobs
                    .iter()
                    .filter_map(|j| index.get(j.job_id.as_str()).copied())
                    .collect()
            }),
            Who::Couch { tasks: url, .. } => {
                let r = http.get(url).send().await.ok()?;
                if !r.status().is_success() {
                    return None;
                }
                let tasks: Vec<Value> = r.json().await.ok()?;
                Some(
                    tasks
                        .iter()
                        .filter_map(|t| t.get("doc_id")?.as_str()?.strip_prefix('r')?.parse().ok())
                        .collect(),
                )
            }
        }
    }

    /// The scheduler's own counters of job starts, stops and crashes (CouchDB's
    /// `couch_replicator.jobs` series, which ours keeps too): they count every start, also
    /// of a job stopped again before a sample saw it or before it showed in `_active_tasks`.
    async fn own_counts(&self, http: &reqwest::Client) -> Option<Counts> {
        let stats = match self {
            Who::Ours(_, _, m) => {
                return Some(Counts {
                    starts: m.couch.get(Series::JobsStarts),
                    stops: m.couch.get(Series::JobsStops),
                    crashes: m.couch.get(Series::JobsCrashes),
                });
            }
            Who::Couch { stats, .. } => stats,
        };
        let v: Value = http.get(stats).send().await.ok()?.json().await.ok()?;
        let n = |k: &str| v[k]["value"].as_u64();
        Some(Counts {
            starts: n("starts")?,
            stops: n("stops")?,
            crashes: n("crashes")?,
        })
    }
}

/// A scheduler's `couch_replicator.jobs` counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Jobs started.
    pub starts: u64,
    /// Jobs stopped (rotated out, among others).
    pub stops: u64,
    /// Job crashes noticed.
    pub crashes: u64,
}

impl Counts {
    fn since(self, before: Counts) -> Counts {
        Counts {
            starts: self.starts.saturating_sub(before.starts),
            stops: self.stops.saturating_sub(before.stops),
            crashes: self.crashes.saturating_sub(before.crashes),
        }
    }
}

/// Warms up: at least `spec.warm_up`, and until the scheduler has rotated once: CouchDB's
/// own stop counter moved. CouchDB's scheduler takes a new
/// `interval` only after its timer set with the old one (60 s by default) fires, so two short
/// intervals are not enough for it; waiting for a rotation starts both windows in the steady
/// state. Returns the running set.
async fn warm_up(spec: &Spec, who: &Who, http: &reqwest::Client) -> Result<Vec<usize>, String> {
    let warm = Instant::now();
    let counts0 = who.own_counts(http).await;
    let mut prev: Option<HashSet<usize>> = None;
    let mut rotated = !spec.rotates;
    loop {
        if let Some(running) = who.running(http).await {
            let now: HashSet<usize> = running.iter().copied().collect();
            rotated |= match (counts0, who.own_counts(http).await) {
                (Some(c0), Some(c1)) => c1.since(c0).stops > 0,
                _ => prev.is_some_and(|p| p.difference(&now).next().is_some()),
            };
            if warm.elapsed() >= spec.warm_up && rotated && !running.is_empty() {
                return Ok(running);
            }
            prev = Some(now);
        }
        if warm.elapsed() > Duration::from_secs(600) {
            return Err("no rotation of the running jobs after 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn window(spec: &Spec, who: &Who) -> Result<Sampled, String> {
    // Its own client: connections are made (and their tasks spawned) on this thread's runtime.
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| e.to_string())?;
    let mut prev: HashSet<usize> = warm_up(spec, who, &http).await?.into_iter().collect();
    let counts0 = who.own_counts(&http).await;
    let (cpu0, bench0) = (cpu_of(spec.pid), thread_cpu_seconds());
    let t0 = Instant::now();
    let mut out = Sampled {
        running: vec![0; spec.jobs],
        turns: vec![0; spec.jobs],
        ..Sampled::default()
    };
    let (mut conns, mut conn_samples, mut n) = (0usize, 0usize, 0u32);
    let mut probes = Probes::new(spec, t0);
    let mut trace = Trace::new(spec.jobs);
    while t0.elapsed() < spec.window {
        let tick = Instant::now();
        let Some(running) = who.running(&http).await else {
            out.missed += 1;
            tokio::time::sleep(SAMPLE_EVERY.saturating_sub(tick.elapsed())).await;
            continue;
        };
        let now: HashSet<usize> = running.iter().copied().collect();
        out.most_running = out.most_running.max(now.len());
        for &i in &now {
            if let Some(s) = out.running.get_mut(i) {
                *s += 1;
            }
        }
        trace.sample(t0.elapsed(), &prev, &now);
        for &i in now.difference(&prev) {
            out.starts += 1;
            if let Some(t) = out.turns.get_mut(i) {
                *t += 1;
            }
        }
        prev = now;
        if n.is_multiple_of(CONNS_EVERY) {
            conns += connections_to(spec.pid, spec.port);
            conn_samples += 1;
        }
        n += 1;
        probes.step(&http, spec, &running).await?;
        tokio::time::sleep(SAMPLE_EVERY.saturating_sub(tick.elapsed())).await;
    }
    trace.write()?;
    out.bench_cpu_s = thread_cpu_seconds() - bench0;
    out.cpu_s = cpu_of(spec.pid) - cpu0;
    if spec.pid == std::process::id() {
        out.cpu_s -= out.bench_cpu_s;
    }
    out.rss_mb = rss_mb(spec.pid);
    if let (Some(c0), Some(c1)) = (counts0, who.own_counts(&http).await) {
        out.own_counts = Some(c1.since(c0));
    }
    out.connections = conns as f64 / conn_samples.max(1) as f64;
    // The last probe may still wait for its target; its latency counts, its CPU is past the
    // window's end.
    let last_running = who.running(&http).await.unwrap_or_default();
    probes.finish(&last_running, &mut out).await?;
    Ok(out)
}

/// Each job's turns as the samples saw them, written as JSON to the file `BENCH_TRACE`
/// names (when set) for offline study of the rotation: `at` is each sample's time in
/// seconds from the window's start, `turns[i]` job i's turns as [first, past-last) sample
/// numbers (a turn still running at the end has no end).
#[derive(serde::Serialize)]
struct Trace {
    #[serde(skip)]
    path: Option<String>,
    at: Vec<f32>,
    turns: Vec<Vec<Vec<usize>>>,
}

impl Trace {
    fn new(jobs: usize) -> Self {
        let path = std::env::var("BENCH_TRACE").ok();
        let turns = if path.is_some() {
            vec![Vec::new(); jobs]
        } else {
            Vec::new()
        };
        Self {
            path,
            at: Vec::new(),
            turns,
        }
    }

    fn sample(&mut self, at: Duration, prev: &HashSet<usize>, now: &HashSet<usize>) {
        if self.path.is_none() {
            return;
        }
        let n = self.at.len();
        self.at.push(at.as_secs_f32());
        for &i in now.difference(prev) {
            if let Some(t) = self.turns.get_mut(i) {
                t.push(vec![n]);
            }
        }
        for &i in prev.difference(now) {
            if let Some(turn) = self.turns.get_mut(i).and_then(|t| t.last_mut()) {
                turn.push(n);
            }
        }
    }

    fn write(&self) -> Result<(), String> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let json = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{path}: {e}"))
    }
}

/// Latency probes, one at a time, running beside the sampling so that a slow probe does not
/// stop the running set from being read every second.
/// One probe's task: the latency in ms, or `None` when it timed out.
type ProbeTask = JoinHandle<Result<Option<f64>, String>>;

struct Probes {
    every: Duration,
    next: Instant,
    /// Probes in flight: the job probed and its task (`None` when it timed out).
    inflight: Vec<(usize, ProbeTask)>,
    made: usize,
    latencies: Vec<f64>,
    /// The jobs of probes that timed out.
    timed_out: Vec<usize>,
}

impl Probes {
    fn new(spec: &Spec, t0: Instant) -> Self {
        Self {
            every: spec.window / PROBES,
            next: t0,
            inflight: Vec::new(),
            made: 0,
            latencies: Vec::new(),
            timed_out: Vec::new(),
        }
    }

    /// Collects the finished probes; starts the next one on a running job when due (several
    /// may be in flight: one waiting for a job that was rotated out must not hold back the
    /// others).
    async fn step(
        &mut self,
        http: &reqwest::Client,
        spec: &Spec,
        running: &[usize],
    ) -> Result<(), String> {
        self.collect(false).await?;
        if Instant::now() >= self.next && !running.is_empty() {
            let i = running[self.made * 7919 % running.len()];
            let (http, target) = (http.clone(), spec.target.clone());
            self.inflight
                .push((i, tokio::spawn(probe(http, spec.port, target, i))));
            self.made += 1;
            self.next += self.every;
        }
        Ok(())
    }

    /// Collects the finished probes (all of them, waiting, when `all`).
    async fn collect(&mut self, all: bool) -> Result<(), String> {
        let mut left = Vec::new();
        for (i, h) in std::mem::take(&mut self.inflight) {
            if !all && !h.is_finished() {
                left.push((i, h));
                continue;
            }
            match h.await.map_err(|e| format!("probe: {e}"))?? {
                Some(ms) => self.latencies.push(ms),
                None => self.timed_out.push(i),
            }
        }
        self.inflight = left;
        Ok(())
    }

    /// Waits for the probes in flight and fills `out`: a probe that timed out counts as
    /// rotated out when its job does not run at the end (`running`).
    async fn finish(mut self, running: &[usize], out: &mut Sampled) -> Result<(), String> {
        self.collect(true).await?;
        self.latencies.sort_by(f64::total_cmp);
        let running: HashSet<usize> = running.iter().copied().collect();
        let rotated = self
            .timed_out
            .iter()
            .filter(|i| !running.contains(i))
            .count();
        out.probes_rotated_out = rotated;
        out.probe_timeouts = self.timed_out.len() - rotated;
        out.latencies_ms = self.latencies;
        Ok(())
    }
}

/// Updates `d{i}` in the endpoint's source and waits for the new revision in `target`:
/// milliseconds, or `None` after [`PROBE_TIMEOUT`].
async fn probe(
    http: reqwest::Client,
    port: u16,
    target: String,
    i: usize,
) -> Result<Option<f64>, String> {
    let src = url_at(port, &format!("src/d{i}"));
    let doc: Value = http
        .get(&src)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let mut next = doc.clone();
    next["v"] = json!(doc["v"].as_i64().unwrap_or(0) + 1);
    let t0 = Instant::now();
    let put = super::put(&http, &src, next).await?;
    let rev = put["rev"].as_str().unwrap_or_default().to_owned();
    let tgt = url_at(port, &format!("{target}/d{i}"));
    while t0.elapsed() < PROBE_TIMEOUT {
        if let Ok(r) = http.get(&tgt).send().await
            && let Ok(v) = r.json::<Value>().await
            && v["_rev"].as_str() == Some(rev.as_str())
        {
            return Ok(Some(t0.elapsed().as_secs_f64() * 1000.0));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(None)
}
