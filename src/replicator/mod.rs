//! The replicator: the `rest_for_one` actor tree reproducing `couch_replicator_sup` (DESIGN.md
//! section 5). The pure policy modules (AIMD intervals, job backoff, job-server rotation) are
//! kept apart from the actors that apply them.

pub mod aimd;
pub mod backoff;
pub mod churn;
pub mod rep_doc;
pub mod settings;
