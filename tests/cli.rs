//! The built `couch-replicator` binary: `replicate`, `verify`, and `serve` end to end (also with steps workers, HTTPS from `[ssl]`, and an authentication CouchDB).

mod support;

mod cli {
    mod all_dbs_e2e;
    mod jobs;
    mod replicate;
    mod serve_auth;
    mod serve_cluster;
    mod serve_e2e;
    mod serve_etcd;
    mod serve_failover_drill;
    mod serve_metrics_port;
    mod serve_steps;
    mod serve_tls;
    mod verify;
}
