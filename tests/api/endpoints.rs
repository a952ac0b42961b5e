//! The HTTP API of one node (real on-disk store, real replicator handle, real sockets; an
//! `api_frontend`-only node where job states must not move): JSON
//! shapes of every endpoint, authentication and authorization, bad bodies, 413, masking.

use crate::support::deadline;
use std::time::Duration;

use crate::support::http::{ADMIN, BOB, EVE, Node};
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::{JobId, JobKind, NewJob};
use reqwest::Method;
use serde_json::json;

fn cfg() -> HttpConfig {
    HttpConfig {
        max_body_bytes: 4096,
        replicator_dbs: vec!["_replicator".into()],
        ..HttpConfig::default()
    }
}

async fn add_transient(node: &Node, user: &str, db: &str) -> JobId {
    let v = node
        .replicator
        .add(NewJob::from_body(
            JobKind::Transient {
                user: Some(user.into()),
            },
            json!({"source": format!("http://{user}:pw-{user}@127.0.0.1:9/{db}"),
                "target": "http://127.0.0.1:9/t", "continuous": true}),
        ))
        .await
        .unwrap();
    v.job_id
}

async fn add_persistent(node: &Node, doc: &str) -> JobId {
    node.replicator
        .add(NewJob::from_body(JobKind::Persistent {
                db_name: "_replicator".into(),
                doc_id: doc.into(),
            }, json!({"source": "http://admin:topsecret@127.0.0.1:9/a",
                "target": {"url": "http://127.0.0.1:9/b", "headers": {"Authorization": "Basic YTpi"}}})))
        .await
        .unwrap()
        .job_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_shapes() {
    deadline(60, "endpoint shapes", async {
        let node = Node::frontend(cfg()).await;
        let (s, up) = node.get("/_up", None).await;
        assert_eq!((s, up["status"].as_str()), (200, Some("ok")));
        let (s, hello) = node.get("/", None).await;
        assert_eq!((s, hello["couchdb"].as_str()), (200, Some("Welcome")));
        assert!(hello["node"].is_string());

        let (s, empty) = node.get("/_scheduler/jobs", Some(ADMIN)).await;
        assert_eq!(s, 200);
        assert_eq!(empty, json!({"total_rows": 0, "offset": 0, "jobs": []}));

        let t = add_transient(&node, "bob", "a").await;
        let p = add_persistent(&node, "doc1").await;
        let (s, jobs) = node.get("/_scheduler/jobs", Some(ADMIN)).await;
        assert_eq!(s, 200);
        assert_eq!(jobs["total_rows"], 2);
        for j in jobs["jobs"].as_array().unwrap() {
            // CouchDB 3.4.3's keys, no more.
            let mut keys: Vec<&str> = j.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                [
                    "database",
                    "doc_id",
                    "history",
                    "id",
                    "info",
                    "node",
                    "pid",
                    "source",
                    "start_time",
                    "target",
                    "user"
                ],
                "{j}"
            );
            assert_eq!(j["history"][0]["type"], "added");
            assert!(
                j["history"][0]["timestamp"]
                    .as_str()
                    .unwrap()
                    .ends_with('Z')
            );
        }
        let (s, page) = node
            .get("/_scheduler/jobs?limit=1&skip=1", Some(ADMIN))
            .await;
        assert_eq!(s, 200);
        assert_eq!(
            (page["total_rows"].as_u64(), page["offset"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(page["jobs"].as_array().unwrap().len(), 1);

        let (s, one) = node
            .get(&format!("/_scheduler/jobs/{t}"), Some(ADMIN))
            .await;
        assert_eq!(s, 200);
        assert_eq!(one["user"], "bob");
        assert!(one["database"].is_null());
        let (s, missing) = node.get("/_scheduler/jobs/nope", Some(ADMIN)).await;
        assert_eq!((s, missing["error"].as_str()), (404, Some("not_found")));

        for path in ["/_scheduler/docs", "/_scheduler/docs/_replicator"] {
            let (s, docs) = node.get(path, Some(ADMIN)).await;
            assert_eq!(s, 200, "{path}");
            assert_eq!(docs["total_rows"], 1, "{path}: {docs}");
            let d = &docs["docs"][0];
            for k in [
                "database",
                "doc_id",
                "id",
                "node",
                "source",
                "target",
                "state",
                "info",
                "error_count",
                "last_updated",
                "start_time",
                "source_proxy",
                "target_proxy",
            ] {
                assert!(d.get(k).is_some(), "doc lacks `{k}`: {d}");
            }
            assert_eq!(d["doc_id"], "doc1");
            assert_eq!(d["database"], "_replicator");
        }
        let (s, d) = node
            .get("/_scheduler/docs/_replicator/doc1", Some(ADMIN))
            .await;
        assert_eq!(s, 200);
        assert_eq!(d["state"], "pending", "{d}");
        let (s, d) = node
            .get(
                "/_scheduler/docs/_replicator?states=completed,failed",
                Some(ADMIN),
            )
            .await;
        // As in CouchDB, `total_rows` counts every document, `states` filters `docs`.
        assert_eq!((s, d["total_rows"].as_u64()), (200, Some(1)));
        assert_eq!(d["docs"], json!([]));
        let (s, d) = node
            .get(
                "/_scheduler/docs/_replicator?states=pending,running,crashing",
                Some(ADMIN),
            )
            .await;
        assert_eq!((s, d["total_rows"].as_u64()), (200, Some(1)));
        assert_eq!(d["docs"].as_array().map(Vec::len), Some(1));
        let (s, d) = node
            .get("/_scheduler/docs/_replicator?states=bogus", Some(ADMIN))
            .await;
        assert_eq!((s, d["error"].as_str()), (400, Some("bad_request")));
        let (s, _) = node
            .get("/_scheduler/docs/other_replicator", Some(ADMIN))
            .await;
        assert_eq!(s, 404);
        let (s, d) = node.get("/_scheduler/docs/notarepdb", Some(ADMIN)).await;
        assert_eq!(s, 400, "{d}");
        let (s, d) = node
            .get("/_scheduler/docs/_replicator/nodoc", Some(ADMIN))
            .await;
        assert_eq!(s, 404, "{d}");

        let (s, tasks) = node.get("/_active_tasks", Some(ADMIN)).await;
        assert_eq!(s, 200);
        assert!(tasks.is_array());

        // The counts are the job server's last census (a scrape reads no job): the jobs
        // added show there within a few seconds.
        let mut text = String::new();
        for _ in 0..100 {
            let resp = node
                .client
                .get(format!("{}/metrics", node.base))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 200);
            text = resp.text().await.unwrap();
            if text.contains("couch_replicator_jobs_total 2") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(text.contains("couch_replicator_jobs_total 2"), "{text}");
        assert!(
            text.contains("couch_replicator_jobs{state=\"pending\"}"),
            "{text}"
        );
        let counted = "couch_replicator_http_requests_total{method=\"GET\",status=\"200\"}";
        assert!(text.contains(counted), "{text}");

        // Nothing secret in any reply.
        let all = format!(
            "{jobs}{}",
            node.get("/_scheduler/docs", Some(ADMIN)).await.1
        );
        for secret in ["pw-bob", "topsecret", "YTpi"] {
            assert!(!all.contains(secret), "{secret} leaked: {all}");
        }
        let _ = p;

        let (s, e) = node.get("/nowhere", None).await;
        assert_eq!((s, e["error"].as_str()), (404, Some("not_found")));
        let (s, e) = node
            .call(Method::DELETE, "/_scheduler/jobs", Some(ADMIN), None)
            .await;
        assert_eq!((s, e["error"].as_str()), (405, Some("method_not_allowed")));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_ownership() {
    deadline(60, "authentication and ownership", async {
        let node = Node::frontend(cfg()).await;
        let bobs = add_transient(&node, "bob", "a").await;
        let eves = add_transient(&node, "eve", "b").await;
        let _ = add_persistent(&node, "d").await;

        // Anonymous and wrong credentials.
        let body = r#"{"source":"http://127.0.0.1:9/a","target":"http://127.0.0.1:9/b"}"#;
        for (who, code) in [
            (None, 401),
            (Some(("adm", "wrong")), 401),
            (Some(("nobody", "x")), 401),
        ] {
            let (s, e) = node.post("/_replicate", who, body).await;
            assert_eq!(s, code, "{who:?}");
            assert_eq!(e["error"], "unauthorized");
            let (s, _) = node.get("/_scheduler/jobs", who).await;
            assert_eq!(s, code);
            let (s, _) = node.get("/_active_tasks", who).await;
            assert_eq!(s, code);
        }
        let r = node
            .client
            .get(format!("{}/_scheduler/jobs", node.base))
            .header("authorization", "Bearer abc")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);

        // A non-admin sees only their own transient jobs.
        let (_, jobs) = node.get("/_scheduler/jobs", Some(BOB)).await;
        let users: Vec<&str> = jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["user"].as_str().unwrap())
            .collect();
        assert_eq!(users, vec!["bob"]);
        assert!(node.replicator.get(&bobs).await.is_ok());
        let (s, _) = node
            .get(&format!("/_scheduler/jobs/{eves}"), Some(BOB))
            .await;
        assert_eq!(s, 404);
        let (_, docs) = node.get("/_scheduler/docs", Some(BOB)).await;
        assert_eq!(docs["total_rows"], 0);
        let (_, all) = node.get("/_scheduler/jobs", Some(ADMIN)).await;
        assert_eq!(all["total_rows"], 3);

        // ... and cancels only those.
        let cancel = |id: &JobId| json!({"cancel": true, "id": id}).to_string();
        let (s, _) = node.post("/_replicate", Some(BOB), &cancel(&eves)).await;
        assert_eq!(s, 404);
        assert!(
            node.replicator.get(&eves).await.is_ok(),
            "eve's job must survive"
        );
        let (s, ok) = node.post("/_replicate", Some(BOB), &cancel(&bobs)).await;
        assert_eq!(s, 200, "{ok}");
        assert_eq!(ok["ok"], true);
        assert!(node.replicator.get(&bobs).await.is_err());
        let (s, _) = node.post("/_replicate", Some(BOB), &cancel(&bobs)).await;
        assert_eq!(s, 404);
        // A persistent job is not cancelled through _replicate, even by an admin.
        let (s, e) = node
            .post("/_replicate", Some(ADMIN), &cancel(&"_replicator|d".into()))
            .await;
        assert_eq!((s, e["error"].as_str()), (403, Some("forbidden")));
        // The owner cancels by source/target (the job id is derived from them and the user).
        let by_spec = json!({"cancel": true, "source": "http://eve:pw-eve@127.0.0.1:9/b",
            "target": "http://127.0.0.1:9/t", "continuous": true});
        let (s, e) = node
            .post("/_replicate", Some(EVE), &by_spec.to_string())
            .await;
        assert_eq!(s, 200, "{e}");
        assert!(node.replicator.get(&eves).await.is_err());
        // An admin cancels anyone's transient job by its source/target too.
        let again = add_transient(&node, "bob", "c").await;
        let by_spec = json!({"cancel": true, "source": "http://bob:pw-bob@127.0.0.1:9/c",
            "target": "http://127.0.0.1:9/t", "continuous": true});
        let (s, e) = node
            .post("/_replicate", Some(EVE), &by_spec.to_string())
            .await;
        assert_eq!(s, 404, "eve must not find bob's job: {e}");
        let (s, e) = node
            .post("/_replicate", Some(ADMIN), &by_spec.to_string())
            .await;
        assert_eq!(s, 200, "{e}");
        assert!(node.replicator.get(&again).await.is_err());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_and_limits() {
    deadline(60, "bad bodies and limits", async {
        let node = Node::frontend(cfg()).await;
        let cases: [(&str, &str); 7] = [
            ("", "empty"),
            ("{not json", "not valid JSON"),
            ("[1,2]", "JSON object"),
            (r#"{"target":"http://127.0.0.1:9/b"}"#, "`source' property must exist"),
            (r#"{"source":"ftp://u:hush@h/a","target":"http://127.0.0.1:9/b"}"#, "unsupported protocol"),
            (r#"{"source":"http://127.0.0.1:9/a","target":"http://127.0.0.1:9/b","worker_processes":0}"#, "worker_processes"),
            (r#"{"cancel":"yes"}"#, "`cancel` must be a boolean"),
        ];
        for (body, reason) in cases {
            let (s, e) = node.post("/_replicate", Some(ADMIN), body).await;
            assert_eq!(s, 400, "{body}: {e}");
            assert_eq!(e["error"], "bad_request");
            let r = e["reason"].as_str().unwrap();
            assert!(r.contains(reason), "{body}: {r}");
            assert!(!r.contains("hush"));
        }
        let big = format!(
            r#"{{"source":"http://127.0.0.1:9/a","target":"http://127.0.0.1:9/b","pad":"{}"}}"#,
            "x".repeat(5000)
        );
        let (s, e) = node.post("/_replicate", Some(ADMIN), &big).await;
        assert_eq!((s, e["error"].as_str()), (413, Some("too_large")));
        // A chunked body without Content-Length is cut off at the limit too.
        let stream = futures::stream::iter(
            (0..10).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 1000]))),
        );
        let r = node
            .client
            .post(format!("{}/_replicate", node.base))
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(stream))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 413);
        let (s, e) = node.get("/_scheduler/jobs?limit=x", Some(ADMIN)).await;
        assert_eq!((s, e["error"].as_str()), (400, Some("bad_request")));
        // Nothing was added by any of this.
        assert!(node.replicator.list().await.unwrap().is_empty());
    })
    .await;
}

/// A one-shot POST waits for its job: a transient job that fails comes back as CouchDB's
/// `{"error", "reason"}` (no password in it); a job that does not finish in time is a 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_failures_and_timeouts_are_reported() {
    deadline(60, "one shot failures and timeouts are reported", async {
        let node = Node::start(HttpConfig {
            completion_timeout: Duration::from_secs(30),
            ..cfg()
        })
        .await;
        // Port 9 (discard) is closed: the job fails at start.
        let body = r#"{"source":"http://u:leaky@127.0.0.1:9/a","target":"http://127.0.0.1:9/b",
            "retries_per_request":0}"#;
        let (s, e) = node.post("/_replicate", Some(BOB), body).await;
        assert_eq!(s, 500, "{e}");
        assert!(e["error"].is_string() && e["reason"].is_string(), "{e}");
        assert!(!e.to_string().contains("leaky"), "{e}");
        let jobs = node.replicator.list().await.unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].user.as_deref(), Some("bob"));

        let quick = Node::start(HttpConfig {
            completion_timeout: Duration::from_millis(50),
            ..cfg()
        })
        .await;
        // A source that accepts connections and never answers: the job cannot end (neither
        // succeed nor fail) within the 50 ms the node waits, whatever the machine's load.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = silent.accept().await {
                held.push(conn);
            }
        });
        let stalled = format!(
            r#"{{"source":"http://127.0.0.1:{port}/a","target":"http://127.0.0.1:{port}/b"}}"#
        );
        let (s, e) = quick.post("/_replicate", Some(BOB), &stalled).await;
        assert_eq!((s, e["error"].as_str()), (504, Some("timeout")), "{e}");
    })
    .await;
}

