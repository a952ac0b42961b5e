//! Pause and resume (issue 41): `POST /_scheduler/jobs/{id}/_pause` and `_resume` on a
//! node running a real continuous replication between pouchdb-server databases, and the
//! same through the handle across a killed node. A paused job runs nowhere, shows `paused`,
//! copies nothing, keeps its checkpoint (the resumed run starts from it) and stays paused
//! when its node dies and another takes over the store; only its owner or an admin may
//! pause it, only with a JSON request, and only a job that can run again.

use crate::support::{deadline, wait_for};
use std::time::Duration;

use crate::support::http::{ADMIN, BOB, EVE, Node};
use crate::support::nodes::Nodes;
use crate::support::replicator::{Pouch as Server, test_settings};
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::{JobId, JobKind, NewJob, RepState, ReplicatorError, WaitFor};
use serde_json::{Value, json};

/// The newest checkpoint session's `start_last_seq` and the number of sessions recorded
/// in the target's checkpoint document.
async fn checkpoint_sessions(target_db_url: &str, base: &str) -> (Value, usize) {
    let doc: Value = reqwest::get(format!("{target_db_url}/_local/{base}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let history = doc["history"].as_array().cloned().unwrap_or_default();
    let newest = history
        .first()
        .map_or(Value::Null, |h| h["start_last_seq"].clone());
    (newest, history.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_job_copies_nothing_and_resumes_from_its_checkpoint() {
    deadline(120, "pause and resume over HTTP", async {
        let pouch = Server::start().await;
        pouch.create_db("src").await;
        pouch.put_docs("src", "a", 5).await;
        let node = Node::start(HttpConfig::default()).await;
        let body = json!({"source": pouch.url("src"), "target": pouch.url("dst"),
            "create_target": true, "continuous": true, "checkpoint_interval": 300})
        .to_string();
        let (s, started) = node.post("/_replicate", Some(BOB), &body).await;
        assert_eq!(s, 202, "{started}");
        pouch.wait_count("dst", 5, Duration::from_secs(30)).await;
        let job = node.replicator.list().await.unwrap().remove(0);
        let id = job.job_id.to_string();
        let base = job.rep_id.clone().expect("a running job has its id").base;
        // Its first checkpoint, at 5 documents.
        wait_for(20, "a first checkpoint", || {
            let (url, base) = (pouch.url("dst"), base.clone());
            async move { (checkpoint_sessions(&url, &base).await.1 > 0).then_some(()) }
        })
        .await;
        let pause = format!("/_scheduler/jobs/{id}/_pause");

        // Who may: not anonymous, not another user, not a form.
        assert_eq!(node.post(&pause, None, "{}").await.0, 401);
        let (s, e) = node.post(&pause, Some(EVE), "{}").await;
        assert_eq!((s, e["error"].as_str()), (404, Some("not_found")), "{e}");
        let form = node
            .client
            .post(format!("{}{pause}", node.base))
            .basic_auth(BOB.0, Some(BOB.1))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("a=b")
            .send()
            .await
            .unwrap();
        assert_eq!(form.status().as_u16(), 415);
        assert_eq!(
            node.replicator.get(&job.job_id).await.unwrap().state,
            RepState::Running
        );

        // The owner pauses it: no actor left, nothing copied.
        let (s, paused) = node.post(&pause, Some(BOB), "{}").await;
        assert_eq!(
            (s, paused["state"].as_str()),
            (200, Some("paused")),
            "{paused}"
        );
        assert!(
            node.replicator.job_sup().which_children().is_empty(),
            "an actor still runs it"
        );
        pouch.put_docs("src", "b", 3).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(pouch.doc_count("dst").await, 5, "a paused job copied");
        let (s, shown) = node.get(&format!("/_scheduler/jobs/{id}"), Some(BOB)).await;
        assert_eq!(
            (s, shown["state"].as_str()),
            (200, Some("paused")),
            "{shown}"
        );
        let (_, listed) = node.get("/_scheduler/jobs", Some(ADMIN)).await;
        assert_eq!(listed["jobs"][0]["state"], "paused", "{listed}");
        wait_for(20, "the paused job counted on /metrics", || async {
            let (_, m) = node.get("/metrics", Some(ADMIN)).await;
            let m = m.as_str().unwrap_or_default().to_owned();
            m.contains("couch_replicator_jobs{state=\"paused\"} 1")
                .then_some(())
        })
        .await;
        // Pausing again changes nothing; posting the same replication does not wait on it.
        assert_eq!(node.post(&pause, Some(ADMIN), "{}").await.0, 200);
        let (s, e) = node.post("/_replicate", Some(BOB), &body).await;
        assert_eq!((s, e["error"].as_str()), (409, Some("conflict")), "{e}");
        assert!(e["reason"].as_str().unwrap().contains("_resume"), "{e}");

        // Resumed: it catches up from its checkpoint, not from the start.
        let resume = format!("/_scheduler/jobs/{id}/_resume");
        let (s, resumed) = node.post(&resume, Some(BOB), "{}").await;
        assert_eq!(
            (s, resumed["state"].as_str()),
            (200, Some("pending")),
            "{resumed}"
        );
        pouch.wait_count("dst", 8, Duration::from_secs(30)).await;
        let (start, sessions) = wait_for(20, "the resumed run's checkpoint", || {
            let (url, base) = (pouch.url("dst"), base.clone());
            async move {
                let (start, n) = checkpoint_sessions(&url, &base).await;
                (n >= 2).then_some((start, n))
            }
        })
        .await;
        assert!(
            start != json!(0) && start != Value::Null,
            "the resumed run started at {start} ({sessions} sessions)"
        );
        let (s, e) = node.post(&resume, Some(BOB), "{}").await;
        assert_eq!((s, e["error"].as_str()), (409, Some("conflict")), "{e}");

        // A one-shot job that completed cannot pause.
        pouch.create_db("once").await;
        pouch.put_docs("once", "o", 2).await;
        let once = json!({"source": pouch.url("once"), "target": pouch.url("once_t"),
            "create_target": true})
        .to_string();
        let (s, done) = node.post("/_replicate", Some(ADMIN), &once).await;
        assert_eq!(s, 200, "{done}");
        let completed = node
            .replicator
            .list()
            .await
            .unwrap()
            .into_iter()
            .find(|j| j.state == RepState::Completed)
            .expect("the completed one-shot job");
        let (s, e) = node
            .post(
                &format!("/_scheduler/jobs/{}/_pause", completed.job_id),
                Some(ADMIN),
                "{}",
            )
            .await;
        assert_eq!((s, e["error"].as_str()), (409, Some("conflict")), "{e}");
        assert_eq!(
            node.post("/_scheduler/jobs/nosuchjob/_pause", Some(ADMIN), "{}")
                .await
                .0,
            404
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_job_stays_paused_when_its_node_dies() {
    deadline(120, "a paused job across a killed node", async {
        let pouch = Server::start().await;
        pouch.create_db("s").await;
        pouch.put_docs("s", "a", 2).await;
        let cluster = Nodes::on_disk();
        let n1 = cluster.start("n1", test_settings()).await;
        let body = json!({"source": pouch.url("s"), "target": pouch.url("t"),
            "create_target": true, "continuous": true});
        let job = n1
            .add(NewJob::from_body(JobKind::Transient { user: None }, body))
            .await
            .unwrap();
        n1.wait(&job.job_id, WaitFor::Running, Duration::from_secs(30))
            .await
            .unwrap();
        pouch.wait_count("t", 2, Duration::from_secs(30)).await;
        assert_eq!(n1.pause(&job.job_id).await.unwrap().state, RepState::Paused);
        n1.kill().await;
        let n2 = cluster.start("n2", test_settings()).await;
        pouch.put_docs("s", "b", 2).await;
        // Several of n2's scheduling intervals (1 s here) and more than the activity
        // timeout (3 s): nothing takes the job.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let seen = n2.get(&job.job_id).await.unwrap();
        assert_eq!(seen.state, RepState::Paused);
        assert!(n2.job_sup().which_children().is_empty());
        assert_eq!(pouch.doc_count("t").await, 2);
        match n2.resume(JobId::from("no-such-job")).await {
            Err(ReplicatorError::NotFound(_)) => {}
            other => panic!("resume of a missing job: {other:?}"),
        }
        n2.resume(&job.job_id).await.unwrap();
        n2.wait(&job.job_id, WaitFor::Running, Duration::from_secs(30))
            .await
            .unwrap();
        pouch.wait_count("t", 4, Duration::from_secs(30)).await;
        n2.shutdown().await;
    })
    .await;
}
