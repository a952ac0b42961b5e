//! Whole-server replication jobs (our extension, couch_jobs type `server_jobs`): their
//! specification, record, id and view, and the handle's calls for them ([`spec`]), and the
//! worker that runs them on every `replication` node (`worker`).
//!
//! The worker is a service task of the tree; it takes no messages and stops with the tree.

pub mod spec;
pub(crate) mod worker;
