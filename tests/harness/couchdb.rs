//! The real-CouchDB test helper works: a CouchDB started with a given uuid answers with it.

use crate::support::couchdb::CouchPeer;

#[cfg_attr(
    not(couchdb_peer),
    ignore = "needs a real CouchDB: set COUCHDB_PEER_SCRIPT"
)]
#[tokio::test(flavor = "multi_thread")]
async fn a_started_couchdb_answers_with_the_uuid_it_was_given() {
    let uuid = "0123456789abcdef0123456789abcdef";
    let Some(peer) = CouchPeer::start("support_couchdb", Some(uuid)) else {
        return;
    };
    let root: serde_json::Value = reqwest::get(peer.url())
        .await
        .expect("GET /")
        .json()
        .await
        .expect("JSON root");
    assert_eq!(root["uuid"], uuid);
    assert_eq!(root["version"], "3.4.3");
}
