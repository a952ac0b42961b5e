//! `_session` cookies shared between jobs, against a real CouchDB 3.4.3 (`COUCHDB_PEER_SCRIPT`;
//! skipped with a message when unset): CouchDB's replicator logs in once per replication, so a
//! node rotating many jobs against one server would `POST /_session` (a password hash on the
//! server) at every start. Ours logs in once per server and user and every job reuses the
//! cookie; a job with other credentials still gets its own login.

use std::time::Duration;

use crate::support::couch::{Couch, numbered_docs};
use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::nodes::Nodes;
use crate::support::proxy::FaultProxy;
use crate::support::replicator::{ep, test_settings};
use couch_replicator::replicator::{NewJob, WaitFor};
use reqwest::Method;

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_against_one_server_share_one_session_login() {
    let Some(peer) = CouchPeer::start("shared sessions", None) else {
        return;
    };
    deadline(180, "jobs share one session login", async {
        peer.warm_up_sessions().await;
        let couch = Couch::new(&peer.admin_url());
        couch.create_db("src").await;
        couch.bulk_insert("src", &numbered_docs("d", 10)).await;
        let proxy = FaultProxy::start(&peer.url()).await;
        let with_admin = |db: &str| proxy.db_url(db).replace("http://", "http://admin:admin@");
        let nodes = Nodes::on_disk();
        let n = nodes.start("n1", test_settings()).await;
        const JOBS: usize = 4;
        let mut after_first_job = 0;
        for i in 0..JOBS {
            let job =
                NewJob::transient(ep(&with_admin("src")), ep(&with_admin(&format!("tgt{i}"))))
                    .create_target();
            let id = n.add(job).await.unwrap().job_id;
            n.wait(&id, WaitFor::Completed, Duration::from_secs(60))
                .await
                .unwrap();
            if i == 0 {
                after_first_job = proxy.log().len();
            }
        }
        let logins = |log: &[crate::support::proxy::Seen]| {
            log.iter()
                .filter(|r| r.method == Method::POST && r.path.starts_with("/_session"))
                .count()
        };
        let log = proxy.log();
        // Without sharing: a login per job and endpoint client, 2 x JOBS.
        assert_eq!(logins(&log), 1, "{JOBS} jobs, one server, one user");
        // Connections are opened ahead only while a login runs: the first job's.
        let opened_later = log[after_first_job..]
            .iter()
            .filter(|r| r.path == "/")
            .count();
        assert_eq!(
            opened_later, 0,
            "connections opened ahead after the first job"
        );
        let to_targets: Vec<_> = log.iter().filter(|r| r.path.starts_with("/tgt")).collect();
        assert!(!to_targets.is_empty());
        assert!(
            to_targets
                .iter()
                .all(|r| r.headers.contains_key("cookie")
                    && !r.headers.contains_key("authorization")),
            "every job used the shared cookie"
        );
        // Another user (a wrong password here) does not get the admin's cookie.
        let wrong = proxy.db_url("src").replace("http://", "http://admin:nope@");
        let job = NewJob::transient(ep(&wrong), ep(&with_admin("tgt_other"))).create_target();
        let id = n.add(job).await.unwrap().job_id;
        let _ = n
            .wait(&id, WaitFor::Completed, Duration::from_secs(20))
            .await;
        assert_eq!(logins(&proxy.log()), 2, "a login for the other credentials");
        n.shutdown().await;
    })
    .await;
}
