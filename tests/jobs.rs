//! couch_jobs on the store: API semantics, the activity monitor, several nodes on one store, subscriptions and the notifier, the pending-queue head.

mod support;

mod jobs {
    mod accept_options;
    mod api;
    mod chaos;
    mod monitor;
    mod multinode;
    mod notify;
    mod pending_head;
}
