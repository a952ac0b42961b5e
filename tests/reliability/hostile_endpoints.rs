//! Bounded against any endpoint (RELIABILITY.md "Hostile endpoints"): a real `serve` process
//! runs one continuous replication per stage of the protocol against an endpoint that turns
//! hostile at that stage (`support::hostile`), all at once, plus a healthy replication between
//! two pouchdb-servers. For each kind of hostility: the node's peak RSS stays within 64 MiB of
//! its idle RSS, every hostile job reports the cause in `_scheduler/jobs`, the healthy
//! replication completes with every document, and a `_bulk_get` answer past the caps costs
//! only that request (the revision is fetched alone and written).

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::couch::{Couch, numbered_docs};
use crate::support::hostile::{Hostile, Kind, Stage, db_name};
use crate::support::serve::{ServeProcess, spawn_serve_with};
use crate::support::server::PouchServer;
use crate::support::{deadline, wait_for};

const ADMIN: (&str, &str) = ("admin", "hostile-secret");

/// The `_replicator` database (on the pouchdb-server) holding the hostile jobs.
const REPDB: &str = "jobs_replicator";

/// The most the node's RSS may grow over idle while the hostile endpoint does its worst.
const RSS_BUDGET_KIB: u64 = 64 << 10;

struct Rig {
    node: ServeProcess,
    http: reqwest::Client,
    pouch: PouchServer,
    couch: Couch,
    hostile: Hostile,
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn start() -> Rig {
        let pouch = PouchServer::start().await;
        let couch = Couch::new(&pouch.root());
        couch.create_db(REPDB).await;
        let (dir, node) = spawn_serve_with(&format!(
            "[admins]\n{} = {}\n[replicator]\ninterval_sec = 1\nstartup_jitter = 0\n\
             connection_timeout = 3000\nretries_per_request = 2\ncompress_loopback = true\n\
             [replicator_dbs]\njobs_replicator = {}\n",
            ADMIN.0,
            ADMIN.1,
            pouch.db_url(REPDB)
        ))
        .await;
        Rig {
            node,
            http: reqwest::Client::new(),
            pouch,
            couch,
            hostile: Hostile::start().await,
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.node.child.id().unwrap_or(0)
    }

    async fn call(&self, m: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self
            .http
            .request(m, format!("{}/{path}", self.node.base))
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .timeout(Duration::from_secs(120));
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.expect("request to the node");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A one-shot replication between two pouchdb databases of `n` documents; asserts the
    /// target then holds them all.
    async fn healthy_copy(&self, name: &str, n: usize) {
        self.couch.create_db(name).await;
        self.couch.bulk_insert(name, &numbered_docs(name, n)).await;
        let target = format!("{name}-copy");
        let (s, v) = self
            .call(
                reqwest::Method::POST,
                "_replicate",
                Some(json!({"source": self.pouch.db_url(name),
                    "target": self.pouch.db_url(&target), "create_target": true})),
            )
            .await;
        assert_eq!(s, 200, "healthy replication {name}: {v}");
        let (_, info) = self.couch.db_info(&target).await;
        assert_eq!(
            info["doc_count"],
            json!(n),
            "healthy target {target}: {info}"
        );
    }

    /// Adds one continuous replication per stage as a `_replicator` document named after its
    /// hostile database, hostile in the way of `kind`.
    async fn start_hostile_jobs(&self, kind: Kind) {
        self.couch.create_db("plain").await;
        self.couch
            .bulk_insert("plain", &numbered_docs("plain", 1))
            .await;
        for stage in Stage::ALL {
            let hostile = self.hostile.db_url(&db_name(stage, kind));
            let (source, target) = if stage.is_target() {
                (self.pouch.db_url("plain"), hostile)
            } else if stage == Stage::Attachment {
                (hostile, self.hostile.db_url("tgt-attachment"))
            } else {
                (hostile, self.pouch.db_url(&format!("tgt-{}", stage.name())))
            };
            let doc = json!({"source": source, "target": target,
                "continuous": true, "create_target": true});
            let (s, v) = self.couch.put_doc(REPDB, &db_name(stage, kind), &doc).await;
            assert_eq!(s, 201, "{stage:?}: {v}");
        }
    }

    /// The job's `_scheduler/docs` entry once it is `crashing` with a reason holding one of
    /// `want`, and its `_scheduler/jobs` entry then.
    async fn crashing_with(&self, doc_id: &str, want: &[&str]) -> Option<(Value, Value)> {
        let (_, doc) = self
            .call(
                reqwest::Method::GET,
                &format!("_scheduler/docs/{REPDB}/{doc_id}"),
                None,
            )
            .await;
        let error = doc["info"]["error"].as_str().unwrap_or("");
        if doc["state"] != "crashing" || !want.iter().any(|w| error.contains(w)) {
            return None;
        }
        let id = doc["id"].as_str()?;
        let (_, job) = self
            .call(reqwest::Method::GET, &format!("_scheduler/jobs/{id}"), None)
            .await;
        Some((doc, job))
    }
}

/// What the job hostile at `stage` must report for `kind`.
fn expected(stage: Stage, kind: Kind) -> &'static [&'static str] {
    match kind {
        // Inside a multipart answer, endless part headers are bytes held unread.
        Kind::EndlessHeaders if stage == Stage::Attachment => &["endpoint_response_too_large"],
        Kind::Huge | Kind::GzipBomb | Kind::LyingLength => &["endpoint_response_too_large"],
        Kind::Trickle => &["endpoint_response_too_slow"],
        Kind::EndlessHeaders => &["http_request_failed"],
        Kind::RedirectLoop => &["redirects"],
        Kind::InvalidUtf8 | Kind::DeepJson => &["bad_response", "invalid", "recursion"],
    }
}

async fn hostile_endpoint_costs_only_its_jobs(kind: Kind) {
    deadline(240, &format!("hostile endpoint, {kind:?}"), async {
        let rig = Rig::start().await;
        rig.healthy_copy("warmup", 20).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let idle = crate::support::proc_status_kib(rig.pid(), "VmRSS:");
        assert!(idle > 0, "cannot read the node's RSS");
        rig.start_hostile_jobs(kind).await;
        rig.healthy_copy("healthy", 200).await;
        for stage in Stage::ALL {
            if stage == Stage::BulkGet {
                continue;
            }
            if (stage, kind) == (Stage::Attachment, Kind::DeepJson) {
                // Valid JSON, only deep: nothing in a copy needs its depth, so it is copied.
                let db = "tgt-attachment";
                let what = "the deeply nested document with its attachment copied";
                wait_for(60, what, || async {
                    (rig.hostile.written(db) > 0).then_some(())
                })
                .await;
                continue;
            }
            let db = db_name(stage, kind);
            let want = expected(stage, kind);
            let what = format!("{stage:?} hostile with {kind:?} crashing with {want:?}");
            let (doc, job) = wait_for(150, &what, || rig.crashing_with(&db, want)).await;
            // The reason names the endpoint, never with credentials, and the job's history
            // has the crash.
            let error = doc["info"]["error"].as_str().unwrap_or("");
            assert!(
                error.contains(&db),
                "{stage:?}: the reason names no endpoint: {error}"
            );
            assert!(
                job["history"]
                    .as_array()
                    .is_some_and(|h| h.iter().any(|e| e["type"] == "crashed")),
                "{stage:?}: {job}"
            );
        }
        // A `_bulk_get` answer past the caps is given up for single fetches: the document
        // still arrives.
        wait_for(
            120,
            "doc1 through single fetches after _bulk_get",
            || async {
                let (s, _) = rig.couch.get_doc("tgt-bulkget", "doc1").await;
                (s == 200).then_some(())
            },
        )
        .await;
        let peak = crate::support::proc_status_kib(rig.pid(), "VmHWM:");
        assert!(
            peak.saturating_sub(idle) <= RSS_BUDGET_KIB,
            "{kind:?}: the node grew from {idle} KiB idle to a peak of {peak} KiB"
        );
        // The node is still whole: a last healthy copy.
        rig.healthy_copy("after", 50).await;
        eprintln!("{kind:?}: idle {idle} KiB, peak {peak} KiB");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_several_gib_are_cut_at_the_cap() {
    hostile_endpoint_costs_only_its_jobs(Kind::Huge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_bomb_is_cut_at_the_cap_of_decoded_bytes() {
    hostile_endpoint_costs_only_its_jobs(Kind::GzipBomb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_ends_at_its_deadline() {
    hostile_endpoint_costs_only_its_jobs(Kind::Trickle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_content_length_is_refused_before_reading() {
    hostile_endpoint_costs_only_its_jobs(Kind::LyingLength).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_headers_are_refused() {
    hostile_endpoint_costs_only_its_jobs(Kind::EndlessHeaders).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_loop_ends() {
    hostile_endpoint_costs_only_its_jobs(Kind::RedirectLoop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_is_a_bad_response() {
    hostile_endpoint_costs_only_its_jobs(Kind::InvalidUtf8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_nested_100000_deep_is_a_bad_response() {
    hostile_endpoint_costs_only_its_jobs(Kind::DeepJson).await;
}
