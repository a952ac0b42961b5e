//! The built `couch-replicator jobs pause|resume ID` against a node's HTTP API: the job is
//! held and released, the answer printed as `ID STATE`; credentials from the URL or
//! `COUCH_REPLICATOR_AUTH`, never printed; the node's refusals (401, 404, 409) are the error
//! and the exit status.

use crate::support::deadline;
use std::process::Output;

use crate::support::http::{ADMIN, BOB, Node};
use couch_replicator::http::HttpConfig;
use couch_replicator::replicator::{JobKind, NewJob, RepState};
use serde_json::json;

async fn jobs(args: &[&str], auth: Option<String>) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_couch-replicator"));
    cmd.arg("jobs")
        .args(args)
        .env_remove("COUCH_REPLICATOR_URL");
    match auth {
        Some(a) => cmd.env("COUCH_REPLICATOR_AUTH", a),
        None => cmd.env_remove("COUCH_REPLICATOR_AUTH"),
    };
    cmd.output().await.unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_pause_and_resume_a_job_through_the_cli() {
    deadline(60, "jobs pause and resume through the CLI", async {
        // A frontend-only node: its jobs stay where the commands put them.
        let node = Node::frontend(HttpConfig::default()).await;
        let job = node
            .replicator
            .add(NewJob::from_body(
                JobKind::Transient {
                    user: Some(BOB.0.into()),
                },
                json!({"source": "http://127.0.0.1:9/a", "target": "http://127.0.0.1:9/b",
                    "continuous": true}),
            ))
            .await
            .unwrap();
        let id = job.job_id.to_string();
        let with_admin =
            node.base
                .replacen("http://", &format!("http://{}:{}@", ADMIN.0, ADMIN.1), 1);

        let out = jobs(&["--url", &with_admin, "pause", &id], None).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), format!("{id} paused"));
        let state = node.replicator.get(&job.job_id).await.unwrap().state;
        assert_eq!(state, RepState::Paused);

        // The owner, by the environment's credentials.
        let bob = Some(format!("{}:{}", BOB.0, BOB.1));
        let out = jobs(&["--url", &node.base, "resume", &id], bob.clone()).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), format!("{id} pending"));
        let state = node.replicator.get(&job.job_id).await.unwrap().state;
        assert_eq!(state, RepState::Pending);

        // Refusals: not paused, unknown, no credentials. No password in any message.
        for (args, auth, status) in [
            (
                vec!["--url", node.base.as_str(), "resume", id.as_str()],
                bob.clone(),
                "409",
            ),
            (
                vec!["--url", node.base.as_str(), "pause", "nosuchjob"],
                bob.clone(),
                "404",
            ),
            (
                vec!["--url", node.base.as_str(), "pause", id.as_str()],
                None,
                "401",
            ),
        ] {
            let out = jobs(&args, auth).await;
            let err = text(&out.stderr);
            assert!(!out.status.success(), "{args:?} succeeded");
            assert!(err.contains(status), "{args:?}: {err}");
            assert!(!err.contains(BOB.1) && !err.contains(ADMIN.1), "{err}");
        }
    })
    .await;
}
