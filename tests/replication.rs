//! The replication protocol engine against real pouchdb-servers: basic copies, faults, fetching, filters, attachments (multipart), resuming from checkpoints, verifying a target.

mod support;

mod replication {
    mod basic;
    mod faults;
    mod fetch;
    mod filters;
    mod multipart;
    mod pipeline;
    mod resume;
    mod tls;
    mod verify;
}
