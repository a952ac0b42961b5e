//! One node's tree and what its actors share: the `replicator_sup` tree and its start
//! (`tree`, `start`), the shared context ([`context`]), the settings (`settings`), and
//! the node-wide services the tree starts first.
//!
//! Actors and their messages: the event bus ([`event_bus::EventBusMsg`]: `Subscribe`,
//! `Publish`), the connection pool ([`connection_pool::PoolMsg`]: `Acquire`, `Release`,
//! `Clients`, `Sweep`), the 429 limiter table ([`rate_limiter_actor::RateLimiterMsg`]: `Table`,
//! `Cleanup`) and the `api_frontend` services ([`frontend::ServiceMsg`]: `Ended`); every actor
//! also answers `Observe`.

pub(crate) mod child_id;
pub mod connection_pool;
pub mod context;
pub mod event_bus;
pub mod frontend;
pub(crate) mod name;
pub mod rate_limiter_actor;
pub(crate) mod settings;
pub(crate) mod start;
pub(crate) mod tree;
