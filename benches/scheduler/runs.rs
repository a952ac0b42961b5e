//! The two runs of the scheduler benchmark (our node in this process, CouchDB's scheduler in a
//! second CouchDB) and the measuring window they share: which jobs run (sampled every 2 s),
//! connections to the endpoint, CPU and RSS of the scheduler's process, and update-to-target
//! latency probes on running jobs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_replicator::jobs::JobsOptions;
use couch_replicator::replicator::job_server::JobServerMsg;
use couch_replicator::replicator::rep_job::persistent_job_id;
use couch_replicator::replicator::share::{ShareKey, ShareParams, share_error};
use couch_replicator::replicator::{
    JobKind, NewJob, NodeType, Replicator, ReplicatorConfig, ReplicatorSettings,
};
use couch_replicator::store::Db;
use couch_replicator::store::embedded::EmbeddedStore;
use ractor::ActorRef;
use serde_json::{Value, json};

use super::measure::{proc_cpu_seconds, self_cpu_seconds};
use super::peers::{Couch, connections_to, rss_mb};

const SAMPLE_EVERY: Duration = Duration::from_secs(2);
const PROBES: u32 = 20;
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// One run's figures.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// CPU seconds of the scheduler's process over the window.
    pub cpu_s: f64,
    /// Its RSS at the end of the window, MiB.
    pub rss_mb: f64,
    /// Ours only: how much the RSS grew from before the jobs were added to the end of the
    /// window, MiB.
    pub rss_grown_mb: f64,
    /// Mean established connections to the endpoint.
    pub connections: f64,
    /// Worst, over the two databases, of the most over the least sampled job's running samples.
    pub fairness: f64,
    /// [`share_error`] of the two databases' running samples against 100:900.
    pub share_error: f64,
    /// p99 of the update-to-target latency, ms.
    pub p99_ms: f64,
    /// Latency probes made.
    pub probes: usize,
}

