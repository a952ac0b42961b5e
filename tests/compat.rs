//! Drop-in for CouchDB: replication ids, checkpoint hand-over both ways, attachments keeping their encoding, documents at CouchDB's size and history limits, `_replicate` replies, response headers and status codes, configuration, the switch that keeps CouchDB's replicator off the documents ours runs, CouchDB's `_users` calling our node, and `verify` on CouchDB's own databases, each compared with what a real CouchDB 3.4.3 computes or answers (the CouchDB peer runs where `COUCHDB_PEER_SCRIPT` is set).

mod support;

mod compat {
    mod attachments;
    mod auth_lockout;
    mod big_attachment;
    mod config;
    mod couch_front;
    mod couchdb_limits;
    mod handover;
    mod replicate_api;
    mod replication_ids;
    mod sessions;
    mod switch;
    mod users;
    mod verify;
}
