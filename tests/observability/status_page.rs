//! The status page in a real headless Chromium: it loads for an admin, shows a running job
//! (held mid-replication by the fault proxy), and turns the row to `completed` by itself once
//! the job finishes, without a reload. Screenshots go to the test's temp dir (and to
//! `STATUS_PAGE_SCREENSHOT_DIR` when set, which is how `docs/status-page.png` was made).

use std::time::Duration;

use crate::support::browser::Browser;
use crate::support::couch::{Couch, numbered_docs};
use crate::support::http::{ADMIN, BOB, Node, Pouch};
use crate::support::proxy::{Fault, FaultProxy, Rule};
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::{JobKind, NewJob, ReplicatorError, WaitFor};
use reqwest::Method;
use serde_json::{Value, json};

/// The state cell of a job's row, or null when the row is not shown.
fn state_of(job_id: &str) -> String {
    format!(
        "const r = document.querySelector('tr[data-job-id=\"{job_id}\"] .state');\
         return r ? r.textContent : null;"
    )
}

async fn wait_for_js(browser: &Browser, script: &str, want: &Value, what: &str) {
    crate::support::wait_for(60, what, || async {
        (browser.eval(script).await == *want).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_follows_a_job_from_running_to_completed() {
    crate::support::deadline(180, "the status page in Chromium", async {
        let pouch = Pouch::start().await;
        let couch = Couch::new(&format!("{}/", pouch.url));
        couch.create_db("s").await;
        couch.bulk_insert("s", &numbered_docs("d", 40)).await;
        // Existing, so the job asks it `_revs_diff` (held below); a created one is not asked.
        couch.create_db("t").await;
        let proxy = FaultProxy::start(&format!("{}/", pouch.url)).await;
        let (open, held) = tokio::sync::watch::channel(false);
        proxy.add(Rule::new(
            Some(Method::POST),
            "/t/_revs_diff",
            1,
            Fault::Hold(held),
        ));
        let node = Node::start(HttpConfig::default()).await;
        let rep = node.replicator.clone();
        let job = rep
            .add(NewJob::from_body(
                JobKind::Transient { user: None },
                json!({"source": pouch.db("s"), "target": proxy.db_url("t"),
                            "create_target": true, "connection_timeout": 120000}),
            ))
            .await
            .unwrap();
        // A continuous job (running all along) and one that fails, so the page has more to show.
        let continuous = rep
            .add(NewJob::from_body(
                JobKind::Transient { user: None },
                json!({"source": pouch.db("s"), "target": pouch.db("t3"),
                        "create_target": true, "continuous": true}),
            ))
            .await
            .unwrap();
        let failing = rep
            .add(NewJob::from_body(
                JobKind::Transient { user: None },
                json!({"source": pouch.db("missing"), "target": pouch.db("t2")}),
            ))
            .await
            .unwrap();
        for j in [&job, &continuous] {
            rep.wait(&j.job_id, WaitFor::Running, Duration::from_secs(60))
                .await
                .unwrap();
        }
        // On a loaded machine the failing job may still be starting: the counts below need
        // it failed.
        let failed = rep
            .wait(&failing.job_id, WaitFor::Completed, Duration::from_secs(60))
            .await;
        assert!(
            matches!(failed, Err(ReplicatorError::Failed(..))),
            "{failed:?}"
        );

        // Plain HTTP: a Basic challenge for anonymous callers, 403 for non-admins, and the
        // first snapshot rendered by the server.
        let page = format!("{}/_utils/replicator", node.base);
        let anon = reqwest::get(&page).await.unwrap();
        assert_eq!(anon.status().as_u16(), 401);
        assert!(anon.headers().contains_key("www-authenticate"));
        assert_eq!(node.get("/_utils/replicator", Some(BOB)).await.0, 403);
        let html = node
            .client
            .get(&page)
            .basic_auth(ADMIN.0, Some(ADMIN.1))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            html.contains(&format!("data-job-id=\"{}\"", job.job_id)),
            "{html}"
        );
        // Filtering and paging happen on the server.
        let (s, st) = node
            .get(
                "/_utils/replicator/status.json?state=running&limit=1",
                Some(ADMIN),
            )
            .await;
        assert_eq!(s, 200, "{st}");
        assert_eq!(st["jobs"]["matching"], 2, "{st}");
        assert_eq!(st["jobs"]["rows"].as_array().unwrap().len(), 1, "{st}");
        let search = format!("/_utils/replicator/status.json?q={}", job.job_id);
        let (_, st) = node.get(&search, Some(ADMIN)).await;
        assert_eq!(st["jobs"]["matching"], 1, "{st}");
        assert_eq!(st["jobs"]["rows"][0]["job_id"], json!(job.job_id));
        // Lag: the held job is behind its source (its target holds `_revs_diff`), the
        // continuous one caught up; `sort=lag` puts the held one first.
        let by_lag = "/_utils/replicator/status.json?state=running&sort=lag";
        let first = crate::support::wait_for(30, "the held job first by lag", || async {
            let (_, st) = node.get(by_lag, Some(ADMIN)).await;
            let rows = st["jobs"]["rows"].as_array().cloned().unwrap_or_default();
            let held = rows.first().filter(|r| r["job_id"] == json!(job.job_id)).cloned()?;
            (held["lag_seconds"].as_u64()? >= 1).then_some(rows)
        })
        .await;
        assert_eq!(first[1]["job_id"], json!(continuous.job_id), "{first:?}");
        assert_eq!(first[1]["lag_seconds"], 0, "{first:?}");
        let bad = node
            .get("/_utils/replicator/status.json?state=nope", Some(ADMIN))
            .await;
        assert_eq!(bad.0, 400, "{}", bad.1);

        let shots = tempfile::tempdir().unwrap();
        let browser = Browser::start().await;
        browser.basic_auth(ADMIN.0, ADMIN.1).await;
        browser.goto(&page).await;
        let live =
            "return document.getElementById('live').textContent.startsWith('live: updated');";
        wait_for_js(&browser, live, &json!(true), "the page's first live update").await;
        wait_for_js(
            &browser,
            &state_of(job.job_id.as_str()),
            &json!("running"),
            "a running row",
        )
        .await;
        let lag = format!(
            "return Number(document.querySelector('tr[data-job-id=\"{}\"] .lag').textContent) >= 1;",
            job.job_id
        );
        wait_for_js(&browser, &lag, &json!(true), "the held row's lag").await;
        browser.screenshot(&shots.path().join("running.png")).await;

        // Let the replication finish: the same page shows it completed, all 40 docs written.
        open.send_replace(true);
        wait_for_js(
            &browser,
            &state_of(job.job_id.as_str()),
            &json!("completed"),
            "the completed row",
        )
        .await;
        let docs = format!(
            "return document.querySelector('tr[data-job-id=\"{}\"] .docs').textContent;",
            job.job_id
        );
        wait_for_js(&browser, &docs, &json!("40"), "40 docs written in the row").await;
        // The node's counter: both jobs wrote the 40 documents.
        let written = "return document.getElementById('written').textContent;";
        wait_for_js(&browser, written, &json!("80"), "the node's counter").await;
        let done = shots.path().join("completed.png");
        browser.screenshot(&done).await;
        assert!(
            std::fs::metadata(&done).unwrap().len() > 10_000,
            "an empty screenshot"
        );
        if let Some(dir) = std::env::var_os("STATUS_PAGE_SCREENSHOT_DIR") {
            // For the README: a few bursts of writes the continuous job picks up, so the
            // sparkline has a history.
            for (i, n) in [60, 20, 120, 40].into_iter().enumerate() {
                couch
                    .bulk_insert("s", &numbered_docs(&format!("burst{i}-"), n))
                    .await;
                let want = 3 * (i + 2) + 3;
                let samples = format!(
                    "return Number(document.getElementById('spark').dataset.samples) >= {want};"
                );
                wait_for_js(&browser, &samples, &json!(true), "a sparkline history").await;
            }
            let file = std::path::Path::new(&dir).join("status-page.png");
            browser.screenshot(&file).await;
        }
        browser.quit().await;
    })
    .await;
}