fn group(i: usize) -> &'static str {
    if i.is_multiple_of(2) {
        "a/_replicator"
    } else {
        "b/_replicator"
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
        shares: BTreeMap::from([("a/_replicator".into(), 100), ("b/_replicator".into(), 900)]),
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
        min_run_time: Duration::from_secs(plan.interval_sec),
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
        index.insert(persistent_job_id(db, &doc), i);
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
pub async fn ours(
    http: &reqwest::Client,
    endpoint: &Couch,
    plan: &Plan,
) -> Result<Measured, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let node = our_node(dir.path(), plan, true).await?;
    let rss_before = rss_mb(std::process::id());
    let index = add_jobs(&node, endpoint, plan).await?;
    eprintln!("ours: {} jobs added", plan.jobs);
    let server = node
        .tree()
        .which_child::<JobServerMsg>("job_server")
        .ok_or("no job server")?;
    let who = Who::Ours(server, index);
    let m = window(http, endpoint, plan, &who, std::process::id(), "tgt_ours").await;
    node.shutdown().await;
    m.map(|m| Measured {
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
        ("replicator.shares/a%2F_replicator", "100".into()),
        ("replicator.shares/b%2F_replicator", "900".into()),
    ];
    for (key, value) in config {
        let url = scheduler.url(&format!("_node/_local/_config/{key}"));
        super::put(http, &url, json!(value)).await?;
    }
    for db in ["a%2F_replicator", "b%2F_replicator"] {
        super::put(http, &scheduler.url(db), json!({})).await?;
        let parity = usize::from(db.starts_with('b'));
        let docs: Vec<Value> = (0..plan.jobs)
            .filter(|i| i % 2 == parity)
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
    let who = Who::Couch(scheduler.url("_active_tasks"));
    window(http, endpoint, plan, &who, scheduler.beam, "tgt_couch").await
}

/// Where the running jobs are read.
enum Who {
    Ours(ActorRef<JobServerMsg>, HashMap<String, usize>),
    Couch(String),
}

impl Who {
    async fn running(&self, http: &reqwest::Client) -> Vec<usize> {
        match self {
            Who::Ours(server, index) => supervisors::observe(server)
                .await
                .map(|o| {
                    o.jobs
                        .iter()
                        .filter_map(|j| index.get(&j.job_id).copied())
                        .collect()
                })
                .unwrap_or_default(),
            Who::Couch(url) => {
                let Ok(r) = http.get(url).send().await else {
                    return Vec::new();
                };
                let tasks: Vec<Value> = r.json().await.unwrap_or_default();
                tasks
                    .iter()
                    .filter_map(|t| t.get("doc_id")?.as_str()?.strip_prefix('r')?.parse().ok())
                    .collect()
            }
        }
    }
}

fn cpu_of(pid: u32) -> f64 {
    if pid == std::process::id() {
        self_cpu_seconds()
    } else {
        proc_cpu_seconds(pid).unwrap_or(0.0)
    }
}

async fn window(
    http: &reqwest::Client,
    endpoint: &Couch,
    plan: &Plan,
    who: &Who,
    pid: u32,
    target: &str,
) -> Result<Measured, String> {
    // Warm up: two intervals, and at least one job running.
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs(2 * plan.interval_sec)
        || who.running(http).await.is_empty()
    {
        if warm.elapsed() > Duration::from_secs(600) {
            return Err("no job running after 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let window = Duration::from_secs(plan.window_sec);
    let cpu0 = cpu_of(pid);
    let t0 = Instant::now();
    let mut samples = vec![0u32; plan.jobs];
    let (mut conns, mut n_samples) = (0usize, 0usize);
    let mut latencies: Vec<f64> = Vec::new();
    let probe_every = window / PROBES;
    let mut next_probe = t0;
    while t0.elapsed() < window {
        let tick = Instant::now();
        let running = who.running(http).await;
        for &i in &running {
            if let Some(s) = samples.get_mut(i) {
                *s += 1;
            }
        }
        conns += connections_to(pid, endpoint.port);
        n_samples += 1;
        if Instant::now() >= next_probe && !running.is_empty() {
            let i = running[latencies.len() * 7919 % running.len()];
            latencies.push(probe(http, endpoint, target, i).await?);
            next_probe += probe_every;
        }
        tokio::time::sleep(SAMPLE_EVERY.saturating_sub(tick.elapsed())).await;
    }
    let cpu_s = cpu_of(pid) - cpu0;
    let mut ran: BTreeMap<ShareKey, Duration> = BTreeMap::new();
    let mut fairness: f64 = 1.0;
    for g in ["a/_replicator", "b/_replicator"] {
        let mine: Vec<u32> = (0..plan.jobs)
            .filter(|i| group(*i) == g)
            .map(|i| samples[i])
            .collect();
        let total: u32 = mine.iter().sum();
        ran.insert(ShareKey::Db(g.into()), SAMPLE_EVERY * total);
        let (max, min) = (
            mine.iter().copied().max().unwrap_or(0),
            mine.iter().copied().min().unwrap_or(0),
        );
        let f = if min == 0 {
            f64::INFINITY
        } else {
            f64::from(max) / f64::from(min)
        };
        fairness = fairness.max(f);
    }
    latencies.sort_by(f64::total_cmp);
    let p99 = latencies
        .get((latencies.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(f64::NAN);
    Ok(Measured {
        cpu_s,
        rss_mb: rss_mb(pid),
        rss_grown_mb: 0.0,
        connections: conns as f64 / n_samples.max(1) as f64,
        fairness,
        share_error: share_error(&share_params(), &ran),
        p99_ms: p99,
        probes: latencies.len(),
    })
}

/// Updates `d{i}` in the source and waits for the new revision in `target`: milliseconds.
async fn probe(
    http: &reqwest::Client,
    endpoint: &Couch,
    target: &str,
    i: usize,
) -> Result<f64, String> {
    let src = endpoint.url(&format!("src/d{i}"));
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
    let put = super::put(http, &src, next).await?;
    let rev = put["rev"].as_str().unwrap_or_default().to_owned();
    let tgt = endpoint.url(&format!("{target}/d{i}"));
    while t0.elapsed() < PROBE_TIMEOUT {
        if let Ok(r) = http.get(&tgt).send().await
            && let Ok(v) = r.json::<Value>().await
            && v["_rev"].as_str() == Some(rev.as_str())
        {
            return Ok(t0.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(PROBE_TIMEOUT.as_secs_f64() * 1000.0)
}
