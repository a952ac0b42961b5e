//! The transactional store: the conformance suite (every engine), crash recovery of the embedded engine, the model-based history test, and the etcd engine on a 3-member cluster losing a member.

mod support;

mod store {
    mod conformance;
    mod crash;
    mod etcd_cluster;
    mod etcd_lost_commits;
    mod etcd_replica;
    mod etcd_tls;
    mod faults;
    mod model;
}
