//! The test helpers themselves: the pouchdb-server launcher, the fault proxy, the real-CouchDB peer.

mod support;

mod harness {
    mod couchdb;
    mod pouch_and_proxy;
}
