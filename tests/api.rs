//! The CouchDB-compatible HTTP API served by a node: scheduler/active-tasks endpoints and `POST /_replicate`.

mod support;

mod api {
    mod couchdb_auth;
    mod couchdb_pending;
    mod couchdb_shapes;
    mod endpoints;
    mod replicate;
}
