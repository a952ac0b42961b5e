//! Node types decide the children of the real tree: a `replication`-only node has no HTTP
//! listener and no `_replicator` follower (yet runs jobs); an `api_frontend`-only node
//! serves the API and turns `_replicator` docs into jobs but runs none, until a
//! `replication` node on the same store picks them up and the frontend writes `completed`
//! back to the doc. Real pouchdb-server, real on-disk store, the real HTTP router.

use crate::support::deadline;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::support::nodes::Nodes;
use crate::support::replicator::{Pouch, test_settings};
use couch_replicator::http::{self, AppState, HttpConfig, auth::Users};
use couch_replicator::replicator::node::frontend::ServiceMsg;
use couch_replicator::replicator::replicator_db::doc_processor::{
    DocProcessorConfig, ReplicatorDb,
};
use couch_replicator::replicator::{
    Frontend, JobKind, NewJob, NodeType, RepState, Replicator, ServiceFn,
};
use serde_json::{Value, json};

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The real API on `addr` as the tree's `http` child.
fn http_at(addr: SocketAddr) -> ServiceFn {
    Arc::new(move |rep: Arc<Replicator>| {
        Box::pin(async move {
            let listener = http::bind_listener(addr).await?;
            let cfg = HttpConfig {
                users: Users::new(vec![("admin".into(), "pw".into())], Vec::new()),
                replicator_dbs: vec!["jobs_replicator".into()],
                ..HttpConfig::default()
            };
            let state = AppState::new(rep, cfg);
            Ok(http::serve(listener, state, std::future::pending()).await?)
        })
    })
}

fn frontend(addr: SocketAddr, repdb: &str) -> Frontend {
    Frontend {
        doc_processor: Some(DocProcessorConfig {
            dbs: vec![ReplicatorDb::from_url(repdb).unwrap()],
            poll_timeout: Duration::from_millis(500),
            retry_delay: Duration::from_millis(200),
            rescan_interval: Duration::from_millis(300),
            ..DocProcessorConfig::default()
        }),
        http: Some(http_at(addr)),
    }
}

async fn start(nodes: &Nodes, name: &str, types: Vec<NodeType>, parts: Frontend) -> Replicator {
    let mut settings = test_settings();
    settings.node_types = types;
    nodes.start_with(name, settings, parts).await
}

