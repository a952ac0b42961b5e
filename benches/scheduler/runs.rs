//! The two runs of the scheduler benchmark (our node in this process, CouchDB's scheduler in a
//! second CouchDB): the jobs both are given, split between two `_replicator` databases in
//! proportion to their shares, and the figures each run's measuring window
//! ([`super::sampler`]) comes to: CPU, RSS, connections, per-job fairness, fair-share error,
//! job starts and latency.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use couch_replicator::jobs::JobsOptions;
use couch_replicator::replicator::job::persistent_job_id;
use couch_replicator::replicator::scheduler::job_server::JobServerMsg;
use couch_replicator::replicator::scheduler::{ShareKey, ShareParams, share_error};
use couch_replicator::replicator::{
    JobKind, NewJob, NodeType, Replicator, ReplicatorConfig, ReplicatorSettings,
};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use serde_json::{Value, json};

use super::peers::{Couch, rss_mb};
use super::sampler::{Counts, SAMPLE_EVERY, Sampled, Spec, Who};

/// The two `_replicator` databases and their shares; [`group`] gives each its share of jobs.
const GROUPS: [(&str, u32); 2] = [("a/_replicator", 100), ("b/_replicator", 900)];

/// What both runs are given.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Continuous jobs.
    pub jobs: usize,
    /// `max_jobs`.
    pub max_jobs: usize,
    /// `max_churn`.
    pub max_churn: usize,
    /// The scheduler interval, seconds.
    pub interval_sec: u64,
    /// The measuring window, seconds.
    pub window_sec: u64,
}

impl Plan {
    /// Seconds for every job to have run once under perfect round-robin: each interval starts
    /// at most min(`max_churn`, `max_jobs`) jobs.
    pub fn rotation_sec(&self) -> u64 {
        let per_interval = self.max_churn.min(self.max_jobs).max(1);
        self.jobs.div_ceil(per_interval) as u64 * self.interval_sec
    }
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// CPU seconds of the scheduler's process over the window (ours: less the bench's
    /// sampling thread).
    pub cpu_s: f64,
    /// CPU seconds of the bench's sampling thread, subtracted from ours.
    pub bench_cpu_s: f64,
    /// Job starts seen in the window.
    pub starts: usize,
    /// Its RSS at the end of the window, MiB.
    pub rss_mb: f64,
    /// Ours only: how much the RSS grew from before the jobs were added to the end of the
    /// window, MiB.
    pub rss_grown_mb: f64,
    /// Mean established connections to the endpoint.
    pub connections: f64,
    /// The most jobs a sample saw running at once.
    pub most_running: usize,
    /// The most over the least sampled job's running samples, over all jobs.
    pub fairness: f64,
    /// Per-job running samples: the least, the 1st percentile, the median, the 99th
    /// percentile and the most (how the fairness ratio's extremes sit against the rest).
    pub spread: [u32; 5],
    /// The same spread of the turns each job was seen starting.
    pub turn_spread: [u32; 5],
    /// The running samples' spread within each `_replicator` database.
    pub group_spreads: [[u32; 5]; 2],
    /// The same for the turns seen per job of each database.
    pub group_turn_spreads: [[u32; 5]; 2],
    /// Jobs never seen running in the window (a fairness of `inf`: how many).
    pub never_ran: usize,
    /// Samples lost because the running set could not be read.
    pub missed: usize,
    /// The scheduler's own job counters over the window.
    pub own_counts: Option<Counts>,
    /// [`share_error`] of the two databases' running samples against 100:900.
    pub share_error: f64,
    /// p50, p90 and p99 of the update-to-target latency, ms (probes that timed out left
    /// out, counted below).
    pub latency_ms: [f64; 3],
    /// p99 of the update-to-target latency, ms.
    pub p99_ms: f64,
    /// Latency probes that measured a latency.
    pub probes: usize,
    /// Probes that timed out while their job ran.
    pub probe_timeouts: usize,
    /// Probes that timed out after their job was rotated out.
    pub probes_rotated_out: usize,
}

/// Job `i`'s database: one job in ten in `a` (100 shares), nine in `b` (900 shares), so
/// every job's fair running time is the same and both databases rotate at the same pace.
fn group(i: usize) -> &'static str {
    if i.is_multiple_of(10) {
        GROUPS[0].0
    } else {
        GROUPS[1].0
    }
}

fn rep_body(endpoint: &Couch, target: &str, i: usize) -> Value {
    json!({
        "source": endpoint.url("src"),
        "target": endpoint.url(target),
        "continuous": true,
        "doc_ids": [format!("d{i}")],
    })
}

