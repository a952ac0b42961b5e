//! Operators' metrics: CouchDB 3.4's `couch_replicator` series at `/_node/_local/_prometheus`
//! and `/metrics` with CouchDB's names, types and help texts (the list recorded from a real
//! CouchDB 3.4.3 in `tests/fixtures/couchdb-replicator-prometheus.tsv`), the stats JSON in
//! CouchDB's shape (recorded fixture, and a live CouchDB when `COUCHDB_PEER_SCRIPT` is set),
//! and the counters moving as they should through 5xx retries injected by the fault proxy.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::couchdb::CouchPeer;
use crate::support::http::{ADMIN, BOB, Node, Pouch};
use crate::support::proxy::{Fault, FaultProxy, Rule};
use couch_replicator::http::HttpConfig;
use couch_replicator::telemetry::{NodeMetrics, Series};
use reqwest::Method;
use serde_json::{Value, json};

const REFERENCE: &str = include_str!("../fixtures/couchdb-replicator-prometheus.tsv");
const STATS_FIXTURE: &str = include_str!("../fixtures/couchdb-replicator-stats.json");

/// `(name, type, help)` rows of the reference list.
fn reference() -> Vec<(String, String, String)> {
    REFERENCE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 3, "bad reference line {l:?}");
            (f[0].to_owned(), f[1].to_owned(), f[2].to_owned())
        })
        .collect()
}

/// Family name → (type, help) and sample name (with labels) → value of a Prometheus text.
struct Scrape {
    families: BTreeMap<String, (String, String)>,
    samples: BTreeMap<String, f64>,
}

fn parse(text: &str) -> Scrape {
    let mut families: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            families.entry(name.to_owned()).or_default().1 = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap();
            families.entry(name.to_owned()).or_default().0 = ty.to_owned();
        } else if !line.is_empty() {
            let (name, value) = line.rsplit_once(' ').unwrap();
            samples.insert(name.to_owned(), value.parse().unwrap());
        }
    }
    Scrape { families, samples }
}

