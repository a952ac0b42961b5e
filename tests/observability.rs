//! What operators watch: CouchDB's replicator metrics and stats, per-job tracing spans, JSON logs, and the status page in a real browser.

mod support;

mod observability {
    mod json_logs;
    mod metrics;
    mod spans;
    mod status_page;
}