async fn put_doc(url: &str, body: Value) {
    let r = reqwest::Client::new()
        .put(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

async fn pouch_json(url: &str) -> Option<Value> {
    reqwest::get(url).await.ok()?.json().await.ok()
}

async fn get_json(url: &str) -> Option<Value> {
    let r = reqwest::Client::new()
        .get(url)
        .basic_auth("admin", Some("pw"))
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_node_has_no_api_and_no_doc_follower() {
    deadline(
        270,
        "replication node has no api and no doc follower",
        async {
            let pouch = Pouch::start().await;
            let nodes = Nodes::on_disk();
            for d in ["src", "tgt", "jobs_replicator"] {
                pouch.create_db(d).await;
            }
            pouch.put_docs("src", "d", 20).await;
            let doc = json!({"source": pouch.url("src"), "target": pouch.url("tgt")});
            put_doc(&format!("{}/r1", pouch.url("jobs_replicator")), doc.clone()).await;

            let addr = free_addr();
            let rep = start(
                &nodes,
                "rep@127.0.0.1",
                vec![NodeType::Replication],
                frontend(addr, &pouch.url("jobs_replicator")),
            )
            .await;
            let children = rep.tree().which_children();
            assert!(children.contains(&"job_server".to_owned()), "{children:?}");
            assert!(
                !children.iter().any(|c| c == "http" || c == "doc_processor"),
                "{children:?}"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(
                tokio::net::TcpStream::connect(addr).await.is_err(),
                "a replication-only node must not listen"
            );
            assert!(
                rep.list().await.unwrap().is_empty(),
                "no doc follower, so no job"
            );

            // It still runs jobs added through the handle.
            let job = rep
                .add(NewJob::from_body(JobKind::Transient { user: None }, doc))
                .await
                .unwrap();
            pouch.wait_count("tgt", 20, Duration::from_secs(30)).await;
            assert!(rep.get(&job.job_id).await.is_ok());
            rep.shutdown().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontend_node_creates_jobs_but_runs_none() {
    deadline(280, "frontend node creates jobs but runs none", async {
        let pouch = Pouch::start().await;
        let nodes = Nodes::on_disk();
        for d in ["src", "tgt", "jobs_replicator"] {
            pouch.create_db(d).await;
        }
        pouch.put_docs("src", "d", 25).await;
        let repdb = pouch.url("jobs_replicator");
        put_doc(
            &format!("{repdb}/r1"),
            json!({"source": pouch.url("src"), "target": pouch.url("tgt")}),
        )
        .await;

        let addr = free_addr();
        let front = start(
            &nodes,
            "front@127.0.0.1",
            vec![NodeType::ApiFrontend],
            frontend(addr, &repdb),
        )
        .await;
        let children = front.tree().which_children();
        assert!(
            children.ends_with(&["doc_processor".into(), "http".into()]),
            "{children:?}"
        );
        assert!(
            !children.iter().any(|c| c == "job_server" || c == "job_sup"),
            "{children:?}"
        );
        // Both services got the node's handle and run.
        for service in ["doc_processor", "http"] {
            let child = front.tree().which_child::<ServiceMsg>(service).unwrap();
            let seen = supervisors::observe(&child).await.unwrap();
            assert_eq!(seen.service, service);
            assert!(seen.handle_ready && seen.running, "{seen:?}");
        }

        // The API answers and shows the job the doc processor created; it stays pending.
        let jobs_url = format!("http://{addr}/_scheduler/docs/jobs_replicator/r1");
        let mut seen = None;
        for _ in 0..100 {
            if let Some(v) = get_json(&jobs_url)
                .await
                .filter(|v| v.get("state").is_some())
            {
                seen = Some(v);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let Some(seen) = seen else {
            panic!(
                "the frontend created no job for the doc: {:?} / {:?}",
                get_json(&jobs_url).await,
                front.list().await
            );
        };
        assert_eq!(seen["state"], "pending", "{seen}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            pouch.doc_count("tgt").await,
            0,
            "a frontend-only node ran a job"
        );
        let jobs = front.list().await.unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].state, RepState::Pending);

        // A replication node on the same store runs it; the frontend writes `completed`.
        let worker = start(
            &nodes,
            "rep@127.0.0.1",
            vec![NodeType::Replication],
            Frontend::default(),
        )
        .await;
        pouch.wait_count("tgt", 25, Duration::from_secs(40)).await;
        let mut state = Value::Null;
        for _ in 0..200 {
            let doc = pouch_json(&format!("{repdb}/r1"))
                .await
                .unwrap_or(Value::Null);
            state = doc["_replication_state"].clone();
            if state == "completed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(state, "completed", "{:?}", front.list().await);
        worker.shutdown().await;
        front.shutdown().await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "the API stops with the tree"
        );
    })
    .await;
}

/// A crashed (killed) `http` child: no terminate hook runs, yet its listener goes with it and
/// the restarted child serves the API on the same address; being last in `rest_for_one`
/// order, its crash restarts nothing else, and a running job keeps its actor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_http_child_comes_back_on_the_same_port_alone() {
    deadline(
        270,
        "a killed http child comes back on the same port alone",
        async {
            let pouch = Pouch::start().await;
            let nodes = Nodes::on_disk();
            for d in ["src", "jobs_replicator"] {
                pouch.create_db(d).await;
            }
            pouch.put_docs("src", "d", 10).await;
            let addr = free_addr();
            let node = start(
                &nodes,
                "both@127.0.0.1",
                vec![NodeType::ApiFrontend, NodeType::Replication],
                frontend(addr, &pouch.url("jobs_replicator")),
            )
            .await;
            let job = node
                .add(NewJob::from_body(
                    JobKind::Transient { user: None },
                    json!({"source": pouch.url("src"), "target": pouch.url("tgt"),
                            "create_target": true, "continuous": true}),
                ))
                .await
                .unwrap();
            pouch.wait_count("tgt", 10, Duration::from_secs(30)).await;
            let running = node.get(&job.job_id).await.unwrap();
            assert_eq!(running.state, RepState::Running);
            let jobs_url = format!("http://{addr}/_scheduler/jobs");
            let answers = |v: &Option<Value>| v.as_ref().is_some_and(|v| v.get("jobs").is_some());
            let mut up = false;
            for _ in 0..100 {
                if answers(&get_json(&jobs_url).await) {
                    up = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(up, "the API never answered on {addr}");
            let ids = |n: &Replicator| {
                ["job_sup", "doc_processor", "http"]
                    .map(|c| n.tree().children().cell(c).map(|c| c.get_id()))
            };
            let before = ids(&node);
            node.tree().children().cell("http").unwrap().kill();
            let mut after = ids(&node);
            let mut back = false;
            for _ in 0..100 {
                after = ids(&node);
                if after[2].is_some()
                    && after[2] != before[2]
                    && answers(&get_json(&jobs_url).await)
                {
                    back = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(back, "the API did not come back on {addr}: {after:?}");
            // The new child holds the port for good: had the killed one's listener lived on, the
            // new one could not bind and would fail and restart after the rebind patience.
            tokio::time::sleep(http::REBIND_PATIENCE + Duration::from_secs(1)).await;
            assert_eq!(
                ids(&node)[2],
                after[2],
                "the new http child did not stay up"
            );
            assert!(answers(&get_json(&jobs_url).await));
            assert_eq!(after[..2], before[..2], "earlier children were restarted");
            let still = node.get(&job.job_id).await.unwrap();
            assert_eq!(still.state, RepState::Running);
            assert_eq!(still.pid, running.pid, "the job was restarted");
            pouch.put_docs("src", "e", 5).await;
            pouch.wait_count("tgt", 15, Duration::from_secs(30)).await;
            node.shutdown().await;
        },
    )
    .await;
}
