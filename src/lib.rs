//! couch-replicator: Apache CouchDB's replicator and its `couch_jobs` background-jobs
//! framework, re-implemented in Rust on OTP-style supervised actors.
//!
//! Layers (dependencies point downwards only, see DESIGN.md section 2):
//! - [`store`]: the transactional ordered key-value contract (FoundationDB semantics) and its
//!   engines.
//! - [`replication`]: the CouchDB replication protocol over HTTP (no actors).

pub mod replication;
pub mod store;
