//! `_replicator` databases and replication requests: parsing and validating a replication
//! document or a `POST /_replicate` body ([`request`]), the document processor that turns
//! documents into persistent jobs ([`doc_processor`]), writing a final state back into the
//! document ([`writeback`]) and the validate design document installed in each followed
//! database (`validate_ddoc`).
//!
//! The document processor is one of the `api_frontend` services: it runs as a task under the
//! frontend actor ([`super::node::frontend::ServiceMsg`]) and takes no messages of its own.

pub mod doc_processor;
pub mod request;
pub(crate) mod validate_ddoc;
pub mod writeback;