/// Random JSON bodies (and random bytes) never crash the API nor get a 5xx other than the
/// 504 of a valid replication that cannot start on this frontend-only node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bodies_get_client_errors() {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    deadline(60, "random bodies get client errors", async {
        let node = Node::frontend(HttpConfig {
            completion_timeout: Duration::from_millis(20),
            ..cfg()
        })
        .await;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            prop_oneof![
                Just("http://127.0.0.1:9/db".to_string()),
                Just("http://u:p@127.0.0.1:9/x".to_string()),
                ".{0,10}",
            ]
            .prop_map(serde_json::Value::String),
        ];
        let keys = prop_oneof![
            Just("source".to_string()),
            Just("target".to_string()),
            Just("cancel".to_string()),
            Just("id".to_string()),
            Just("continuous".to_string()),
            Just("doc_ids".to_string()),
            Just("selector".to_string()),
            Just("filter".to_string()),
            Just("url".to_string()),
            Just("headers".to_string()),
            ".{0,5}",
        ];
        let strategy = leaf.prop_recursive(3, 24, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(keys.clone(), inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        let mut runner = TestRunner::deterministic();
        for _ in 0..150 {
            let body = strategy
                .new_tree(&mut runner)
                .unwrap()
                .current()
                .to_string();
            let (s, e) = node.post("/_replicate", Some(ADMIN), &body).await;
            assert!(s < 500 || s == 504, "{body} -> {s} {e}");
            assert!(e["error"].is_string() || s < 300, "{body} -> {s} {e}");
        }
        let bytes = prop::collection::vec(any::<u8>(), 0..64);
        for _ in 0..50 {
            let raw = bytes.new_tree(&mut runner).unwrap().current();
            let r = node
                .client
                .post(format!("{}/_replicate", node.base))
                .basic_auth(ADMIN.0, Some(ADMIN.1))
                .header("content-type", "application/json")
                .body(raw)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 400);
        }
        let (s, _) = node.get("/_up", None).await;
        assert_eq!(s, 200);
    })
    .await;
}

