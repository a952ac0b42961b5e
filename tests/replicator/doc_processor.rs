//! The doc processor against a real pouchdb-server holding a `jobs_replicator` database (the
//! server runs its own replicator on `_replicator`, so that name is avoided): new,
//! edited, invalid and deleted documents, a deleted database, and the terminal-state writer
//! (including conflicts).

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use crate::support::http::{Node, Pouch};
use couch_replicator::replication::Endpoint;
use couch_replicator::replication::http::client::{ClientConfig, HttpClient};
use couch_replicator::replication::pipeline::stats::CouchStats;
use couch_replicator::replicator::replicator_db::doc_processor::{
    DocProcessor, DocProcessorConfig, DocStats, ReplicatorDb, Terminal, write_state,
};
use couch_replicator::replicator::{JobId, RepState, Replicator};
use serde_json::{Value, json};

fn fast(dbs: Vec<ReplicatorDb>) -> DocProcessorConfig {
    DocProcessorConfig {
        dbs,
        poll_timeout: Duration::from_millis(500),
        retry_delay: Duration::from_millis(200),
        rescan_interval: Duration::from_millis(300),
        ..DocProcessorConfig::default()
    }
}

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..200 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn job_state(rep: &Replicator, id: &str) -> Option<RepState> {
    rep.get(JobId::from(id)).await.ok().map(|j| j.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_become_jobs_and_bad_ones_fail() {
    deadline(90, "documents become jobs and bad ones fail", async {
        let pouch = Pouch::start().await;
        pouch.put("jobs_replicator", json!({})).await;
        let node = Node::start(Default::default()).await;
        let rep = node.replicator.clone();
        let src = pouch.db("src");
        let good = json!({"source": src, "target": pouch.db("tgt"), "continuous": true});
        pouch.put("jobs_replicator/good", good.clone()).await;
        pouch
            .put(
                "jobs_replicator/bad",
                json!({"source": src, "worker_processes": 0}),
            )
            .await;
        pouch
            .put("jobs_replicator/_design/x", json!({"views": {}}))
            .await;
        pouch
            .put(
                "jobs_replicator/done",
                json!({"source": src, "target": src,
                "_replication_state": "completed"}),
            )
            .await;
        let db = ReplicatorDb::from_url(&pouch.db("jobs_replicator")).unwrap();
        let dp = DocProcessor::start(rep.clone(), fast(vec![db])).unwrap();

        until("the good doc's job", async || {
            job_state(&rep, "jobs_replicator|good").await
        })
        .await;
        let bad = until("the bad doc to be failed", async || {
            let (_, d) = pouch.get("jobs_replicator/bad").await;
            (d["_replication_state"] == "failed").then_some(d)
        })
        .await;
        let reason = bad["_replication_state_reason"].as_str().unwrap();
        assert!(reason.contains("`target' property must exist"), "{reason}");
        assert!(bad["_replication_state_time"].is_string());
        // Invalid, design and already-terminal docs have no job.
        assert!(rep.get(JobId::from("jobs_replicator|bad")).await.is_err());
        assert!(rep.get(JobId::from("jobs_replicator|done")).await.is_err());
        assert_eq!(rep.list().await.unwrap().len(), 1);
        // The good doc was not touched (only terminal states are ever written).
        let (_, g) = pouch.get("jobs_replicator/good").await;
        assert!(g.get("_replication_state").is_none(), "{g}");

        // Editing the doc replaces the job's replication.
        let mut edited = good.clone();
        edited["_rev"] = g["_rev"].clone();
        edited["target"] = json!(pouch.db("tgt2"));
        pouch.put("jobs_replicator/good", edited).await;
        until("the edited job", async || {
            let j = rep.get(JobId::from("jobs_replicator|good")).await.ok()?;
            Some(j.target).filter(|t| t.ends_with("/tgt2/"))
        })
        .await;

        // Deleting the doc removes the job.
        let (_, g) = pouch.get("jobs_replicator/good").await;
        pouch
            .delete(&format!(
                "jobs_replicator/good?rev={}",
                g["_rev"].as_str().unwrap()
            ))
            .await;
        until("the job to go", async || {
            rep.get(JobId::from("jobs_replicator|good"))
                .await
                .is_err()
                .then_some(())
        })
        .await;

        // A deleted database takes its jobs along; recreated, it is read again.
        pouch.put("jobs_replicator/again", good.clone()).await;
        until("the second job", async || {
            job_state(&rep, "jobs_replicator|again").await
        })
        .await;
        pouch.delete("jobs_replicator").await;
        until("the db's jobs to go", async || {
            rep.list().await.unwrap().is_empty().then_some(())
        })
        .await;
        pouch.put("jobs_replicator", json!({})).await;
        pouch.put("jobs_replicator/third", good.clone()).await;
        until("the recreated db's job", async || {
            job_state(&rep, "jobs_replicator|third").await
        })
        .await;
        dp.stop().await;
        // CouchDB's doc-processor counters followed it: the database found twice (deleted
        // once in between), read from the start each time, the bad doc's `failed` written,
        // the adds and removes of the jobs.
        use couch_replicator::telemetry::Series;
        let m = &rep.metrics().couch;
        assert_eq!(m.get(Series::DocsDbsFound), 2);
        assert_eq!(m.get(Series::DocsDbsDeleted), 1);
        assert_eq!(m.get(Series::DbScans), 2);
        assert!(m.get(Series::DocsDbChanges) >= 7);
        assert_eq!(m.get(Series::DocsFailedStateUpdates), 1);
        assert!(m.get(Series::JobsAdds) >= 3);
        assert!(m.get(Series::JobsRemoves) >= 2);
    })
    .await;
}

fn client(url: &str) -> HttpClient {
    HttpClient::new(
        Endpoint::parse(url).unwrap(),
        ClientConfig::for_tests(Duration::from_secs(10)),
        Arc::new(couch_replicator::replication::Aimd::new()),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_states_are_written_once_through_conflicts() {
    deadline(
        90,
        "terminal states are written once through conflicts",
        async {
            let pouch = Pouch::start().await;
            pouch.put("jobs_replicator", json!({})).await;
            pouch
                .put(
                    "jobs_replicator/r",
                    json!({"source": "http://127.0.0.1:9/a", "target": "http://127.0.0.1:9/b"}),
                )
                .await;
            let c = Arc::new(client(&pouch.db("jobs_replicator")));
            // Concurrent writers keep bumping the revision while the state is written.
            let bumper = {
                let url = pouch.db("jobs_replicator/r");
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    for i in 0..20 {
                        let Ok(r) = http.get(&url).send().await else {
                            continue;
                        };
                        let Ok(mut d) = r.json::<Value>().await else {
                            continue;
                        };
                        if d.get("_replication_state").is_some() {
                            break;
                        }
                        d["n"] = json!(i);
                        let _ = http.put(&url).json(&d).send().await;
                    }
                })
            };
            let stats = DocStats {
                counters: CouchStats {
                    docs_written: 7,
                    docs_read: 7,
                    ..CouchStats::default()
                },
                ..DocStats::default()
            };
            let wrote = write_state(&c, "r", Terminal::Completed(stats.clone()))
                .await
                .unwrap();
            assert!(wrote);
            bumper.await.unwrap();
            let (_, d) = pouch.get("jobs_replicator/r").await;
            assert_eq!(d["_replication_state"], "completed");
            assert_eq!(d["_replication_stats"], json!(stats));
            // A terminal doc is never overwritten, a missing one is not created.
            assert!(
                !write_state(&c, "r", Terminal::Failed("x".into()))
                    .await
                    .unwrap()
            );
            assert!(
                !write_state(&c, "nope", Terminal::Failed("x".into()))
                    .await
                    .unwrap()
            );
            let (s, _) = pouch.get("jobs_replicator/nope").await;
            assert_eq!(s, 404);
            // Ids that need encoding in a URL are written back to the right document.
            let odd = "needs encoding/\u{e9}+?";
            let path = "jobs_replicator/needs%20encoding%2F%C3%A9%2B%3F";
            pouch.put(path, json!({"source": 1})).await;
            assert!(
                write_state(&c, odd, Terminal::Failed("bad".into()))
                    .await
                    .unwrap()
            );
            let (_, d) = pouch.get(path).await;
            assert_eq!(d["_id"], odd);
            assert_eq!(d["_replication_state_reason"], "bad");
        },
    )
    .await;
}

/// Two documents asking for the same continuous replication: one runs, the other is marked
/// `failed` with the reason (CouchDB 4.x's couch_replicator_jobs.erl), and data flows through the one that runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_documents_fail_the_second_with_a_reason() {
    deadline(
        90,
        "duplicate documents fail the second with a reason",
        async {
            let pouch = Pouch::start().await;
            pouch.put("jobs_replicator", json!({})).await;
            pouch.put("src", json!({})).await;
            pouch.put("src/a", json!({"v": 1})).await;
            let node = Node::start(Default::default()).await;
            let rep = node.replicator.clone();
            let body = json!({"source": pouch.db("src"), "target": pouch.db("dst"),
            "create_target": true, "continuous": true});
            pouch.put("jobs_replicator/one", body.clone()).await;
            pouch.put("jobs_replicator/two", body).await;
            let db = ReplicatorDb::from_url(&pouch.db("jobs_replicator")).unwrap();
            let dp = DocProcessor::start(rep.clone(), fast(vec![db])).unwrap();
            let (failed, reason) = until("one doc to be failed", async || {
                for id in ["one", "two"] {
                    let (_, d) = pouch.get(&format!("jobs_replicator/{id}")).await;
                    if d["_replication_state"] == "failed" {
                        return Some((id, d["_replication_state_reason"].as_str()?.to_owned()));
                    }
                }
                None
            })
            .await;
            assert!(reason.contains("already started"), "{reason}");
            let other = if failed == "one" { "two" } else { "one" };
            let running = until("the other to run", async || {
                let j = rep
                    .get(JobId::from(format!("jobs_replicator|{other}")))
                    .await
                    .ok()?;
                (j.state == RepState::Running).then_some(j)
            })
            .await;
            assert!(running.rep_id.is_some());
            until("the data", async || {
                (pouch.get("dst/a").await.0 == 200).then_some(())
            })
            .await;
            let (_, d) = pouch.get(&format!("jobs_replicator/{other}")).await;
            assert!(d.get("_replication_state").is_none(), "{d}");
            dp.stop().await;
        },
    )
    .await;
}

/// A document's `paused` field (ours; CouchDB 3.4.3 accepts such a document and runs it
/// anyway): `true` pauses its job without replacing it, `false` resumes it, and a document
/// that says nothing leaves a job paused through the API as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_documents_paused_field_holds_and_releases_its_job() {
    deadline(90, "a document's paused field", async {
        let pouch = Pouch::start().await;
        pouch.put("jobs_replicator", json!({})).await;
        pouch.put("src", json!({})).await;
        pouch.put("src/d1", json!({"n": 1})).await;
        let node = Node::start(Default::default()).await;
        let rep = node.replicator.clone();
        let body = json!({"source": pouch.db("src"), "target": pouch.db("tgt"),
            "create_target": true, "continuous": true, "paused": true});
        let created = pouch.put("jobs_replicator/p", body.clone()).await;
        let db = ReplicatorDb::from_url(&pouch.db("jobs_replicator")).unwrap();
        let dp = DocProcessor::start(rep.clone(), fast(vec![db])).unwrap();
        let id = "jobs_replicator|p";
        until("the paused job", async || {
            (job_state(&rep, id).await? == RepState::Paused).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(job_state(&rep, id).await, Some(RepState::Paused));
        assert_eq!(
            pouch.get("tgt").await.0,
            404,
            "a paused job created its target"
        );
        let before = rep.get(JobId::from(id)).await.unwrap();

        // `false`: the same job runs (the field is no option of the replication).
        let mut resumed = body.clone();
        resumed["_rev"] = created["rev"].clone();
        resumed["paused"] = json!(false);
        let written = pouch.put("jobs_replicator/p", resumed.clone()).await;
        until("the resumed job copying", async || {
            let (s, d) = pouch.get("tgt/d1").await;
            (s == 200 && d["n"] == 1).then_some(())
        })
        .await;
        let after = rep.get(JobId::from(id)).await.unwrap();
        assert_eq!(after.rep_id, before.rep_id, "the job was replaced");

        // Paused through the API, then the document edited without the field: it stays.
        rep.pause(JobId::from(id)).await.unwrap();
        let mut silent = resumed.clone();
        silent["_rev"] = written["rev"].clone();
        silent.as_object_mut().unwrap().remove("paused");
        pouch.put("jobs_replicator/p", silent).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(job_state(&rep, id).await, Some(RepState::Paused));
        dp.stop().await;
    })
    .await;
}
