//! What the nodes of one store agree on (issue 40, points 3 and 4): the first node records
//! its timing, a node started with other values adopts the cluster's, `cluster_timing =
//! replace` is the explicit change the next nodes adopt, and a store written in a newer
//! format is refused naming both versions.

use std::time::Duration;

use couch_replicator::replicator::cluster::agreement::STORE_FORMAT;
use couch_replicator::replicator::{
    NodeType, Replicator, ReplicatorConfig, ReplicatorError, ReplicatorSettings, TimingPolicy,
};
use couch_replicator::store::tuple;

use crate::support::nodes::Nodes;

fn timed(job: u64, node: u64, policy: TimingPolicy) -> ReplicatorSettings {
    ReplicatorSettings {
        node_types: vec![NodeType::ApiFrontend],
        job_timeout: Duration::from_secs(job),
        node_timeout: Duration::from_secs(node),
        cluster_timing: policy,
        ..ReplicatorSettings::default()
    }
}

fn timing(n: &Replicator) -> (u64, u64) {
    let s = n.settings();
    (s.job_timeout.as_secs(), s.node_timeout.as_secs())
}

#[tokio::test(start_paused = true)]
async fn nodes_adopt_the_clusters_timing_until_it_is_replaced() {
    let cluster = Nodes::paused();
    let a = cluster
        .start("agree-a", timed(30, 10, TimingPolicy::Adopt))
        .await;
    assert_eq!(timing(&a), (30, 10), "the first node records its own");
    let b = cluster
        .start("agree-b", timed(61, 15, TimingPolicy::Adopt))
        .await;
    assert_eq!(timing(&b), (30, 10), "a later node adopts the cluster's");
    let c = cluster
        .start("agree-c", timed(20, 8, TimingPolicy::Replace))
        .await;
    assert_eq!(timing(&c), (20, 8), "replace records this node's");
    let d = cluster
        .start(
            "agree-d",
            ReplicatorSettings {
                node_types: vec![NodeType::ApiFrontend],
                ..ReplicatorSettings::default()
            },
        )
        .await;
    assert_eq!(
        timing(&d),
        (20, 8),
        "the next node adopts the replaced timing"
    );
    for n in [a, b, c, d] {
        n.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_in_a_newer_format_is_refused_naming_both() {
    let cluster = Nodes::paused();
    let a = cluster
        .start("agree-e", timed(30, 10, TimingPolicy::Adopt))
        .await;
    a.shutdown().await;
    // A newer version wrote the store: format 99 under the default layer prefix.
    let prefix = couch_replicator::jobs::JobsOptions::default().prefix;
    let mut key = prefix.clone();
    tuple::pack_into(&(56i64, "format"), &mut key);
    cluster
        .db()
        .run(|tx| {
            let key = key.clone();
            async move {
                tx.set(&key, b"99");
                Ok::<_, couch_replicator::store::StoreError>(())
            }
        })
        .await
        .unwrap();
    let config = ReplicatorConfig {
        node: "agree-old".into(),
        settings: timed(30, 10, TimingPolicy::Adopt),
        ..ReplicatorConfig::new(cluster.db().clone())
    };
    let err = Replicator::start(config).await.expect_err("refused");
    assert!(matches!(err, ReplicatorError::Agreement(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("99") && text.contains(&STORE_FORMAT.to_string()),
        "{text}"
    );
}

/// Replacing the timing while replication nodes run (issue 40, point 3): a longer job
/// timeout is taken at once; a shorter one is refused, naming the nodes still beating, since
/// their jobs' leases run on the longer one; once they stopped, it is taken.
#[tokio::test(start_paused = true)]
async fn a_shorter_job_timeout_waits_for_the_running_nodes_to_stop() {
    let cluster = Nodes::paused();
    let runs = |job, node, policy| ReplicatorSettings {
        node_types: vec![NodeType::Replication],
        ..timed(job, node, policy)
    };
    let a = cluster
        .start("agree-run-a", runs(30, 3, TimingPolicy::Adopt))
        .await;
    let config = |name: &str, job| ReplicatorConfig {
        node: name.into(),
        settings: runs(job, 3, TimingPolicy::Replace),
        ..ReplicatorConfig::new(cluster.db().clone())
    };
    let err = Replicator::start(config("agree-run-b", 20))
        .await
        .expect_err("a shorter job timeout while agree-run-a beats");
    let text = err.to_string();
    assert!(
        text.contains("agree-run-a") && text.contains("30 s") && text.contains("20 s"),
        "{text}"
    );
    let b = Replicator::start(config("agree-run-b", 45)).await.unwrap();
    assert_eq!(timing(&b), (45, 3), "a longer one is taken at once");
    a.shutdown().await;
    b.shutdown().await;
    let c = Replicator::start(config("agree-run-c", 10)).await.unwrap();
    assert_eq!(
        timing(&c),
        (10, 3),
        "with nobody running, a shorter one too"
    );
    c.shutdown().await;
}
