//! The continuous change-latency measurement of the links bench: our continuous replication
//! runs through the link while a steady writer (on loopback, beside the source) writes one
//! document every `period`; a watcher on the target's `_changes` (also on loopback) notes when
//! each arrives. The latency of a change is its arrival minus the end of its write.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use crate::couch::Couch;

/// Latencies of every change written, sorted (seconds).
pub struct Latencies(pub Vec<f64>);

impl Latencies {
    /// The `q` quantile (0..=1).
    pub fn quantile(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let i = ((self.0.len() as f64 - 1.0) * q).round() as usize;
        self.0[i.min(self.0.len() - 1)]
    }
}

/// Writes `count` documents to `source` one per `period`, and returns how long they took to
/// reach `target` (watched from sequence `now`): all of them, and those after the first
/// `warm_up`.
pub async fn measure(
    http: &reqwest::Client,
    couch: &Couch,
    source: &str,
    target: &str,
    count: usize,
    warm_up: usize,
    period: Duration,
) -> Result<(Latencies, Latencies), String> {
    let feed = http
        .get(couch.url(&format!(
            "{target}/_changes?feed=continuous&since=now&heartbeat=1000"
        )))
        .send()
        .await
        .map_err(|e| format!("target feed: {e}"))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let watcher = tokio::spawn(async move {
        let mut body = feed.bytes_stream();
        let mut buf = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            let now = Instant::now();
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if let Ok(v) = serde_json::from_slice::<Value>(&line)
                    && let Some(id) = v.get("id").and_then(Value::as_str)
                    && tx.send((id.to_owned(), now)).is_err()
                {
                    return;
                }
            }
        }
    });
    let mut written = HashMap::new();
    let mut tick = tokio::time::interval(period);
    for i in 0..count {
        tick.tick().await;
        let id = format!("live{i:06}");
        let r = http
            .put(couch.url(&format!("{source}/{id}")))
            .json(&json!({"kind": "live", "n": i, "text": "x".repeat(250)}))
            .send()
            .await
            .map_err(|e| format!("live write: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("live write: {}", r.status()));
        }
        written.insert(id, Instant::now());
    }
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(30);
    while out.len() < count {
        let left = until.saturating_duration_since(Instant::now());
        let Ok(Some((id, at))) = tokio::time::timeout(left, rx.recv()).await else {
            break;
        };
        if let Some(w) = written.get(&id) {
            out.push((id, at.saturating_duration_since(*w).as_secs_f64()));
        }
    }
    watcher.abort();
    if out.len() < count {
        return Err(format!(
            "only {} of {count} live changes reached the target",
            out.len()
        ));
    }
    let warm = |id: &str| id[4..].parse::<usize>().is_ok_and(|i| i < warm_up);
    let mut all: Vec<f64> = out.iter().map(|(_, l)| *l).collect();
    let mut steady: Vec<f64> = out
        .into_iter()
        .filter(|(id, _)| !warm(id))
        .map(|(_, l)| l)
        .collect();
    all.sort_by(f64::total_cmp);
    steady.sort_by(f64::total_cmp);
    Ok((Latencies(all), Latencies(steady)))
}
