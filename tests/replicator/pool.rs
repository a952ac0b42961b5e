//! The connection pool's shared clients, counted in real sockets through a TCP relay in front
//! of pouchdb-server: jobs against one endpoint reuse one client's connections, idle ones are
//! closed by the replicator after `connection_close_interval`, a burst of jobs never has more
//! than `max_requests_per_endpoint` buffered requests (so sockets) in flight, continuous jobs
//! on one source hold one socket between them (its change watch), and a killed job's sockets
//! and share of the client go with it.

use std::time::Duration;

use crate::support::nodes::Nodes;
use crate::support::replicator::*;
use crate::support::tcp_count::TcpCounter;
use crate::support::{deadline, wait_for};
use couch_replicator::replicator::node::connection_pool::PoolMsg;
use couch_replicator::replicator::{NewJob, ReplicatorSettings, WaitFor};
use supervisors::observe;

/// Short idle close; a long activity timeout so a killed job is not re-run during the test.
fn pool_settings() -> ReplicatorSettings {
    ReplicatorSettings {
        connection_close_interval: Duration::from_secs(1),
        job_timeout: Duration::from_secs(120),
        ..test_settings()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_share_connections_and_idle_ones_close() {
    deadline(180, "jobs share connections and idle ones close", async {
        let pouch = Pouch::start().await;
        pouch.create_db("src").await;
        pouch.put_docs("src", "d", 10).await;
        let relay = TcpCounter::start(pouch.port).await;
        let nodes = Nodes::on_disk();
        let n = nodes.start("n1", pool_settings()).await;
        let pool = n.tree().which_child::<PoolMsg>("connection_pool").unwrap();
        const JOBS: usize = 6;
        for i in 0..JOBS {
            let job = NewJob::transient(ep(&relay.url("src")), ep(&relay.url(&format!("tgt{i}"))))
                .create_target()
                .http_connections(2);
            let id = n.add(job).await.unwrap().job_id;
            n.wait(&id, WaitFor::Completed, Duration::from_secs(60))
                .await
                .unwrap();
        }
        for i in 0..JOBS {
            pouch
                .wait_count(&format!("tgt{i}"), 10, Duration::from_secs(10))
                .await;
        }
        // With a client per job, each job would open at least one connection for its source
        // and one for its target: 2 x JOBS. Shared, later jobs reuse the first ones' sockets.
        let accepted = relay.accepted();
        assert!(accepted < JOBS, "{JOBS} jobs opened {accepted} connections");
        // Idle: the replicator closes the sockets itself (pouchdb-server would only after
        // 5 s) and the pool drops the unused client.
        wait_for(30, "idle connections closed", || async {
            (relay.open() == 0).then_some(())
        })
        .await;
        assert!(relay.closed_by_client() >= 1, "the replicator closed none");
        let seen = wait_for(30, "the unused client dropped", || async {
            observe(&pool)
                .await
                .filter(|s| s.clients.is_empty() && s.clients_closed >= 1)
        })
        .await;
        assert!(seen.endpoints.values().all(|u| u.owners == 0), "{seen:?}");
        n.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_job_releases_its_share() {
    deadline(180, "a killed job releases its share", async {
        let pouch = Pouch::start().await;
        // Two sources: continuous jobs on one source would share one change watch, and
        // the killed job would own no socket of its own.
        for src in ["src_a", "src_b"] {
            pouch.create_db(src).await;
            pouch.put_docs(src, "d", 5).await;
        }
        let relay = TcpCounter::start(pouch.port).await;
        let nodes = Nodes::on_disk();
        let n = nodes.start("n1", pool_settings()).await;
        let pool = n.tree().which_child::<PoolMsg>("connection_pool").unwrap();
        let add = |src: &str, tgt: &str| {
            NewJob::transient(ep(&relay.url(src)), ep(&relay.url(tgt)))
                .continuous()
                .create_target()
        };
        let a = n.add(add("src_a", "tgt_a")).await.unwrap().job_id;
        let b = n.add(add("src_b", "tgt_b")).await.unwrap().job_id;
        pouch.wait_count("tgt_a", 5, Duration::from_secs(60)).await;
        pouch.wait_count("tgt_b", 5, Duration::from_secs(60)).await;
        // Two jobs, each a source and a target client, on one shared client.
        let seen = wait_for(30, "both jobs on the shared client", || async {
            observe(&pool)
                .await
                .filter(|s| s.clients.len() == 1 && s.clients[0].users == 4)
        })
        .await;
        assert_eq!(
            seen.clients[0].endpoint,
            format!("http://127.0.0.1:{}", relay.port)
        );
        let open_before = relay.open();
        assert!(
            open_before >= 2,
            "two change watches: {open_before} sockets"
        );
        n.job_sup().which_child(a.as_str()).unwrap().kill();
        // Its HTTP clients and its lease go; its source's watch socket is closed by us.
        wait_for(30, "the killed job's share released", || async {
            let s = observe(&pool).await?;
            let owners: usize = s.endpoints.values().map(|u| u.owners).sum();
            (s.clients.len() == 1 && s.clients[0].users == 2 && owners == 1).then_some(())
        })
        .await;
        wait_for(30, "the killed job's sockets closed", || async {
            (relay.open() < open_before && relay.closed_by_client() >= 1).then_some(())
        })
        .await;
        // The other job still replicates.
        pouch.put_docs("src_b", "e", 3).await;
        pouch.wait_count("tgt_b", 8, Duration::from_secs(60)).await;
        n.cancel(&b).await.unwrap();
        n.shutdown().await;
    })
    .await;
}

/// Continuous jobs reading one source hold one socket between them while it is quiet: the
/// source's shared change watch. Each job reads its own documents (`doc_ids`) when the watch
/// sees a change to one of them, and the sockets of those reads close once idle. One feed per job, as
/// CouchDB holds, would keep `JOBS` sockets open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_jobs_on_one_source_share_one_watch_socket() {
    deadline(180, "continuous jobs share one watch socket", async {
        const JOBS: usize = 8;
        let pouch = Pouch::start().await;
        pouch.create_db("src").await;
        pouch.put_docs("src", "d", 3).await;
        let relay = TcpCounter::start(pouch.port).await;
        let nodes = Nodes::on_disk();
        let settings = ReplicatorSettings {
            max_jobs: JOBS,
            ..pool_settings()
        };
        let n = nodes.start("n1", settings).await;
        let mut ids = Vec::new();
        for i in 0..JOBS {
            let job = NewJob::transient(ep(&relay.url("src")), ep(&relay.url(&format!("tgt{i}"))))
                .continuous()
                .create_target()
                .doc_ids([format!("x{i:05}")]);
            ids.push(n.add(job).await.unwrap().job_id);
        }
        for id in &ids {
            n.wait(id, WaitFor::Running, Duration::from_secs(60))
                .await
                .unwrap();
        }
        // The jobs' start-up sockets close after the 1 s idle close; the watch stays.
        wait_for(30, "one socket left open", || async {
            (relay.open() == 1).then_some(())
        })
        .await;
        // One write to their documents wakes every job; each copies its own, nothing else.
        pouch.put_docs("src", "x", JOBS).await;
        for i in 0..JOBS {
            pouch
                .wait_count(&format!("tgt{i}"), 1, Duration::from_secs(30))
                .await;
        }
        wait_for(30, "back to one socket", || async {
            (relay.open() == 1).then_some(())
        })
        .await;
        // Writes to documents no job reads wake no read: each job checks its `doc_ids`
        // against the ids the watch saw, and any read would need a new socket. (Only now:
        // pouchdb-server answers the watch's request with its first change, and until the
        // watch has its answer every job reads at a change.)
        let before = relay.accepted();
        pouch.put_docs("src", "other", 3).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(relay.accepted(), before, "jobs read after unrelated writes");
        for id in &ids {
            n.cancel(id).await.unwrap();
            // A cancel returns once the job's actor is gone, idle as the job was.
            assert!(
                n.job_sup().which_child(id.as_str()).is_none(),
                "{id} still runs"
            );
        }
        // The last job gone, the watch's socket closes too.
        wait_for(30, "the watch socket closed", || async {
            (relay.open() == 0).then_some(())
        })
        .await;
        n.shutdown().await;
    })
    .await;
}

/// A burst of jobs opens more sockets than the pool keeps idle; once the burst is over the
/// shared client keeps at most `http_connections` (the job default) idle sockets and closes
/// the rest at once, long before `connection_close_interval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_beyond_the_cap_close_at_once() {
    deadline(180, "idle sockets beyond the cap close at once", async {
        let pouch = Pouch::start().await;
        pouch.create_db("src").await;
        pouch.put_docs("src", "d", 20).await;
        let relay = TcpCounter::start(pouch.port).await;
        let nodes = Nodes::on_disk();
        const CAP: usize = 2;
        let mut settings = ReplicatorSettings {
            connection_close_interval: Duration::from_secs(600),
            max_jobs: 20,
            ..pool_settings()
        };
        settings.job_defaults.http_connections = CAP;
        let n = nodes.start("n1", settings).await;
        const JOBS: usize = 10;
        let mut ids = Vec::new();
        for i in 0..JOBS {
            let job = NewJob::transient(ep(&relay.url("src")), ep(&relay.url(&format!("tgt{i}"))))
                .create_target()
                .worker_processes(2);
            ids.push(n.add(job).await.unwrap().job_id);
        }
        for id in &ids {
            n.wait(id, WaitFor::Completed, Duration::from_secs(120))
                .await
                .unwrap();
        }
        let accepted = relay.accepted();
        assert!(
            accepted > CAP,
            "the burst should need more than {CAP} sockets, it opened {accepted}"
        );
        // Idle close is 10 minutes away: only the cap can bring the count down.
        wait_for(30, "idle sockets down to the cap", || async {
            (relay.open() <= CAP).then_some(())
        })
        .await;
        // Without the cap the surplus would sit idle until pouchdb-server's 5 s keep-alive
        // closed it; with it, we close it as it comes back, so most closes are ours.
        let (ours, total) = (relay.closed_by_client(), relay.accepted() - relay.open());
        assert!(
            ours * 2 > total,
            "{ours} of {total} closed sockets were closed by the replicator"
        );
        n.shutdown().await;
    })
    .await;
}

/// Runs `JOBS` one-shot jobs at once through a fresh relay with the given endpoint gate; the
/// most sockets that were open at once.
async fn burst_peak(pouch: &Pouch, max_requests: usize, tag: &str) -> usize {
    const JOBS: usize = 8;
    let relay = TcpCounter::start(pouch.port).await;
    let nodes = Nodes::on_disk();
    let mut settings = ReplicatorSettings {
        max_jobs: JOBS,
        max_requests_per_endpoint: max_requests,
        ..pool_settings()
    };
    settings.job_defaults.http_connections = GATED_IDLE;
    let n = nodes.start("n1", settings).await;
    let mut ids = Vec::new();
    for i in 0..JOBS {
        let job = NewJob::transient(ep(&relay.url("src")), ep(&relay.url(&format!("{tag}{i}"))))
            .create_target()
            .worker_processes(4)
            .worker_batch_size(1);
        ids.push(n.add(job).await.unwrap().job_id);
    }
    for id in &ids {
        n.wait(id, WaitFor::Completed, Duration::from_secs(120))
            .await
            .unwrap();
    }
    n.shutdown().await;
    relay.peak()
}

/// Idle sockets the gated node's shared client may keep (its jobs' `http_connections`).
const GATED_IDLE: usize = 2;

/// Eight jobs start at once, each with four workers fetching one document per request. With
/// the endpoint's gate at 2, at most 2 buffered requests are in flight, so the sockets open at
/// once are at most those 2, one feed per job, and the idle ones the client keeps; without
/// the gate the same burst opens more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_jobs_keeps_buffered_requests_under_the_endpoint_gate() {
    deadline(
        240,
        "a burst of jobs stays under the endpoint gate",
        async {
            let pouch = Pouch::start().await;
            pouch.create_db("src").await;
            pouch.put_docs("src", "d", 12).await;
            const GATE: usize = 2;
            let gated = burst_peak(&pouch, GATE, "gated").await;
            let open = burst_peak(&pouch, 1000, "open").await;
            eprintln!("peak sockets: gated {gated}, ungated {open}");
            assert!(
                gated <= GATE + 8 + GATED_IDLE,
                "with the gate at {GATE}, {gated} sockets were open at once"
            );
            assert!(
                open > gated,
                "the ungated burst ({open} sockets) should need more than the gated one ({gated})"
            );
        },
    )
    .await;
}
