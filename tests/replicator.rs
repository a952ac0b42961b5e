//! The replicator actor tree: actors, the shared connection pool, fair share, clusters of nodes on one store, actor faults, job lifecycle, scale, node types and the `_replicator` doc processor (with `verify`).

mod support;

mod replicator {
    mod actors;
    mod agreement;
    mod all_dbs;
    mod cluster;
    mod doc_processor;
    mod doc_verify;
    mod faults;
    mod lifecycle;
    mod neighbours;
    mod node_types;
    mod pool;
    mod scale;
    mod share;
}
