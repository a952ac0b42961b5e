//! Fair share on a real node: two `_replicator` databases with 100 and 900 shares and as
//! many continuous jobs each, two slots. Rotation stops the over-served database's jobs first
//! and lets them back later, so the 900-share database gets most of the running time. (The
//! exact convergence to the configured ratio is unit-tested on controlled time in
//! `src/replicator/scheduler/share_tests.rs`; here couch_jobs' random pick among eligible jobs adds
//! noise, so the test checks the direction with a wide margin.)

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::deadline;
use crate::support::nodes::Nodes;
use crate::support::replicator::*;
use couch_replicator::replicator::scheduler::ShareKey;
use couch_replicator::replicator::scheduler::job_server::JobServerMsg;
use couch_replicator::replicator::{NewJob, ReplicatorSettings};
use supervisors::observe;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_with_more_shares_gets_more_running_time() {
    deadline(
        240,
        "the database with more shares gets more running time",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("src").await;
            pouch.put_docs("src", "d", 2).await;
            let nodes = Nodes::on_disk();
            let settings = ReplicatorSettings {
                max_jobs: 2,
                max_churn: 2,
                shares: BTreeMap::from([
                    ("a/_replicator".into(), 100),
                    ("b/_replicator".into(), 900),
                ]),
                ..test_settings()
            };
            let n = nodes.start("n1", settings).await;
            for db in ["a", "b"] {
                for i in 0..4 {
                    let job = NewJob::persistent(
                        format!("{db}/_replicator"),
                        format!("doc{i}"),
                        ep(&pouch.url("src")),
                        ep(&pouch.url(&format!("{db}{i}"))),
                    )
                    .continuous()
                    .create_target();
                    n.add(job).await.unwrap();
                }
            }
            let server = n.tree().which_child::<JobServerMsg>("job_server").unwrap();
            // Let a few rotations happen, then sample who runs for a few more.
            tokio::time::sleep(Duration::from_secs(6)).await;
            let mut seen: BTreeMap<ShareKey, u32> = BTreeMap::new();
            for _ in 0..60 {
                if let Some(o) = observe(&server).await {
                    for j in o.jobs {
                        *seen.entry(j.group).or_default() += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let a = seen
                .get(&ShareKey::Db("a/_replicator".into()))
                .copied()
                .unwrap_or(0);
            let b = seen
                .get(&ShareKey::Db("b/_replicator".into()))
                .copied()
                .unwrap_or(0);
            eprintln!("SHARE running samples: a {a}, b {b}");
            // Without fair share both would get about half (same number of jobs).
            assert!(b >= 2 * a.max(1), "running samples: a {a}, b {b}");
            n.shutdown().await;
        },
    )
    .await;
}
