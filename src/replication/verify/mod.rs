//! Verifying a target (`couch-replicator verify`, `POST /_verify`): proves that the target
//! holds every leaf revision (deleted and conflicting ones included) of every document the
//! source's changes feed selects, whatever a replication's state claims. The source's feed is
//! read once from the start with the same reader, filters and options as a replication
//! ([`super::changes::reader::ChangesReader`]); batches go to parallel workers that ask the target's
//! `_revs_diff` (`check.rs`) and, when deep, compare bodies and attachment digests
//! (`deep.rs`). `all_dbs.rs` lists a server's databases for `verify --all-dbs`; `request.rs`
//! reads the `"verify"` option of `_replicate` bodies and `_replicator` documents.

pub mod all_dbs;
mod check;
mod deep;
mod report;
pub(crate) mod request;

pub use check::{VerifyOptions, verify};
pub use report::{Progress, VerifyReport};
