//! The built `couch-replicator serve` binary mounts `/_steps` with the config's admins as the
//! admin check and runs this node's steps workers from `[steps]`: a job targeted at the node
//! (named after its node name before `@`) and one for `any` both succeed; anonymous and
//! non-admin callers are refused.

use crate::support::deadline;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

async fn call(
    http: &reqwest::Client,
    who: Option<(&str, &str)>,
    m: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = http.request(m, url);
    if let Some((n, p)) = who {
        r = r.basic_auth(n, Some(p));
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_steps_jobs_behind_admin_auth() {
    deadline(90, "serve runs steps jobs behind admin auth", async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("node.ini");
        std::fs::write(
            &cfg,
            "[admins]\nroot = r00t\n[users]\nbob = bob-pw\n\
             [steps]\nworkers = 2\naction = sleep\nactivity_timeout = 5\n",
        )
        .unwrap();
        let crate::support::serve::ServeProcess { mut child, base } =
            crate::support::serve::spawn_serve(
                &dir.path().join("data"),
                &cfg,
                &["--node", "stepper@127.0.0.1"],
                "warn",
                Stdio::inherit(),
            )
            .await;
        let http = reqwest::Client::new();
        let url = format!("{base}/_steps");
        let spec = json!({"steps": [
            {"target": "stepper", "command": "sleep 0.05"},
            {"target": "any", "command": "sleep 0"},
        ]});
        let post = reqwest::Method::POST;
        let (s, _) = call(&http, None, post.clone(), &url, Some(spec.clone())).await;
        assert_eq!(s, 401);
        let (s, _) = call(
            &http,
            Some(("bob", "bob-pw")),
            post.clone(),
            &url,
            Some(spec.clone()),
        )
        .await;
        assert_eq!(s, 403);
        let admin = Some(("root", "r00t"));
        let (s, created) = call(&http, admin, post, &url, Some(spec)).await;
        assert_eq!(s, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_owned();
        let mut last = Value::Null;
        for _ in 0..300 {
            let (_, v) = call(
                &http,
                admin,
                reqwest::Method::GET,
                &format!("{url}/{id}"),
                None,
            )
            .await;
            last = v;
            if last["state"] == "success" || last["state"] == "failed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(last["state"], "success", "{last}");
        let (s, list) = call(&http, admin, reqwest::Method::GET, &url, None).await;
        assert_eq!(s, 200);
        assert!(
            list["jobs"].as_array().is_some_and(|j| j.len() == 1),
            "{list}"
        );

        // SIGTERM: the node stops cleanly (workers included).
        let pid = child.id().unwrap();
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status:?}");
    })
    .await;
}
