//! The replicator suites that lean on the store (crashing jobs and tree children, clusters of
//! nodes with node loss and graceful hand-over, job lifecycle, the neighbour rule) once more,
//! every store of this binary under the fault-injecting wrapper at 1 % (every fault kind but
//! hung commits; seed from `STORE_FAULTS_SEED`, default 1): FoundationDB's failure modes must
//! lose and repeat nothing there either. The same test files as `tests/replicator.rs`; the
//! support tree turns the faults on by this binary's name.

mod support;

mod replicator {
    mod cluster;
    mod faults;
    mod lifecycle;
    mod neighbours;
}
