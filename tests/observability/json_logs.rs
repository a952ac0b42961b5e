//! `serve --log-format json`: the real binary writes one JSON object per line, and the lines a
//! replication job logs carry its `replication_job` span with the job and replication ids.

use std::process::Stdio;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::http::Pouch;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_carry_the_jobs_span() {
    crate::support::deadline(120, "a replication logged as JSON", async {
        let pouch = Pouch::start().await;
        let couch = Couch::new(&format!("{}/", pouch.url));
        couch.create_db("s").await;
        couch.bulk_insert("s", &numbered_docs("d", 10)).await;
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("node.ini");
        std::fs::write(
            &cfg,
            "[replicator]\nstartup_jitter = 100\n[admins]\nadm = pw\n",
        )
        .unwrap();
        let log_path = dir.path().join("stderr.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let serve = crate::support::serve::spawn_serve(
            &dir.path().join("data"),
            &cfg,
            &["--log-format", "json"],
            "info",
            Stdio::from(log),
        )
        .await;
        let resp = reqwest::Client::new()
            .post(format!("{}/_replicate", serve.base))
            .basic_auth("adm", Some("pw"))
            .json(&json!({"source": pouch.db("s"), "target": pouch.db("t"), "create_target": true}))
            .send()
            .await
            .unwrap();
        let request_id = resp.headers()["x-couch-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let r: Value = resp.json().await.unwrap();
        assert_eq!(r["ok"], true, "{r}");
        drop(serve);

        let text = std::fs::read_to_string(&log_path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        let finished = lines
            .iter()
            .find(|l| l["fields"]["message"] == "replication finished")
            .unwrap_or_else(|| panic!("no `replication finished` line in {text}"));
        let spans = finished["spans"].as_array().expect("the span list");
        let job = spans
            .iter()
            .find(|s| s["name"] == "replication_job")
            .unwrap_or_else(|| panic!("not in the job span: {finished}"));
        assert!(
            job["job_id"].as_str().is_some_and(|s| !s.is_empty()),
            "{job}"
        );
        let rep_id = job["rep_id"].as_str().unwrap_or_default();
        assert!(rep_id.contains('+'), "rep_id {rep_id:?} in {job}");
        assert_eq!(job["source"], json!(pouch.db("s")), "{job}");

        // The reply's request id is on the request's own lines: the job it added, and the
        // request line with its status.
        let of_request = |l: &&Value| {
            l["spans"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["name"] == "request" && s["request_id"] == request_id.as_str())
            })
        };
        let mine: Vec<&Value> = lines.iter().filter(of_request).collect();
        let added = mine
            .iter()
            .find(|l| l["fields"]["message"] == "replication job added")
            .unwrap_or_else(|| panic!("no job line with request id {request_id}: {text}"));
        assert_eq!(added["fields"]["rep_id"].as_str(), Some(rep_id), "{added}");
        assert!(
            mine.iter()
                .any(|l| l["fields"]["message"] == "request" && l["fields"]["status"] == 200),
            "no request line for {request_id}: {text}"
        );
        assert!(!text.contains("adm:pw"), "a credential in {text}");
    })
    .await;
}
