//! `POST /_verify` and `"verify"` on a one-shot `POST /_replicate`, against real
//! pouchdb-servers: the report of an incomplete target (missing leaves, and a different
//! attachment when deep), CouchDB-style errors for an anonymous caller, a bad body and a
//! missing database, and a replication's reply carrying the report of its complete target.

use crate::support::couch::Couch;
use crate::support::deadline;
use crate::support::http::{ADMIN, BOB, Node, Pouch};
use crate::support::verify::{self as fixture, different_of, missing_of};
use couch_replicator::http::HttpConfig;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_an_incomplete_target() {
    deadline(90, "POST /_verify", async {
        let pouch = Pouch::start().await;
        let c = Couch::new(&pouch.url);
        let want = fixture::incomplete(&c, "src", &c, "tgt").await;
        let node = Node::start(HttpConfig::default()).await;
        let body = json!({"source": pouch.db("src"), "target": pouch.db("tgt"),
            "doc_ids": fixture::doc_ids(), "deep": true});

        let (s, e) = node.post("/_verify", None, &body.to_string()).await;
        assert_eq!((s, e["error"].as_str()), (401, Some("unauthorized")), "{e}");

        let (s, r) = node.post("/_verify", Some(BOB), &body.to_string()).await;
        assert_eq!(s, 200, "{r}");
        assert_eq!(r["complete"], false, "{r}");
        assert_eq!(missing_of(&r), want.missing, "{r}");
        assert_eq!(different_of(&r), [want.different], "{r}");
        assert_eq!(r["leaves_checked"], want.leaves, "{r}");

        let (s, e) = node
            .post(
                "/_verify",
                Some(ADMIN),
                &json!({"source": pouch.db("src"),
                "target": pouch.db("tgt"), "deep": "yes"})
                .to_string(),
            )
            .await;
        assert_eq!((s, e["error"].as_str()), (400, Some("bad_request")), "{e}");
        let (s, e) = node
            .post(
                "/_verify",
                Some(ADMIN),
                &json!({"source": pouch.db("src"),
                "target": pouch.db("nowhere")})
                .to_string(),
            )
            .await;
        assert_eq!((s, e["error"].as_str()), (404, Some("not_found")), "{e}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicate_with_verify_puts_the_report_in_the_reply() {
    deadline(90, "_replicate verify", async {
        let pouch = Pouch::start().await;
        let c = Couch::new(&pouch.url);
        let want = fixture::incomplete(&c, "src", &c, "tgt").await;
        let node = Node::start(HttpConfig::default()).await;
        let body = json!({"source": pouch.db("src"), "target": pouch.db("copy"),
            "create_target": true, "verify": {"deep": true}});
        let (s, r) = node
            .post("/_replicate", Some(ADMIN), &body.to_string())
            .await;
        assert_eq!(s, 200, "{r}");
        assert_eq!(r["ok"], true, "{r}");
        let v = &r["verify"];
        assert_eq!(v["complete"], true, "{r}");
        assert_eq!(v["deep"], true, "{r}");
        assert_eq!(v["leaves_checked"], want.leaves + 1, "{r}");
        assert_eq!(v["leaves_compared"], want.leaves + 1, "{r}");

        let bad = json!({"source": pouch.db("src"), "target": pouch.db("copy"), "verify": 1});
        let (s, e) = node
            .post("/_replicate", Some(ADMIN), &bad.to_string())
            .await;
        assert_eq!((s, e["error"].as_str()), (400, Some("bad_request")), "{e}");
    })
    .await;
}
