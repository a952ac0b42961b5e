//! Limits on callers who are not admins (RELIABILITY.md "Inbound"): `[replicator]
//! max_jobs_per_user` and the worker option ceilings, through a real `serve` process. A user
//! at the limit is refused with 403 until one of their jobs ends; a job asking for more
//! workers than a user may is refused with 400; admins are not limited.

use serde_json::{Value, json};

use crate::support::deadline;
use crate::support::serve::spawn_serve_with;

async fn post(http: &reqwest::Client, base: &str, who: (&str, &str), body: &Value) -> (u16, Value) {
    let r = http
        .post(format!("{base}/_replicate"))
        .basic_auth(who.0, Some(who.1))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A continuous replication between two endpoints nobody answers (the job is added, then
/// crashes and backs off: unfinished all the while).
fn job(n: usize) -> Value {
    json!({
        "source": "http://127.0.0.1:9/src",
        "target": format!("http://127.0.0.1:9/tgt{n}"),
        "continuous": true,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_at_the_limit_is_refused_until_a_job_ends() {
    deadline(120, "user limits", async {
        let (_dir, node) = spawn_serve_with(
            "[admins]\nadmin = secret\n[users]\nbob = bob-secret\n\
             [chttpd_auth]\niterations = 10\n\
             [replicator]\nmax_jobs_per_user = 2\nuser_max_worker_processes = 6\n",
        )
        .await;
        let http = reqwest::Client::new();
        let bob = ("bob", "bob-secret");
        let admin = ("admin", "secret");
        for n in 0..2 {
            let (s, b) = post(&http, &node.base, bob, &job(n)).await;
            assert_eq!(s, 202, "{b}");
        }
        let (s, b) = post(&http, &node.base, bob, &job(2)).await;
        assert_eq!((s, b["error"].as_str()), (403, Some("forbidden")), "{b}");
        assert!(
            b["reason"].as_str().unwrap().contains("max_jobs_per_user"),
            "{b}"
        );
        // Admins are not counted nor limited.
        for n in 10..13 {
            let (s, b) = post(&http, &node.base, admin, &job(n)).await;
            assert_eq!(s, 202, "{b}");
        }
        // Above a ceiling: 400 naming the option and its key, whoever has room.
        let mut greedy = job(20);
        greedy["worker_processes"] = json!(64);
        let (s, b) = post(&http, &node.base, admin, &greedy).await;
        assert_eq!(s, 202, "admins may ask for more: {b}");
        let (s, b) = post(&http, &node.base, ("bob", "bob-secret"), &greedy).await;
        assert_eq!((s, b["error"].as_str()), (400, Some("bad_request")), "{b}");
        assert!(
            b["reason"]
                .as_str()
                .unwrap()
                .contains("user_max_worker_processes"),
            "{b}"
        );
        // One of bob's jobs ends: room for another.
        let mut cancel = job(0);
        cancel["cancel"] = json!(true);
        let (s, b) = post(&http, &node.base, bob, &cancel).await;
        assert_eq!(s, 200, "{b}");
        let (s, b) = post(&http, &node.base, bob, &job(2)).await;
        assert_eq!(s, 202, "{b}");
    })
    .await;
}
