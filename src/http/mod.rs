//! The HTTP API (axum).

pub mod steps;