/// `/_steps` mounted on the node's router answers only this node's admins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_routes_use_the_node_admins() {
    deadline(60, "steps routes use the node admins", async {
        let node = Node::with_steps(cfg()).await;
        let (s, e) = node.get("/_steps", None).await;
        assert_eq!((s, e["error"].as_str()), (401, Some("unauthorized")), "{e}");
        let (s, e) = node.get("/_steps", Some(BOB)).await;
        assert_eq!((s, e["error"].as_str()), (403, Some("forbidden")), "{e}");
        let (s, e) = node.get("/_steps", Some(("adm", "nope"))).await;
        assert_eq!(s, 401, "{e}");
        let (s, list) = node.get("/_steps", Some(ADMIN)).await;
        assert_eq!(s, 200, "{list}");
        // The replicator routes are still there, with the shared fallbacks.
        let (s, _) = node.get("/_scheduler/jobs", Some(ADMIN)).await;
        assert_eq!(s, 200);
        let (s, e) = node.get("/nowhere", None).await;
        assert_eq!((s, e["error"].as_str()), (404, Some("not_found")));
    })
    .await;
}

/// CouchDB 3.4.3's content-type rule (checked on the real CouchDB: missing, `text/plain`, the
/// form type, `APPLICATION/JSON` and `application/jsonx` get 415 `bad_content_type`;
/// `application/json` with parameters passes) on `_replicate` and `_verify`: what an HTML form
/// on another site can send never starts or cancels a replication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_json_bodies_change_state_like_couchdb() {
    deadline(60, "content types", async {
        let node = Node::frontend(cfg()).await;
        let body = json!({"source": "http://127.0.0.1:9/a", "target": "http://127.0.0.1:9/b",
            "continuous": true})
        .to_string();
        let refused = [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("APPLICATION/JSON"),
            Some("application/jsonx"),
        ];
        for path in ["/_replicate", "/_verify"] {
            for ctype in refused {
                let mut r = node
                    .client
                    .post(format!("{}{path}", node.base))
                    .basic_auth(ADMIN.0, Some(ADMIN.1))
                    .body(body.clone());
                if let Some(c) = ctype {
                    r = r.header("content-type", c);
                }
                let r = r.send().await.unwrap();
                let status = r.status().as_u16();
                let e: serde_json::Value = r.json().await.unwrap();
                assert_eq!(
                    (status, e["error"].as_str(), e["reason"].as_str()),
                    (
                        415,
                        Some("bad_content_type"),
                        Some("Content-Type must be application/json")
                    ),
                    "{path} with {ctype:?}"
                );
            }
        }
        assert!(node.replicator.list().await.unwrap().is_empty());
        let r = node
            .client
            .post(format!("{}/_replicate", node.base))
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .header("content-type", "application/json; charset=utf-8")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "application/json with a charset");
        assert_eq!(node.replicator.list().await.unwrap().len(), 1);
    })
    .await;
}

/// Made-up HTTP methods do not grow `/metrics` (unauthenticated): they share one label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_share_one_metrics_label() {
    deadline(60, "made-up methods", async {
        let node = Node::frontend(cfg()).await;
        let (_, before) = node.get("/metrics", None).await;
        let before = before.as_str().unwrap_or("").len();
        for i in 0..1000 {
            let m = Method::from_bytes(format!("MADEUP{i}").as_bytes()).unwrap();
            let r = node
                .client
                .request(m, format!("{}/_up", node.base))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_client_error(), "{}", r.status());
        }
        let (s, text) = node.get("/metrics", None).await;
        assert_eq!(s, 200);
        let text = text.as_str().unwrap_or("");
        assert!(
            !text.contains("MADEUP"),
            "a made-up method has its own series"
        );
        assert!(
            text.contains(
                r#"couch_replicator_http_requests_total{method="OTHER",status="405"} 1000"#
            ),
            "{text}"
        );
        assert!(
            text.len() < before + 1024,
            "/metrics grew from {before} to {} bytes",
            text.len()
        );
    })
    .await;
}
