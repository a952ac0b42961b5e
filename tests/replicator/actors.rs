//! Each actor of the replicator tree alone: event bus delivery and subscriber death, the
//! rate limiter's AIMD numbers with paused time, the connection pool's budget and owner
//! death, clustering's stable/unstable events and dead-neighbour removal; then the
//! observations of a node's actors while one job runs and after it is cancelled.

use crate::support::{deadline, wait_for};
use std::time::Duration;

use crate::support::nodes::Nodes;
use crate::support::replicator::*;
use couch_replicator::replication::RateInterval;
use couch_replicator::replication::RateLimiter;
use couch_replicator::replicator::cluster::actor::ClusterMsg;
use couch_replicator::replicator::node::connection_pool::{ConnectionPool, Lease, PoolMsg};
use couch_replicator::replicator::node::event_bus::{
    ClusterStatus, EventBus, EventBusMsg, ReplicatorEvent, subscribe,
};
use couch_replicator::replicator::node::rate_limiter_actor::{RateLimiterMsg, RateLimiterServer};
use couch_replicator::replicator::scheduler::job_server::JobServerMsg;
use couch_replicator::replicator::{NewJob, NodeType, ReplicatorSettings};
use ractor::{ActorRef, call};
use supervisors::{BoxError, Server, observe};

fn stopped(job: &str) -> ReplicatorEvent {
    ReplicatorEvent::Stopped { job_id: job.into() }
}

