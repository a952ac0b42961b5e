//! Replication ids as CouchDB 3.4 computes them ([`rep_id`]), from endpoints in the form the
//! id sees them (`id_endpoint`), selectors in Mango's normal form (`selector`) and
//! Erlang's external term format (`etf`).

pub(crate) mod etf;
pub(crate) mod id_endpoint;
pub mod rep_id;
pub(crate) mod selector;
