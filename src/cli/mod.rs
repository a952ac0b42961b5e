//! Subcommands of the `couch-replicator` binary, one file each.

pub mod auth_couchdb;
pub mod config_file;
pub mod replicate;
pub mod replicator_section;
pub mod serve;
pub mod serve_steps;
pub mod serve_store;
pub mod ssl_section;
pub mod steps;
pub mod verify;