async fn text(node: &Node, path: &str, who: Option<(&str, &str)>) -> (u16, String) {
    let mut r = node.client.get(format!("{}{path}", node.base));
    if let Some((u, p)) = who {
        r = r.basic_auth(u, Some(p));
    }
    let resp = r.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_couchdb_series_is_served_with_its_name_type_and_help() {
    crate::support::deadline(60, "the metrics checks", async {
        let node = Node::frontend(HttpConfig::default()).await;
        let reference = reference();
        assert_eq!(
            reference.len(),
            36,
            "CouchDB 3.4.3 lists 36 replicator series"
        );
        for path in ["/_node/_local/_prometheus", "/metrics"] {
            let (status, body) = text(&node, path, Some(ADMIN)).await;
            assert_eq!(status, 200, "{path}: {body}");
            let scrape = parse(&body);
            for (name, ty, help) in &reference {
                let Some((our_ty, our_help)) = scrape.families.get(name) else {
                    panic!("{path}: {name} is missing");
                };
                assert_eq!(our_ty, ty, "{path}: type of {name}");
                assert_eq!(our_help, help, "{path}: help of {name}");
                assert!(
                    scrape.samples.contains_key(name),
                    "{path}: no sample of {name}"
                );
            }
            // Our own series are there too, with bounded labels.
            for ours in [
                "couch_replicator_docs_written_total",
                "couch_replicator_job_changes_pending_max",
                "couch_replicator_store_commit_seconds",
                "couch_jobs_pending",
            ] {
                assert!(
                    scrape.families.contains_key(ours),
                    "{path}: {ours} is missing"
                );
            }
        }
        // The node's name works like `_local`; others are unknown; only admins may read.
        let named = format!("/_node/{}/_prometheus", node.replicator.node());
        assert_eq!(text(&node, &named, Some(ADMIN)).await.0, 200);
        assert_eq!(
            text(&node, "/_node/other@x/_prometheus", Some(ADMIN))
                .await
                .0,
            404
        );
        assert_eq!(text(&node, "/_node/_local/_prometheus", None).await.0, 401);
        assert_eq!(
            text(&node, "/_node/_local/_prometheus", Some(BOB)).await.0,
            403
        );
    })
    .await;
}

/// Leaf path → (type, desc) of a stats JSON tree.
fn leaves(v: &Value, prefix: &str, out: &mut BTreeMap<String, (String, String)>) {
    let Some(m) = v.as_object() else {
        panic!("{prefix}: not an object: {v}");
    };
    if m.contains_key("value") && m.contains_key("type") {
        assert!(m["value"].is_u64(), "{prefix}: value {v}");
        out.insert(
            prefix.to_owned(),
            (
                m["type"].as_str().unwrap().to_owned(),
                m["desc"].as_str().unwrap().to_owned(),
            ),
        );
        return;
    }
    for (k, child) in m {
        leaves(child, &format!("{prefix}/{k}"), out);
    }
}

fn shape(v: &Value) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    leaves(v, "", &mut out);
    out
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_json_has_couchdbs_shape() {
    crate::support::deadline(180, "the stats JSON checks", async {
        let node = Node::frontend(HttpConfig::default()).await;
        let (s, ours) = node
            .get("/_node/_local/_stats/couch_replicator", Some(ADMIN))
            .await;
        assert_eq!(s, 200, "{ours}");
        let recorded: Value = serde_json::from_str(STATS_FIXTURE).unwrap();
        assert_eq!(shape(&ours), shape(&recorded));
        assert_eq!(shape(&ours).len(), 36);

        let (_, all) = node.get("/_node/_local/_stats", Some(ADMIN)).await;
        assert_eq!(all["couch_replicator"], ours);
        let (_, leaf) = node
            .get(
                "/_node/_local/_stats/couch_replicator/jobs/adds",
                Some(ADMIN),
            )
            .await;
        assert_eq!(leaf["type"], "counter", "{leaf}");
        let (s, none) = node
            .get("/_node/_local/_stats/couch_replicator/nothing", Some(ADMIN))
            .await;
        assert_eq!((s, none), (200, Value::Null));
        assert_eq!(node.get("/_node/_local/_stats", None).await.0, 401);

        // The live oracle, when one is configured.
        let Some(peer) = CouchPeer::start("stats_json_has_couchdbs_shape", None) else {
            return;
        };
        let real: Value = reqwest::Client::new()
            .get(format!(
                "{}/_node/_local/_stats/couch_replicator",
                peer.admin_url()
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            shape(&ours),
            shape(&real),
            "our shape differs from CouchDB 3.4.3's"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_follow_a_replication_through_5xx_retries() {
    crate::support::deadline(120, "a replication through 5xx faults", async {
        let pouch = Pouch::start().await;
        let couch = Couch::new(&format!("{}/", pouch.url));
        couch.create_db("s").await;
        couch.bulk_insert("s", &numbered_docs("d", 20)).await;
        // Existing, so the job asks it `_revs_diff` (where the faults are); a created one is not asked.
        couch.create_db("t").await;
        let proxy = FaultProxy::start(&format!("{}/", pouch.url)).await;
        proxy.add(Rule::new(
            Some(Method::POST),
            "/t/_revs_diff",
            2,
            Fault::Status(502),
        ));
        let node = Node::start(HttpConfig {
            completion_timeout: Duration::from_secs(90),
            ..HttpConfig::default()
        })
        .await;
        let body = json!({"source": pouch.db("s"), "target": proxy.db_url("t"),
                          "create_target": true});
        let (s, r) = node
            .post("/_replicate", Some(ADMIN), &body.to_string())
            .await;
        assert_eq!(s, 200, "{r}");
        assert_eq!(proxy.fired(), vec![2]);

        let m: &NodeMetrics = node.replicator.metrics();
        let c = |s: Series| m.couch.get(s);
        assert_eq!(c(Series::ResponsesFailure), 2, "the two 502s");
        assert_eq!(
            m.request_retries.load(std::sync::atomic::Ordering::Relaxed),
            2
        );
        // Every attempt got exactly one outcome.
        assert_eq!(
            c(Series::Requests),
            c(Series::ResponsesSuccess)
                + c(Series::ResponsesFailure)
                + c(Series::StreamResponsesSuccess)
                + c(Series::StreamResponsesFailure)
                + c(Series::ConnectionWorkerCrashes)
        );
        assert!(c(Series::CheckpointsSuccess) >= 1);
        assert_eq!(c(Series::CheckpointsFailure), 0);
        assert_eq!(c(Series::JobsAdds), 1);
        assert_eq!(c(Series::JobsStarts), 1);
        assert_eq!(c(Series::JobsCrashes), 0);
        assert!(c(Series::WorkersStarted) >= 1);
        assert_eq!(c(Series::WorkerDeaths), 0);
        assert!(c(Series::ConnectionCreates) >= 2);
        assert!(c(Series::ConnectionAcquires) >= 2);

        // The same numbers over HTTP.
        let (_, body) = text(&node, "/_node/_local/_prometheus", Some(ADMIN)).await;
        let scrape = parse(&body);
        let v = |n: &str| scrape.samples.get(n).copied().unwrap_or(-1.0);
        assert_eq!(v("couchdb_couch_replicator_responses_failure_total"), 2.0);
        assert_eq!(v("couch_replicator_docs_written_total"), 20.0);
        assert_eq!(v("couch_replicator_revisions_checked_total"), 20.0);
        assert_eq!(v("couch_replicator_request_retries_total"), 2.0);
        assert!(v("couch_replicator_store_commit_seconds_count") > 0.0);
        // Queue depths come from the job server's census, taken soon after the job ended.
        let pending = "couch_jobs_pending{type=\"rep_jobs\"}";
        let mut depth = v(pending);
        for _ in 0..100 {
            if depth == 0.0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let (_, body) = text(&node, "/_node/_local/_prometheus", Some(ADMIN)).await;
            depth = parse(&body).samples.get(pending).copied().unwrap_or(-1.0);
        }
        assert_eq!(depth, 0.0);
        let (_, stats) = node
            .get(
                "/_node/_local/_stats/couch_replicator/responses",
                Some(ADMIN),
            )
            .await;
        assert_eq!(stats["failure"]["value"], 2, "{stats}");
    })
    .await;
}

/// A scrape reads no job (issue 39): with 10,000 jobs stored, `/metrics` shows their count
/// from the last census, and twenty scrapes read fewer job rows than two scans would (before,
/// each scrape read all 10,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_reads_no_job_rows() {
    use couch_replicator::replicator::scheduler::census;
    use couch_replicator::replicator::{JobKind, NewJob};
    crate::support::deadline(300, "a scrape over 10,000 jobs", async {
        // A frontend: the jobs stay pending, nothing runs them. Its census runs after each
        // add and otherwise once an hour, so nothing but the scrapes could read jobs below.
        let settings = couch_replicator::replicator::ReplicatorSettings {
            node_types: vec![couch_replicator::replicator::NodeType::ApiFrontend],
            interval: Duration::from_secs(3600),
            ..crate::support::http::fast_settings()
        };
        let node = Node::with_settings(HttpConfig::default(), settings).await;
        let rep = node.replicator.clone();
        const JOBS: u64 = 10_000;
        let adds = futures::stream::iter(0..JOBS).map(|i| {
            let rep = rep.clone();
            async move {
                rep.add(NewJob::from_body(
                    JobKind::Transient { user: None },
                    json!({"source": "http://127.0.0.1:9/s",
                           "target": format!("http://127.0.0.1:9/t{i}"), "continuous": true}),
                ))
                .await
                .unwrap();
            }
        });
        use futures::StreamExt;
        adds.buffer_unordered(16).collect::<Vec<()>>().await;
        let total = |body: &str| {
            parse(body)
                .samples
                .get("couch_replicator_jobs_total")
                .copied()
        };
        let mut body = String::new();
        for _ in 0..300 {
            body = text(&node, "/metrics", None).await.1;
            if total(&body) == Some(JOBS as f64) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            total(&body),
            Some(JOBS as f64),
            "the census counts every job"
        );
        // The censuses the adds asked for are done once the count of rows read stops moving:
        // nothing more is due for an hour.
        loop {
            let seen = rep.jobs().rows_listed();
            tokio::time::sleep(census::MIN_GAP + Duration::from_secs(1)).await;
            if rep.jobs().rows_listed() == seen {
                break;
            }
        }
        let age = parse(&body).samples["couch_replicator_jobs_census_age_seconds"];
        assert!((0.0..10.0).contains(&age), "census age {age}");
        let before = rep.jobs().rows_listed();
        for _ in 0..20 {
            let (status, b) = text(&node, "/metrics", None).await;
            assert_eq!(status, 200);
            assert_eq!(total(&b), Some(JOBS as f64));
        }
        let read = rep.jobs().rows_listed() - before;
        // Twenty scrapes that scanned would have read 200,000.
        assert_eq!(read, 0, "20 scrapes read {read} job rows");
    })
    .await;
}