fn share_params() -> ShareParams {
    ShareParams {
        shares: GROUPS.iter().map(|(g, s)| ((*g).into(), *s)).collect(),
        ..ShareParams::default()
    }
}

/// Our node on a fresh embedded store in `dir`; `run_jobs` false makes it an `api_frontend`
/// only node, whose jobs stay pending.
async fn our_node(
    dir: &std::path::Path,
    plan: &Plan,
    run_jobs: bool,
) -> Result<Replicator, String> {
    let store = EmbeddedStore::open(dir.join("replicator.redb")).map_err(|e| e.to_string())?;
    let mut settings = ReplicatorSettings {
        max_jobs: plan.max_jobs,
        max_churn: plan.max_churn,
        interval: Duration::from_secs(plan.interval_sec),
        // Half an interval: CouchDB 3.x has no minimum run time, and the jobs a tick starts
        // are a little younger than one interval at the next tick (starting takes time).
        min_run_time: Duration::from_millis(plan.interval_sec * 500),
        shares: share_params().shares,
        ..ReplicatorSettings::default()
    };
    if !run_jobs {
        settings.node_types = vec![NodeType::ApiFrontend];
    }
    Replicator::start(ReplicatorConfig {
        db: Db::new(Arc::new(store)),
        jobs: JobsOptions::default(),
        settings,
        node: "bench".into(),
        server_uuid: "scheduler-bench".into(),
    })
    .await
    .map_err(|e| e.to_string())
}

/// Adds the plan's jobs to `node`; returns job id -> job index.
async fn add_jobs(
    node: &Replicator,
    endpoint: &Couch,
    plan: &Plan,
) -> Result<HashMap<String, usize>, String> {
    let mut index = HashMap::new();
    for i in 0..plan.jobs {
        let (db, doc) = (group(i), format!("r{i}"));
        index.insert(persistent_job_id(db, &doc).into_string(), i);
        let kind = JobKind::Persistent {
            db_name: db.into(),
            doc_id: doc,
        };
        let job = NewJob::from_body(kind, rep_body(endpoint, "tgt_ours", i));
        node.add(job).await.map_err(|e| e.to_string())?;
    }
    Ok(index)
}

/// Memory of a pending job in our process, bytes: the RSS growth of a node that only queues
/// the plan's jobs (an `api_frontend` node: nothing runs them), over the number of jobs.
pub async fn pending_job_bytes(endpoint: &Couch, plan: &Plan) -> Result<f64, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let node = our_node(dir.path(), plan, false).await?;
    let before = rss_mb(std::process::id());
    add_jobs(&node, endpoint, plan).await?;
    let after = rss_mb(std::process::id());
    node.shutdown().await;
    Ok((after - before).max(0.0) * 1024.0 * 1024.0 / plan.jobs as f64)
}

/// Our node in this process.
pub async fn ours(endpoint: &Couch, plan: &Plan) -> Result<Measured, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let node = our_node(dir.path(), plan, true).await?;
    let rss_before = rss_mb(std::process::id());
    let index = add_jobs(&node, endpoint, plan).await?;
    eprintln!("ours: {} jobs added", plan.jobs);
    let server = node
        .tree()
        .which_child::<JobServerMsg>("job_server")
        .ok_or("no job server")?;
    let spec = spec(endpoint, plan, std::process::id(), "tgt_ours");
    let sampled =
        super::sampler::measure(spec, Who::Ours(server, index, node.metrics().clone())).await;
    node.shutdown().await;
    let m = summarize(plan, sampled?);
    Ok(Measured {
        rss_grown_mb: m.rss_mb - rss_before,
        ..m
    })
}

