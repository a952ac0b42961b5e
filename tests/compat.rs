//! Drop-in for CouchDB: replication ids, checkpoint hand-over both ways, attachments keeping their encoding, `_replicate` replies and configuration, each compared with what a real CouchDB 3.4.3 computes or answers (the CouchDB peer runs where `COUCHDB_PEER_SCRIPT` is set).

mod support;

mod compat {
    mod attachments;
    mod config;
    mod handover;
    mod replicate_api;
    mod replication_ids;
    mod sessions;
}
