//! HTTP to CouchDB servers: the client of one endpoint with its retries ([`client`]), the
//! shared transports (connection pools) it runs on (`transport`), TLS ([`tls`]),
//! authentication and the node's shared `_session` cookies ([`auth`], `session_cache`),
//! coalesced identical reads (`coalesce`), the request ([`request`]) and the fully read
//! response ([`response`]), the
//! reqwest client each endpoint runs on (`reqwest_client`) and the caps on what an endpoint
//! may send ([`limits`]), enforced while reading (`body`) within the node's budget of
//! response bytes ([`budget`]); streamed uploads are timed by their progress (`upload`).

pub mod auth;
pub(crate) mod body;
pub mod budget;
pub mod client;
pub(crate) mod coalesce;
pub mod limits;
pub mod request;
pub(crate) mod reqwest_client;
pub mod response;
pub(crate) mod session_cache;
pub mod tls;
pub(crate) mod transport;
pub(crate) mod upload;