/// CouchDB's own scheduler in `scheduler`, given the same jobs as `_replicator` documents.
pub async fn couchdb(
    http: &reqwest::Client,
    endpoint: &Couch,
    scheduler: &Couch,
    plan: &Plan,
) -> Result<Measured, String> {
    let config = [
        ("replicator/max_jobs", plan.max_jobs.to_string()),
        ("replicator/max_churn", plan.max_churn.to_string()),
        (
            "replicator/interval",
            (plan.interval_sec * 1000).to_string(),
        ),
    ];
    for (key, value) in config {
        let url = scheduler.url(&format!("_node/_local/_config/{key}"));
        super::put(http, &url, json!(value)).await?;
    }
    for (g, shares) in GROUPS {
        let db = g.replace('/', "%2F");
        let url = scheduler.url(&format!("_node/_local/_config/replicator.shares/{db}"));
        super::put(http, &url, json!(shares.to_string())).await?;
        super::put(http, &scheduler.url(&db), json!({})).await?;
        let docs: Vec<Value> = (0..plan.jobs)
            .filter(|i| group(*i) == g)
            .map(|i| {
                let mut d = rep_body(endpoint, "tgt_couch", i);
                d["_id"] = json!(format!("r{i}"));
                d
            })
            .collect();
        for chunk in docs.chunks(1000) {
            let r = http
                .post(scheduler.url(&format!("{db}/_bulk_docs")))
                .json(&json!({ "docs": chunk }))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !r.status().is_success() {
                return Err(format!("_replicator _bulk_docs: {}", r.status()));
            }
        }
    }
    eprintln!("couchdb: {} documents added", plan.jobs);
    let spec = spec(endpoint, plan, scheduler.beam, "tgt_couch");
    let who = Who::Couch {
        tasks: scheduler.url("_active_tasks"),
        stats: scheduler.url("_node/_local/_stats/couch_replicator/jobs"),
    };
    Ok(summarize(plan, super::sampler::measure(spec, who).await?))
}

fn spec(endpoint: &Couch, plan: &Plan, pid: u32, target: &str) -> Spec {
    Spec {
        jobs: plan.jobs,
        // A nominal rotation at least: every job's first turn costs more than the later
        // ones (its first document and checkpoints) and the first rotation's order is the
        // order the jobs were added in, so the window starts once that has passed.
        warm_up: Duration::from_secs(plan.rotation_sec().max(2 * plan.interval_sec)),
        rotates: plan.jobs > plan.max_jobs,
        window: Duration::from_secs(plan.window_sec),
        pid,
        port: endpoint.port,
        target: target.into(),
    }
}

/// One run's figures from its window's samples.
fn summarize(plan: &Plan, s: Sampled) -> Measured {
    let mut ran: BTreeMap<ShareKey, Duration> = BTreeMap::new();
    for (g, _) in GROUPS {
        let total: u32 = (0..plan.jobs)
            .filter(|i| group(*i) == g)
            .map(|i| s.running[i])
            .sum();
        ran.insert(ShareKey::Db(g.into()), SAMPLE_EVERY * total);
    }
    let max = s.running.iter().copied().max().unwrap_or(0);
    let min = s.running.iter().copied().min().unwrap_or(0);
    let fairness = if min == 0 {
        f64::INFINITY
    } else {
        f64::from(max) / f64::from(min)
    };
    let spread = spread_of(&s.running);
    let turn_spread = spread_of(&s.turns);
    let per_group = |per_job: &[u32]| {
        GROUPS.map(|(g, _)| {
            let v: Vec<u32> = (0..plan.jobs)
                .filter(|i| group(*i) == g)
                .map(|i| per_job[i])
                .collect();
            spread_of(&v)
        })
    };
    let group_spreads = per_group(&s.running);
    let group_turn_spreads = per_group(&s.turns);
    let lat = &s.latencies_ms;
    let pct = |p: usize| {
        lat.get((lat.len() * p).div_ceil(100).saturating_sub(1))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let p99 = pct(99);
    Measured {
        cpu_s: s.cpu_s,
        bench_cpu_s: s.bench_cpu_s,
        starts: s.starts,
        rss_mb: s.rss_mb,
        rss_grown_mb: 0.0,
        connections: s.connections,
        most_running: s.most_running,
        fairness,
        spread,
        turn_spread,
        group_spreads,
        group_turn_spreads,
        share_error: share_error(&share_params(), &ran),
        latency_ms: [pct(50), pct(90), p99],
        p99_ms: p99,
        probes: lat.len(),
        probe_timeouts: s.probe_timeouts,
        probes_rotated_out: s.probes_rotated_out,
        never_ran: s.running.iter().filter(|r| **r == 0).count(),
        missed: s.missed,
        own_counts: s.own_counts,
    }
}

/// The least, 1st percentile, median, 99th percentile and most of `v`.
fn spread_of(v: &[u32]) -> [u32; 5] {
    let mut sorted = v.to_vec();
    sorted.sort_unstable();
    let at = |q: usize| {
        sorted
            .get((sorted.len() * q / 100).min(sorted.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    [
        at(0),
        at(1),
        at(50),
        at(99),
        sorted.last().copied().unwrap_or(0),
    ]
}
