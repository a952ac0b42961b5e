//! The transactional store: the conformance suite (every engine), crash recovery of the embedded engine, and the model-based history test.

mod support;

mod store {
    mod conformance;
    mod crash;
    mod faults;
    mod model;
}
