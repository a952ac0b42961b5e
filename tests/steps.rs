//! Steps jobs (the thesis job distributor on couch_jobs): CLI, failover, HTTP, paused-time retries, worker pools, shell action, targets.

mod support;

mod steps {
    mod cli;
    mod failover;
    mod http;
    mod paused;
    mod pool;
    mod shell;
    mod targets;
}