#[tokio::test]
async fn bus_delivers_in_order_and_drops_dead_subscribers() {
    deadline(
        30,
        "bus delivers in order and drops dead subscribers",
        async {
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
            let seen = observe(&bus).await.unwrap();
            assert_eq!((seen.subscribers, seen.published), (1, 3));
            drop(a);
            assert_eq!(observe(&bus).await.unwrap().subscribers, 0);
            bus.stop(None);
        },
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn rate_limiter_follows_the_aimd_table_step_by_step() {
    let (rl, _) = supervisors::start(None, RateLimiterServer::default(), ())
        .await
        .unwrap();
    let t = call!(rl, RateLimiterMsg::Table).unwrap();
    let k = couch_replicator::replication::RateKey::new("http://127.0.0.1:5984/db", "GET");
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
    // The actor's observation shows the same table.
    let seen = observe(&rl).await.unwrap();
    assert_eq!(seen.max_interval, Duration::from_secs(25));
    let interval = RateInterval {
        endpoint: k.endpoint.clone(),
        method: k.method.clone(),
        interval: Duration::from_millis(18_000),
    };
    assert_eq!((seen.intervals, seen.cleaned), (vec![interval], 0));
    // The cleanup timer (every 50 s) drops entries idle for more than 25 s.
    tokio::time::sleep(Duration::from_secs(101)).await;
    assert!(t.is_empty());
    let seen = observe(&rl).await.unwrap();
    assert_eq!((seen.intervals, seen.cleaned), (vec![], 1));
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

/// On paused time with CouchDB's 90 s close interval.
#[tokio::test(start_paused = true)]
async fn pool_keeps_the_budget_and_releases_dead_owners() {
    deadline(
        600,
        "pool keeps the budget and releases dead owners",
        async {
            let metrics = std::sync::Arc::new(couch_replicator::telemetry::NodeMetrics::default());
            let pool = ConnectionPool {
                budget: 5,
                max_idle: 2,
                max_requests: 10,
                close_interval: ReplicatorSettings::default().connection_close_interval,
                metrics: metrics.clone(),
            };
            let (pool, _) = supervisors::start(None, pool, ()).await.unwrap();
            let (a, _) = supervisors::start(None, Idle, ()).await.unwrap();
            let (b, _) = supervisors::start(None, Idle, ()).await.unwrap();
            let (c, _) = supervisors::start(None, Idle, ()).await.unwrap();
            let usage = |p: &ActorRef<PoolMsg>| {
                let p = p.clone();
                async move {
                    let seen = observe(&p).await.unwrap();
                    assert_eq!(seen.budget, 5);
                    seen.endpoints.get("http://127.0.0.1:5984").copied()
                }
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
            assert_eq!((u.in_use, u.owners, u.overflows), (6, 3, 1));
            // Owner death releases its connections at a later sweep.
            a.kill();
            let u = wait_for(10, "the dead owner's connections released", || async {
                usage(&pool).await.filter(|u| u.owners < 3)
            })
            .await;
            assert_eq!((u.in_use, u.owners, u.overflows), (3, 2, 1));
            let idle = tokio::time::Instant::now();
            pool.send_message(PoolMsg::Release(b.get_id())).unwrap();
            pool.send_message(PoolMsg::Release(c.get_id())).unwrap();
            let u = usage(&pool).await.unwrap();
            assert_eq!((u.in_use, u.owners), (0, 0));
            // CouchDB's connection counters: 3 acquires, 1 owner death, 2 releases.
            use couch_replicator::telemetry::Series;
            assert_eq!(metrics.couch.get(Series::ConnectionAcquires), 3);
            assert_eq!(metrics.couch.get(Series::ConnectionOwnerCrashes), 1);
            assert_eq!(metrics.couch.get(Series::ConnectionReleases), 2);
            // Idle for longer than the close interval: the endpoint is closed.
            wait_for(300, "the idle endpoint closed", || async {
                usage(&pool).await.is_none().then_some(())
            })
            .await;
            assert!(
                idle.elapsed() >= ReplicatorSettings::default().connection_close_interval,
                "closed {:?} after its last release",
                idle.elapsed()
            );
            pool.stop(None);
        },
    )
    .await;
}

fn frontend_only() -> ReplicatorSettings {
    ReplicatorSettings {
        node_types: vec![NodeType::ApiFrontend],
        ..ReplicatorSettings::default()
    }
}

async fn next_cluster_event(rx: &mut couch_replicator::replicator::EventReceiver) -> ClusterStatus {
    loop {
        if let ReplicatorEvent::Cluster(s) = rx.recv().await.unwrap() {
            return s;
        }
    }
}

/// On paused time with CouchDB's intervals: a 5 s start period, a 60 s quiet period and a
/// 61 s activity timeout.
#[tokio::test(start_paused = true)]
async fn clustering_goes_unstable_on_changes_and_removes_a_dead_neighbour() {
    deadline(
        600,
        "clustering goes unstable on changes and removes a dead neighbour",
        async {
            let nodes = Nodes::paused();
            let n1 = nodes.start("n1", frontend_only()).await;
            let mut ev = n1.subscribe().unwrap();
            assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Stable);
            let n2 = nodes.start("n2", frontend_only()).await;
            assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Unstable);
            assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Stable);
            let n3 = nodes.start("n3", frontend_only()).await;
            assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Unstable);
            assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Stable);
            let seen = |r: &couch_replicator::replicator::Replicator| {
                let c = r.tree().which_child::<ClusterMsg>("clustering").unwrap();
                async move { observe(&c).await.unwrap() }
            };
            assert_eq!(seen(&n3).await.members, ["n1", "n2", "n3"]);
            // n2 dies without deregistering; its left neighbour n1 removes it once it has seen
            // its row unchanged for the node timeout (15 s, not the 61 s activity timeout).
            // Its last heartbeat was at most one heartbeat period before the kill.
            let beat = seen(&n1).await.heartbeat;
            let killed = tokio::time::Instant::now();
            n2.kill().await;
            assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Unstable);
            let node_timeout = ReplicatorSettings::default().node_timeout();
            assert!(
                killed.elapsed() + beat >= node_timeout,
                "n2 removed {:?} after its kill, before its heartbeat could time out",
                killed.elapsed()
            );
            assert!(
                killed.elapsed() <= node_timeout + beat * 2,
                "n2 removed {:?} after its kill: the node timeout decides, not the activity timeout",
                killed.elapsed()
            );
            assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Stable);
            let one = seen(&n1).await;
            assert_eq!(one.members, ["n1", "n3"]);
            // n1 saw three changes (n2, n3 joining, n2 removed) and removed n2 itself.
            assert_eq!((one.stable, one.changes), (true, 3));
            assert_eq!(one.removed, ["n2"]);
            let three = seen(&n3).await;
            assert_eq!(three.members, ["n1", "n3"]);
            assert!(three.removed.is_empty(), "{three:?}");
            // A graceful stop deregisters at once.
            n3.shutdown().await;
            assert_eq!(next_cluster_event(&mut ev).await, ClusterStatus::Unstable);
            assert_eq!(seen(&n1).await.members, ["n1"]);
            n1.shutdown().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observations_follow_a_job_from_start_to_cancel() {
    deadline(
        180,
        "observations follow a job from start to cancel",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("src").await;
            pouch.put_docs("src", "d", 5).await;
            let nodes = Nodes::on_disk();
            let n = nodes.start("n1", test_settings()).await;
            let tree = n.tree();
            let job_server = tree.which_child::<JobServerMsg>("job_server").unwrap();
            let pool = tree.which_child::<PoolMsg>("connection_pool").unwrap();
            let limiter = tree.which_child::<RateLimiterMsg>("rate_limiter").unwrap();
            let bus = tree.which_child::<EventBusMsg>("event_bus").unwrap();
            let clustering = tree.which_child::<ClusterMsg>("clustering").unwrap();
            assert!(observe(&job_server).await.unwrap().jobs.is_empty());

            let job = n
                .add(
                    NewJob::transient(ep(&pouch.url("src")), ep(&pouch.url("tgt")))
                        .continuous()
                        .create_target(),
                )
                .await
                .unwrap()
                .job_id;
            // The job server lists the running job, continuous.
            let listed = wait_for(60, "the job server lists the job", || async {
                let seen = observe(&job_server).await.unwrap();
                seen.jobs.into_iter().find(|j| j.job_id == job)
            })
            .await;
            assert!(listed.continuous);
            // Its actor reports the replication running, with progress.
            let actor = n.job_sup().which_child(job.as_str()).unwrap();
            let seen = wait_for(60, "the job actor's progress", || async {
                let seen = observe(&actor).await?;
                let written = seen.stats.as_ref().map_or(0, |s| s.docs_written);
                (written == 5).then_some(seen)
            })
            .await;
            assert!(
                seen.running && seen.continuous && seen.rep_id.is_some(),
                "{seen:?}"
            );
            assert_eq!((seen.job_id.as_str(), seen.error), (job.as_str(), None));
            // Source and target share one endpoint: one owner leases from it.
            let endpoint = format!("http://127.0.0.1:{}", pouch.port);
            let usage = observe(&pool).await.unwrap().endpoints[&endpoint];
            assert_eq!(usage.owners, 1);
            assert!(usage.in_use >= 1, "{usage:?}");
            // No 429 was seen; the bus carried at least the job's start; one member.
            assert!(observe(&limiter).await.unwrap().intervals.is_empty());
            assert!(observe(&bus).await.unwrap().published >= 1);
            assert_eq!(observe(&clustering).await.unwrap().members, ["n1"]);

            // Cancelled: the actor loses its lock and stops, the job server forgets it and
            // the pool releases the lease.
            n.cancel(&job).await.unwrap();
            wait_for(60, "the job server forgets the job", || async {
                observe(&job_server)
                    .await
                    .filter(|s| s.jobs.is_empty())
                    .map(drop)
            })
            .await;
            wait_for(30, "the pool releases the lease", || async {
                let seen = observe(&pool).await.unwrap();
                let owners = seen.endpoints.get(&endpoint).map_or(0, |u| u.owners);
                (owners == 0).then_some(())
            })
            .await;
            assert!(observe(&actor).await.is_none(), "the job actor is gone");
            n.shutdown().await;
        },
    )
    .await;
}
