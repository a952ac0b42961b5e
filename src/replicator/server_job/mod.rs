//! Whole-server replication jobs (our extension, couch_jobs type `server_jobs`): their
//! specification, record, id and view (`spec`), the handle's calls for them (`api`), and the
//! worker that runs them on every `replication` node (`worker`).
//!
//! The worker is a service task of the tree; it takes no messages and stops with the tree.

pub(crate) mod api;
pub(crate) mod spec;
pub(crate) mod worker;
