//! Each actor of the replicator tree alone: event bus delivery and subscriber death, the
//! rate limiter's AIMD numbers with paused time, the connection pool's budget and owner
//! death, clustering's stable/unstable events and dead-neighbour removal.

mod replicator_support;

use std::time::Duration;

use couch_replicator::replication::RateLimiter;
use couch_replicator::replicator::clustering::ClusterMsg;
use couch_replicator::replicator::connection_pool::{ConnectionPool, Lease, PoolMsg};
use couch_replicator::replicator::event_bus::{
    ClusterStatus, EventBus, EventBusMsg, ReplicatorEvent, subscribe,
};
use couch_replicator::replicator::rate_limiter::{RateLimiterMsg, RateLimiterServer};
use couch_replicator::replicator::{NodeType, ReplicatorSettings};
use ractor::{ActorRef, call};
use replicator_support::*;
use supervisors::{BoxError, Server};

fn stopped(job: &str) -> ReplicatorEvent {
    ReplicatorEvent::Stopped { job_id: job.into() }
}

#[tokio::test]
async fn bus_delivers_in_order_and_drops_dead_subscribers() {
    deadline(10, async {
        let (bus, _) = supervisors::start(None, EventBus, ()).await.unwrap();
        let mut a = subscribe(&bus).unwrap();
        let b = subscribe(&bus).unwrap();
        // A subscriber task that dies: its receiver goes with it.
        let dying = tokio::spawn(async move {
            let mut b = b;
            b.recv().await
        });
        for j in ["1", "2", "3"] {
            bus.send_message(EventBusMsg::Publish(stopped(j))).unwrap();
        }
        for j in ["1", "2", "3"] {
            assert_eq!(a.recv().await.unwrap(), stopped(j));
        }
        assert_eq!(dying.await.unwrap(), Some(stopped("1")));
        assert_eq!(call!(bus, EventBusMsg::Count).unwrap(), 1);
        drop(a);
        assert_eq!(call!(bus, EventBusMsg::Count).unwrap(), 0);
        bus.stop(None);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn rate_limiter_follows_the_aimd_table_step_by_step() {
    let (rl, _) = supervisors::start(None, RateLimiterServer::default(), ())
        .await
        .unwrap();
    let t = call!(rl, RateLimiterMsg::Table).unwrap();
    let k = ("http://127.0.0.1:5984/db".to_owned(), "GET".to_owned());
    let ms = |d: Duration| d.as_millis() as u64;
    assert_eq!(ms(t.interval(&k)), 0);
    assert_eq!(ms(t.failure(&k)), 24);
    tokio::time::advance(Duration::from_millis(50)).await;
    assert_eq!(ms(t.failure(&k)), 24, "inside the 80 ms window");
    tokio::time::advance(Duration::from_millis(40)).await;
    assert_eq!(ms(t.failure(&k)), 29);
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(ms(t.failure(&k)), 35);
    tokio::time::advance(Duration::from_millis(100)).await;
    t.success(&k);
    assert_eq!(ms(t.interval(&k)), 20, "35 - 20 = 15, floored at 20");
    // Keep failing every 100 ms: the interval climbs by x1.2 to the 25 s ceiling.
    let mut steps = 0;
    while ms(t.interval(&k)) < 25_000 {
        tokio::time::advance(Duration::from_millis(100)).await;
        t.failure(&k);
        steps += 1;
        assert!(steps < 100);
    }
    assert_eq!(ms(t.interval(&k)), 25_000);
    // 20 * 1.2^n reaches 25 000 after 40 rounded steps.
    assert!((38..=41).contains(&steps), "{steps}");
    // Idle decay: 3 s without updates removes 2 ms per idle ms, then the 1000 ms step.
    tokio::time::advance(Duration::from_millis(3_000)).await;
    t.success(&k);
    assert_eq!(ms(t.interval(&k)), 25_000 - 6_000 - 1_000);
    // The cleanup timer (every 50 s) drops entries idle for more than 25 s.
    tokio::time::sleep(Duration::from_secs(101)).await;
    assert!(t.is_empty());
    rl.stop(None);
}

/// An actor that does nothing: a connection owner.
#[derive(Clone)]
struct Idle;

impl Server for Idle {
    type Msg = ();
    type State = ();
    type Args = ();
    async fn init(&self, _: ActorRef<()>, _: ()) -> Result<(), BoxError> {
        Ok(())
    }
    async fn handle(&self, _: ActorRef<()>, _: (), _: &mut ()) -> Result<(), BoxError> {
        Ok(())
    }
}

async fn acquire(pool: &ActorRef<PoolMsg>, owner: &ActorRef<()>, want: usize) -> Lease {
    let owner = owner.get_cell();
    call!(pool, |reply| PoolMsg::Acquire {
        endpoint: "http://127.0.0.1:5984".into(),
        owner,
        want,
        reply
    })
    .unwrap()
}

#[tokio::test]
async fn pool_keeps_the_budget_and_releases_dead_owners() {
    deadline(20, async {
        let metrics = std::sync::Arc::new(couch_replicator::telemetry::NodeMetrics::default());
        let pool = ConnectionPool {
            budget: 5,
            close_interval: Duration::from_secs(2),
            metrics: metrics.clone(),
        };
        let (pool, _) = supervisors::start(None, pool, ()).await.unwrap();
        let (a, _) = supervisors::start(None, Idle, ()).await.unwrap();
        let (b, _) = supervisors::start(None, Idle, ()).await.unwrap();
        let (c, _) = supervisors::start(None, Idle, ()).await.unwrap();
        let ep = "http://127.0.0.1:5984".to_owned();
        let usage = |p: &ActorRef<PoolMsg>| {
            let p = p.clone();
            let ep = ep.clone();
            async move { call!(p, PoolMsg::Usage, ep).unwrap() }
        };
        assert_eq!(
            acquire(&pool, &a, 3).await,
            Lease {
                granted: 3,
                overflow: false
            }
        );
        assert_eq!(
            acquire(&pool, &b, 3).await,
            Lease {
                granted: 2,
                overflow: false
            }
        );
        assert_eq!(
            acquire(&pool, &c, 1).await,
            Lease {
                granted: 1,
                overflow: true
            }
        );
        let u = usage(&pool).await.unwrap();
        assert_eq!((u.in_use, u.overflows), (6, 1));
        // Owner death releases its connections at the next sweep.
        a.kill();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(usage(&pool).await.unwrap().in_use, 3);
        pool.send_message(PoolMsg::Release(b.get_id())).unwrap();
        pool.send_message(PoolMsg::Release(c.get_id())).unwrap();
        assert_eq!(usage(&pool).await.unwrap().in_use, 0);
        // CouchDB's connection counters: 3 acquires, 1 owner death, 2 releases.
        use couch_replicator::telemetry::Series;
        assert_eq!(metrics.couch.get(Series::ConnectionAcquires), 3);
        assert_eq!(metrics.couch.get(Series::ConnectionOwnerCrashes), 1);
        assert_eq!(metrics.couch.get(Series::ConnectionReleases), 2);
        // Idle for longer than the close interval: the endpoint is closed.
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert!(usage(&pool).await.is_none());
        pool.stop(None);
    })
    .await;
}

fn frontend_only() -> ReplicatorSettings {
    ReplicatorSettings {
        node_types: vec![NodeType::ApiFrontend],
        ..test_settings()
    }
}

async fn next_cluster_event(rx: &mut couch_replicator::replicator::EventReceiver) -> ClusterStatus {
    loop {
        if let ReplicatorEvent::Cluster(s) = rx.recv().await.unwrap() {
            return s;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clustering_goes_unstable_on_changes_and_removes_a_dead_neighbour() {
    deadline(60, async {
        let store = Store::open();
        let n1 = node(&store.db, "n1", frontend_only()).await;
        let mut ev = n1.subscribe().unwrap();
        assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Stable);
        let n2 = node(&store.db, "n2", frontend_only()).await;
        assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Unstable);
        assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Stable);
        let n3 = node(&store.db, "n3", frontend_only()).await;
        assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Unstable);
        assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Stable);
        let members = |r: &couch_replicator::replicator::Replicator| {
            let c = r.tree().which_child::<ClusterMsg>("clustering").unwrap();
            async move { call!(c, ClusterMsg::Members).unwrap() }
        };
        assert_eq!(members(&n3).await, ["n1", "n2", "n3"]);
        // n2 dies without deregistering; its left neighbour n1 removes it once its heartbeat
        // is older than the activity timeout (3 s).
        n2.kill().await;
        assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Unstable);
        assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Stable);
        assert_eq!(members(&n1).await, ["n1", "n3"]);
        assert_eq!(members(&n3).await, ["n1", "n3"]);
        // A graceful stop deregisters at once.
        n3.shutdown().await;
        assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Unstable);
        assert_eq!(members(&n1).await, ["n1"]);
        n1.shutdown().await;
    })
    .await;
}
