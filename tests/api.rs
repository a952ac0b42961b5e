//! The CouchDB-compatible HTTP API served by a node: scheduler/active-tasks endpoints, `POST /_replicate` and `POST /_verify`.

mod support;

mod api {
    mod couchdb_auth;
    mod couchdb_pending;
    mod couchdb_shapes;
    mod endpoints;
    mod lag;
    mod pause;
    mod replicate;
    mod verify;
}
