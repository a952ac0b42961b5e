//! The `/_steps` HTTP routes on a real axum server on a loopback port, over a real embedded
//! store and real steps nodes: create, get and list with state; CouchDB-style 400s for bad
//! bodies and queries; admin credentials required on every route; a job whose target node
//! does not exist yet is listed as pending and runs once that node joins.

use crate::support::deadline;
use std::sync::Arc;
use std::time::Duration;

use crate::support::steps::{ADMIN, Cluster, Recorder, serve_steps, test_config};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn admin_get(url: &str) -> (StatusCode, Value) {
    let r = client()
        .get(url)
        .basic_auth(ADMIN.0, Some(ADMIN.1))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

async fn admin_post(url: &str, body: &str) -> (StatusCode, Value) {
    let r = client()
        .post(url)
        .basic_auth(ADMIN.0, Some(ADMIN.1))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

/// Polls `GET /_steps/{id}` until the job has ended.
async fn wait_ended(base: &str, id: &str) -> Value {
    loop {
        let (s, v) = admin_get(&format!("{base}/_steps/{id}")).await;
        assert_eq!(s, StatusCode::OK);
        if v["state"] == "success" || v["state"] == "failed" {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_and_list_jobs_over_http() {
    deadline(60, "create get and list jobs over http", async {
        let mut c = Cluster::open(test_config()).await;
        let rec = Recorder::default();
        c.start_node("a", 2, Arc::new(rec.clone())).await;
        let (base, server) = serve_steps(c.api("front")).await;
        let spec = json!({"steps": [
            {"target": "a", "command": "sleep 0.05"},
            {"target": "any", "command": "exit 3", "alt_command": "exit 0",
             "retry": {"max_retries": 1, "sleep": 0.05}},
        ]});
        let (s, created) = admin_post(&format!("{base}/_steps"), &spec.to_string()).await;
        assert_eq!(s, StatusCode::CREATED, "{created}");
        assert_eq!(created["ok"], true);
        let failing = created["id"].as_str().unwrap().to_string();
        let ok_spec = json!({"steps": [{"target": "any", "command": "sleep 0"}]});
        let (_, created) = admin_post(&format!("{base}/_steps"), &ok_spec.to_string()).await;
        let passing = created["id"].as_str().unwrap().to_string();

        let v = deadline(
            20,
            "create get and list jobs over http",
            wait_ended(&base, &failing),
        )
        .await;
        assert_eq!(v["state"], "failed");
        assert_eq!(v["id"], failing.as_str());
        assert_eq!(v["creator"], "front");
        assert_eq!(v["status"], "failed");
        let s1 = &v["steps"][1];
        assert_eq!(s1["status"], "failed");
        assert_eq!(
            (&s1["exit_status"], &s1["alt_exit_status"]),
            (&json!(3), &json!(0))
        );
        assert_eq!(s1["attempts"], 2);
        assert_eq!(v["steps"][0]["executor"]["node"], "a");
        let v = deadline(
            20,
            "create get and list jobs over http",
            wait_ended(&base, &passing),
        )
        .await;
        assert_eq!(v["state"], "success");

        let (s, all) = admin_get(&format!("{base}/_steps")).await;
        assert_eq!(s, StatusCode::OK);
        let mut listed: Vec<(String, String)> = all["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| {
                (
                    j["id"].as_str().unwrap().into(),
                    j["state"].as_str().unwrap().into(),
                )
            })
            .collect();
        listed.sort();
        let mut expected = vec![
            (failing.clone(), "failed".to_string()),
            (passing.clone(), "success".into()),
        ];
        expected.sort();
        assert_eq!(listed, expected);
        assert_eq!(all["next"], Value::Null);
        let (_, failed) = admin_get(&format!("{base}/_steps?state=failed")).await;
        let ids: Vec<&str> = failed["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [failing.as_str()]);
        // Paging: one per page, the second page starts after the first id.
        let (_, p1) = admin_get(&format!("{base}/_steps?limit=1")).await;
        let first = p1["jobs"][0]["id"].as_str().unwrap().to_string();
        assert_eq!(p1["next"], first.as_str());
        let (_, p2) = admin_get(&format!("{base}/_steps?limit=1&start_after={first}")).await;
        assert_ne!(p2["jobs"][0]["id"], first.as_str());
        assert_eq!(p2["jobs"].as_array().unwrap().len(), 1);

        let (s, missing) = admin_get(&format!("{base}/_steps/nope")).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert_eq!(missing, json!({"error": "not_found", "reason": "missing"}));
        server.abort();
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_and_queries_get_couchdb_style_errors() {
    deadline( 30, "bad bodies and queries get couchdb style errors", async {
        let c = Cluster::open(test_config()).await;
        let (base, server) = serve_steps(c.api("front")).await;
        let url = format!("{base}/_steps");
        let cases = [
            ("not json", "bad_request", ""),
            ("[]", "bad_request", ""),
            (r#"{"steps": []}"#, "bad_request", "at least one step"),
            (r#"{"steps": [{"target": "a"}]}"#, "bad_request", "command"),
            (r#"{"steps": [{"target": "a", "command": "x", "colour": 1}]}"#, "bad_request", "colour"),
            (r#"{"steps": [{"target": "a", "command": "x"}, {"target": "no way", "command": "x"}]}"#, "bad_request", "step 1: bad target"),
            (r#"{"steps": [{"target": "a", "command": "x", "retry": {"sleep_factor": 0.5}}]}"#, "bad_request", "sleep_factor"),
            (r#"{"steps": [{"target": "a", "command": " "}]}"#, "bad_request", "command is empty"),
        ];
        for (body, error, reason) in cases {
            let (s, v) = admin_post(&url, body).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
            assert_eq!(v["error"], error, "{body}");
            let r = v["reason"].as_str().unwrap();
            assert!(r.contains(reason), "{body}: reason {r:?}");
        }
        let r = client()
            .post(&url)
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .body(r#"{"steps": [{"target": "a", "command": "x"}]}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "bad_content_type");
        for q in ["state=sleeping", "limit=0", "limit=x", "limit=100000", "colour=red"] {
            let (s, v) = admin_get(&format!("{url}?{q}")).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
            assert_eq!(v["error"], "bad_request");
        }
        // Larger than axum's default body limit (2 MiB): 413 in CouchDB's form.
        let huge = format!(
            r#"{{"steps": [{{"target": "a", "command": "{}"}}]}}"#,
            "x".repeat(3 << 20)
        );
        let (s, v) = admin_post(&url, &huge).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
        assert_eq!(v["error"], "too_large");
        let r = client()
            .delete(format!("{url}/x"))
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "method_not_allowed");
        // Nothing was stored by any of them.
        let (_, all) = admin_get(&url).await;
        assert_eq!(all["jobs"], json!([]));
        server.abort();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_the_admin() {
    deadline(30, "every route needs the admin", async {
        let c = Cluster::open(test_config()).await;
        let (base, server) = serve_steps(c.api("front")).await;
        let body = r#"{"steps": [{"target": "a", "command": "x"}]}"#;
        for creds in [None, Some((ADMIN.0, "wrong")), Some(("bob", ADMIN.1))] {
            let requests = [
                client()
                    .post(format!("{base}/_steps"))
                    .header("content-type", "application/json")
                    .body(body),
                client().get(format!("{base}/_steps")),
                client().get(format!("{base}/_steps/x")),
            ];
            for req in requests {
                let req = match creds {
                    Some((u, p)) => req.basic_auth(u, Some(p)),
                    None => req,
                };
                let r = req.send().await.unwrap();
                assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{creds:?}");
                assert!(r.headers().contains_key("www-authenticate"));
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["error"], "unauthorized");
                assert!(!v.to_string().contains(ADMIN.1));
            }
        }
        let (_, all) = admin_get(&format!("{base}/_steps")).await;
        assert_eq!(
            all["jobs"],
            json!([]),
            "no job was created without credentials"
        );
        server.abort();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_for_an_unknown_node_is_listed_pending_until_the_node_joins() {
    deadline(
        60,
        "a job for an unknown node is listed pending until the node joins",
        async {
            let mut c = Cluster::open(test_config()).await;
            let rec = Recorder::default();
            c.start_node("a", 1, Arc::new(rec.clone())).await;
            let (base, server) = serve_steps(c.api("front")).await;
            let spec = json!({"steps": [
                {"target": "a", "command": "sleep 0"},
                {"target": "late", "command": "sleep 0"},
            ]});
            let (_, created) = admin_post(&format!("{base}/_steps"), &spec.to_string()).await;
            let id = created["id"].as_str().unwrap().to_string();
            let at_step_1 = async {
                loop {
                    let (_, v) = admin_get(&format!("{base}/_steps/{id}")).await;
                    if v["current_step"] == 1 {
                        return v;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            let v = deadline(
                20,
                "a job for an unknown node is listed pending until the node joins",
                at_step_1,
            )
            .await;
            assert_eq!(v["state"], "pending");
            assert_eq!(v["steps"][1]["status"], "pending");
            // Still waiting a while later, and listed as pending with its target.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let (_, pending) = admin_get(&format!("{base}/_steps?state=pending")).await;
            let jobs = pending["jobs"].as_array().unwrap();
            assert_eq!(jobs.len(), 1, "{pending}");
            assert_eq!(jobs[0]["id"], id.as_str());
            assert_eq!(jobs[0]["current_target"], "late");
            assert_eq!(jobs[0]["current_step"], 1);
            assert!(rec.events().iter().all(|e| e.step == 0));
            c.start_node("late", 1, Arc::new(rec.clone())).await;
            let v = deadline(
                20,
                "a job for an unknown node is listed pending until the node joins",
                wait_ended(&base, &id),
            )
            .await;
            assert_eq!(v["state"], "success");
            assert_eq!(v["steps"][1]["executor"]["node"], "late");
            let (_, pending) = admin_get(&format!("{base}/_steps?state=pending")).await;
            assert_eq!(pending["jobs"], json!([]));
            server.abort();
            c.stop_all().await;
        },
    )
    .await;
}
