//! The promises of RELIABILITY.md: the fault matrix through the whole replicator, hostile inputs, kill -9, node loss, security.

mod support;

mod reliability {
    mod connection_limit;
    mod cut_feeds;
    mod cutoff;
    mod faults;
    mod hostile_endpoints;
    mod inputs;
    mod kill9;
    mod nodeloss;
    mod password_storm;
    mod request_fuzz;
    mod security;
    mod user_limits;
}
