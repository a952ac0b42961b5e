//! CouchDB's authentication lockout (`[chttpd_auth_lockout]`, defaults), the same requests
//! sent to a real CouchDB 3.4.3 and to a `serve` node, the answers compared: five wrong
//! passwords for a server admin answer 401, the sixth 403 `forbidden` "Account is temporarily
//! locked due to multiple authentication failures"; the right password is then refused too,
//! through Basic and through `POST /_session` alike (one count for both). A name nobody knows
//! is never locked through Basic.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::support::couchdb::CouchPeer;
use crate::support::deadline;
use crate::support::serve::spawn_serve;

/// (status, error, reason) of each answer.
type Answers = Vec<(u16, String, String)>;

async fn answer(r: reqwest::RequestBuilder) -> (u16, String, String) {
    let r = r
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    let text = |k: &str| v[k].as_str().unwrap_or("").to_owned();
    (status, text("error"), text("reason"))
}

/// The lockout scenario against `base`, whose admin is `admin` with password `right`.
async fn scenario(base: &str, right: &str) -> Answers {
    let http = reqwest::Client::new();
    let basic = |pw: &str| {
        http.get(format!("{base}/_session"))
            .basic_auth("admin", Some(pw))
    };
    let mut out = Vec::new();
    for _ in 0..6 {
        out.push(answer(basic("wrong")).await);
    }
    out.push(answer(basic(right)).await);
    let form = format!("name=admin&password={right}");
    let session = http
        .post(format!("{base}/_session"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form);
    out.push(answer(session).await);
    // Unknown through Basic: never counted.
    for _ in 0..6 {
        let r = http
            .get(format!("{base}/_session"))
            .basic_auth("nobody", Some("x"));
        out.push(answer(r).await);
    }
    out
}

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lockout_answers_as_couchdb_does() {
    let Some(peer) = CouchPeer::start("auth lockout", None) else {
        return;
    };
    deadline(180, "the lockout answers as CouchDB does", async {
        let theirs = scenario(&peer.url(), "admin").await;
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("node.ini");
        std::fs::write(&cfg, "[admins]\nadmin = node-secret\n").unwrap();
        let data = dir.path().join("data");
        let node = spawn_serve(&data, &cfg, &[], "warn", Stdio::inherit()).await;
        let ours = scenario(&node.base, "node-secret").await;
        let statuses: Vec<u16> = theirs.iter().map(|a| a.0).collect();
        assert_eq!(
            statuses[..8],
            [401, 401, 401, 401, 401, 403, 403, 403],
            "{theirs:?}"
        );
        assert_eq!(ours, theirs, "ours (left) and CouchDB 3.4.3 (right)");
    })
    .await;
}
