//! DynamicSupervisor: start/lookup/terminate by id, max_children, restart types, intensity,
//! shutdown of all children, the exit listener, and nesting under a Supervisor.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Cmd, Log, Probe, deadline, lifecycle, ping, until};
use supervisors::{
    ChildExit, DynamicSupervisor, ExitReason, Restart, Shutdown, Strategy, Supervisor,
    SupervisorError,
};

fn dynsup(log: &Log) -> DynamicSupervisor<String, Cmd> {
    DynamicSupervisor::server(Probe::new("job", log))
}

#[tokio::test(start_paused = true)]
async fn start_lookup_terminate_by_id() {
    deadline(async {
        let log = Log::default();
        let sup = dynsup(&log).start().await.unwrap();
        let a = sup.start_child("a", "argA".into()).await.unwrap();
        let b = sup.start_child("b", "argB".into()).await.unwrap();
        assert_eq!(ping(&a).await.0, "job:argA");
        assert_eq!(
            sup.which_child("b").unwrap().get_id(),
            b.get_id(),
            "lookup returns the started actor"
        );
        assert_eq!(sup.which_children(), vec!["a", "b"]);
        assert_eq!(sup.count(), 2);

        sup.terminate_child("a").await.unwrap();
        assert!(sup.which_child("a").is_none());
        assert_eq!(sup.which_children(), vec!["b"]);
        assert!(lifecycle(&log).contains(&"terminate job shutdown".to_string()));
        // The id is free again, and unknown ids are reported.
        assert!(matches!(
            sup.terminate_child("a").await,
            Err(SupervisorError::NotFound(id)) if id == "a"
        ));
        let a2 = sup.start_child("a", "again".into()).await.unwrap();
        assert_ne!(a2.get_id(), a.get_id());
        assert_eq!(ping(&a2).await.0, "job:again");
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn duplicate_ids_and_max_children_are_refused() {
    deadline(async {
        let log = Log::default();
        let sup = dynsup(&log).max_children(2).start().await.unwrap();
        sup.start_child("a", "x".into()).await.unwrap();
        assert!(matches!(
            sup.start_child("a", "x".into()).await,
            Err(SupervisorError::AlreadyExists(id)) if id == "a"
        ));
        sup.start_child("b", "x".into()).await.unwrap();
        assert!(matches!(
            sup.start_child("c", "x".into()).await,
            Err(SupervisorError::Full { max: 2 })
        ));
        assert_eq!(sup.count(), 2);
        // A slot frees up when a (temporary) child exits.
        ractor::cast!(sup.which_child("a").unwrap(), Cmd::Stop).unwrap();
        until("a gone", || sup.count() == 1).await;
        sup.start_child("c", "x".into()).await.unwrap();
        assert_eq!(sup.which_children(), vec!["b", "c"]);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn failed_init_is_reported_and_not_kept() {
    deadline(async {
        let log = Log::default();
        let probe = Probe::new("job", &log).failing_inits(1);
        let sup = DynamicSupervisor::server(probe).start().await.unwrap();
        match sup.start_child("a", "x".into()).await {
            Err(SupervisorError::ChildStart { id, reason }) => {
                assert_eq!(id, "a");
                assert!(reason.contains("init refused"), "{reason}");
            }
            other => panic!("expected ChildStart, got {other:?}"),
        }
        assert_eq!(sup.count(), 0);
        assert!(sup.start_child("a", "x".into()).await.is_ok());
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn temporary_children_are_never_restarted_and_the_listener_hears_every_exit() {
    deadline(async {
        let log = Log::default();
        let exits: Arc<Mutex<Vec<ChildExit>>> = Arc::default();
        let seen = exits.clone();
        let sup = dynsup(&log)
            .on_exit(move |e| seen.lock().unwrap().push(e))
            .start()
            .await
            .unwrap();
        let a = sup.start_child("a", "x".into()).await.unwrap();
        let b = sup.start_child("b", "x".into()).await.unwrap();
        let c = sup.start_child("c", "x".into()).await.unwrap();
        ractor::cast!(a, Cmd::Fail).unwrap();
        ractor::cast!(b, Cmd::Stop).unwrap();
        until("a, b gone", || sup.count() == 1).await;
        sup.terminate_child("c").await.unwrap();
        assert_eq!(sup.count(), 0);
        assert_eq!(log.count("start job"), 3, "nothing restarted");
        let exits = exits.lock().unwrap().clone();
        let find = |id: &str| exits.iter().find(|e| e.id == id).cloned().unwrap();
        assert_eq!(find("a").reason, ExitReason::Error("boom".into()));
        assert_eq!(find("a").actor, a.get_id());
        assert_eq!(find("b").reason, ExitReason::Normal);
        assert_eq!(find("c").reason, ExitReason::Shutdown);
        assert_eq!(find("c").actor, c.get_id());
        assert!(exits.iter().all(|e| !e.restarting));
        assert_eq!(exits.len(), 3);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn permanent_children_restart_with_their_args_and_lookup_finds_the_new_actor() {
    deadline(async {
        let log = Log::default();
        let sup = dynsup(&log)
            .restart(Restart::Permanent)
            .intensity(10, Duration::from_secs(5))
            .start()
            .await
            .unwrap();
        let a = sup.start_child("a", "argA".into()).await.unwrap();
        ractor::cast!(a, Cmd::Panic).unwrap();
        until("a restarted", || {
            sup.which_child("a")
                .is_some_and(|n| n.get_id() != a.get_id())
        })
        .await;
        let a2 = sup.which_child("a").unwrap();
        assert_eq!(ping(&a2).await, ("job:argA".to_string(), 2));
        // A normal exit restarts a permanent child too.
        ractor::cast!(a2, Cmd::Stop).unwrap();
        until("a restarted again", || {
            sup.which_child("a")
                .is_some_and(|n| n.get_id() != a2.get_id())
        })
        .await;
        assert_eq!(ping(&sup.which_child("a").unwrap()).await.1, 3);
        // terminate_child is final even for a permanent child.
        sup.terminate_child("a").await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(sup.count(), 0);
        assert_eq!(log.count("start job"), 3);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn transient_children_restart_only_after_abnormal_exits() {
    deadline(async {
        let log = Log::default();
        let sup = dynsup(&log)
            .restart(Restart::Transient)
            .start()
            .await
            .unwrap();
        let a = sup.start_child("a", "x".into()).await.unwrap();
        a.kill();
        until("a restarted after kill", || {
            sup.which_child("a")
                .is_some_and(|n| n.get_id() != a.get_id())
        })
        .await;
        ractor::cast!(sup.which_child("a").unwrap(), Cmd::Stop).unwrap();
        until("a gone after normal stop", || sup.count() == 0).await;
        assert_eq!(log.count("start job"), 2);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn restart_delay_postpones_the_restart() {
    deadline(async {
        let log = Log::default();
        let sup = dynsup(&log)
            .restart(Restart::Permanent)
            .restart_delay(Duration::from_secs(10))
            .start()
            .await
            .unwrap();
        let a = sup.start_child("a", "x".into()).await.unwrap();
        let t0 = tokio::time::Instant::now();
        ractor::cast!(a, Cmd::Fail).unwrap();
        until("a down", || sup.which_child("a").is_none()).await;
        assert_eq!(sup.count(), 1, "still known while awaiting restart");
        until("a back", || sup.which_child("a").is_some()).await;
        assert!(
            t0.elapsed() >= Duration::from_secs(10),
            "{:?}",
            t0.elapsed()
        );
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn intensity_exceeded_stops_children_and_fails() {
    deadline(async {
        let log = Log::default();
        let sup = dynsup(&log)
            .restart(Restart::Permanent)
            .intensity(2, Duration::from_secs(10))
            .start()
            .await
            .unwrap();
        sup.start_child("a", "x".into()).await.unwrap();
        sup.start_child("b", "x".into()).await.unwrap();
        for n in 0..2 {
            let a = sup.which_child("a").unwrap();
            ractor::cast!(a, Cmd::Fail).unwrap();
            until("a restarted", || {
                sup.which_child("a")
                    .is_some_and(|x| x.get_id() != a.get_id())
            })
            .await;
            assert_eq!(log.count("start job"), 3 + n);
        }
        let actor = sup.actor().unwrap();
        ractor::cast!(sup.which_child("a").unwrap(), Cmd::Fail).unwrap();
        sup.wait().await;
        assert_eq!(actor.get_status(), ractor::ActorStatus::Stopped);
        assert_eq!(log.count("terminate job shutdown"), 1, "b was shut down");
        assert_eq!(sup.count(), 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn stop_shuts_every_child_down_and_kills_the_stuck_one() {
    deadline(async {
        let log = Log::default();
        let slow = Probe::new("slow", &log).slow_terminate(Duration::from_secs(60));
        let sup = DynamicSupervisor::server(slow)
            .shutdown(Shutdown::Timeout(Duration::from_secs(2)))
            .start()
            .await
            .unwrap();
        for id in ["a", "b", "c"] {
            sup.start_child(id, "x".into()).await.unwrap();
        }
        let t0 = tokio::time::Instant::now();
        sup.stop().await;
        // In parallel: all three began terminating, none finished, all killed after ~2 s.
        assert_eq!(log.count("terminate slow shutdown"), 3);
        assert_eq!(log.count("terminated slow"), 0);
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(4),
            "{took:?}"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn terminate_child_kills_a_child_that_ignores_shutdown() {
    deadline(async {
        let log = Log::default();
        let sup = dynsup(&log)
            .shutdown(Shutdown::Timeout(Duration::from_secs(1)))
            .start()
            .await
            .unwrap();
        let a = sup.start_child("a", "x".into()).await.unwrap();
        // Busy in a handler for an hour: the stop cannot be taken.
        ractor::cast!(a, Cmd::Block(Duration::from_secs(3600))).unwrap();
        tokio::task::yield_now().await;
        let t0 = tokio::time::Instant::now();
        sup.terminate_child("a").await.unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!(a.get_status(), ractor::ActorStatus::Stopped);
        assert_eq!(
            log.count("terminate job shutdown"),
            0,
            "killed: no terminate"
        );
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn nested_under_a_supervisor_and_found_after_its_restart() {
    deadline(async {
        let log = Log::default();
        let dynamic = dynsup(&log);
        let top =
            Supervisor::new(Strategy::OneForOne).child(dynamic.clone().into_child_spec("jobs"));
        let parent = top.children();
        let jobs = dynamic.handle_in(&parent, "jobs");
        let top = top.start().await.unwrap();
        jobs.start_child("a", "x".into()).await.unwrap();
        let first = jobs.actor().unwrap();
        first.kill();
        until("jobs restarted", || {
            jobs.actor().is_some_and(|a| a.get_id() != first.get_id())
        })
        .await;
        assert_eq!(jobs.count(), 0, "dynamic children do not survive a restart");
        jobs.start_child("b", "x".into()).await.unwrap();
        assert_eq!(jobs.which_children(), vec!["b"]);
        top.stop().await;
        assert_eq!(
            log.count("terminate job shutdown"),
            1,
            "b shut down with the tree"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_child_awaiting_restart_still_counts_and_can_be_terminated() {
    deadline(async {
        let log = Log::default();
        let sup = dynsup(&log)
            .restart(Restart::Permanent)
            .restart_delay(Duration::from_secs(30))
            .max_children(1)
            .start()
            .await
            .unwrap();
        let a = sup.start_child("a", "x".into()).await.unwrap();
        ractor::cast!(a, Cmd::Fail).unwrap();
        until("a down", || sup.which_child("a").is_none()).await;
        assert!(matches!(
            sup.start_child("b", "x".into()).await,
            Err(SupervisorError::Full { max: 1 })
        ));
        // Terminating it while it waits cancels the restart.
        sup.terminate_child("a").await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(log.count("start job"), 1);
        assert_eq!(sup.count(), 0);
        sup.start_child("b", "x".into()).await.unwrap();
        sup.stop().await;
    })
    .await;
}
