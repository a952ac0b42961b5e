//! Steps jobs: the thesis' multi-step, node-targeted job distributor (seed 003) rebuilt as
//! job types on couch_jobs (DESIGN.md section 7).
//!
//! A job is an ordered list of steps, each for a named node or `any`, run strictly in order
//! and each exactly once, with retries and an alternative command.

pub mod action;
pub mod error;
pub mod execute;
pub mod model;
pub mod retry;
pub mod shell;
pub mod sleep_action;
