//! The nodes sharing one store: what they agree on (store format, timing: [`agreement`]),
//! membership rows, heartbeats and the neighbour rules as store
//! transactions ([`membership`]), liveness judged by what this process saw change
//! ([`sightings`]), and the actor that runs them and publishes stability
//! ([`actor`]).
//!
//! The clustering actor takes [`actor::ClusterMsg`]: `Changed` (membership moved),
//! `Heartbeat`, `Quiet` (the stability period passed) and `Observe`.

pub mod actor;
pub mod agreement;
pub mod membership;
pub mod sightings;
