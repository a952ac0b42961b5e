//! Per-replication options with CouchDB's names and defaults, and the specification of one
//! replication (`spec`), and how option values are read and bounded ([`values`]).

pub(crate) mod spec;
pub mod values;
