//! CouchDB's `[prometheus] additional_port` through a real `serve` process: the metrics on a
//! port of their own, without authentication, while the API's port still asks for it.

use crate::support::deadline;
use crate::support::serve::spawn_serve_with;
use crate::support::server::free_port;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_a_port_of_their_own() {
    deadline(60, "metrics port", async {
        let port = free_port();
        let (_dir, node) = spawn_serve_with(&format!(
            "[admins]\nadmin = secret\n[chttpd_auth]\niterations = 10\n\
                 [prometheus]\nadditional_port = true\nbind_address = 127.0.0.1\nport = {port}\n"
        ))
        .await;
        let http = reqwest::Client::new();
        let metrics = format!("http://127.0.0.1:{port}");
        let mut body = String::new();
        for path in ["/_node/_local/_prometheus", "/metrics"] {
            let r = http.get(format!("{metrics}{path}")).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200, "{path}");
            body = r.text().await.unwrap();
            assert!(
                body.contains("couchdb_couch_replicator_jobs_running"),
                "{path}: {body}"
            );
        }
        assert!(
            body.contains("couch_replicator_jobs_census_age_seconds"),
            "{body}"
        );
        // Only the metrics there; the API's own port still wants an admin for the same path.
        let r = http
            .get(format!("{metrics}/_scheduler/jobs"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404);
        let r = http
            .get(format!("{}/_node/_local/_prometheus", node.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
    })
    .await;
}
