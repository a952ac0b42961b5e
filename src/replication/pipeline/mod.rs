//! Running one replication: start-up (`start_up`: target, endpoints, id, start point),
//! the pipeline and its handle (`run`), what the reader, workers and run loop share
//! (`shared`), how much work may be in flight (`in_flight`), what a worker does with a batch (`worker`: `revs_diff`, `fetch`, `open_revs`
//! and `bulk_related`, `reframe`, `write`), checkpoints (`checkpoint`), stats ([`stats`]) and
//! what the host lends a replication (`context`).

pub(crate) mod bulk_related;
pub(crate) mod checkpoint;
pub(crate) mod context;
pub(crate) mod fetch;
pub(crate) mod in_flight;
pub(crate) mod multipart;
pub(crate) mod open_revs;
pub(crate) mod reframe;
pub(crate) mod revs_diff;
pub(crate) mod run;
pub(crate) mod shared;
pub(crate) mod start_up;
pub mod stats;
pub(crate) mod worker;
pub(crate) mod write;
