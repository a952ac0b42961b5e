//! HTTP to CouchDB servers: the client of one endpoint with its retries ([`client`]), the
//! shared transports (connection pools) it runs on ([`transport`]), TLS ([`tls`]),
//! authentication and the node's shared `_session` cookies ([`auth`], [`session_cache`]),
//! coalesced identical reads ([`coalesce`]) and the fully read response ([`response`]).

pub mod auth;
pub mod client;
pub mod coalesce;
pub mod response;
pub mod session_cache;
pub mod tls;
pub mod transport;
