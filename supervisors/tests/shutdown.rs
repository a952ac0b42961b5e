//! Shutdown: reverse order (also through nested supervisors), the shutdown timeout killing a
//! child stuck in terminate or in a handler, `Infinity` waiting, a failed child start
//! aborting the supervisor's start, and the restart delay.

mod common;

use std::time::Duration;

use common::{Cmd, Log, Probe, deadline, lifecycle, until};
use supervisors::{ChildSpec, Shutdown, Strategy, Supervisor, SupervisorError};

fn child(name: &str, log: &Log) -> ChildSpec {
    ChildSpec::server(name, Probe::new(name, log), |_| "x".into())
}

#[tokio::test(start_paused = true)]
async fn stop_shuts_children_down_in_reverse_order_through_nested_supervisors() {
    deadline(async {
        let log = Log::default();
        let inner = Supervisor::new(Strategy::OneForAll)
            .child(child("x", &log))
            .child(child("y", &log));
        let sup = Supervisor::new(Strategy::RestForOne)
            .child(child("a", &log))
            .child(inner.into_child_spec("inner"))
            .child(child("b", &log))
            .start()
            .await
            .unwrap();
        assert_eq!(log.take(), vec!["start a", "start x", "start y", "start b"]);
        sup.stop().await;
        assert_eq!(
            log.all(),
            vec![
                "terminate b shutdown",
                "terminated b",
                "terminate y shutdown",
                "terminated y",
                "terminate x shutdown",
                "terminated x",
                "terminate a shutdown",
                "terminated a",
            ]
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_timeout_kills_a_child_stuck_in_terminate() {
    deadline(async {
        let log = Log::default();
        let stuck = Probe::new("stuck", &log).slow_terminate(Duration::from_secs(3600));
        let sup = Supervisor::new(Strategy::OneForOne)
            .child(child("a", &log))
            .child(
                ChildSpec::server("stuck", stuck, |_| "x".into())
                    .shutdown(Shutdown::Timeout(Duration::from_secs(2))),
            )
            .start()
            .await
            .unwrap();
        let t0 = tokio::time::Instant::now();
        sup.stop().await;
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert_eq!(
            lifecycle(&log)[2..],
            ["terminate stuck shutdown", "terminate a shutdown"]
        );
        assert_eq!(log.count("terminated stuck"), 0, "killed mid-terminate");
        assert_eq!(log.count("terminated a"), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_timeout_kills_a_child_busy_in_a_handler() {
    deadline(async {
        let log = Log::default();
        let sup = Supervisor::new(Strategy::OneForOne)
            .child(child("busy", &log).shutdown(Shutdown::Timeout(Duration::from_secs(1))))
            .start()
            .await
            .unwrap();
        let busy = sup.which_child::<Cmd>("busy").unwrap();
        ractor::cast!(busy, Cmd::Block(Duration::from_secs(3600))).unwrap();
        tokio::task::yield_now().await;
        let t0 = tokio::time::Instant::now();
        sup.stop().await;
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!(
            log.count("terminate busy shutdown"),
            0,
            "killed: no terminate"
        );
        assert_eq!(busy.get_status(), ractor::ActorStatus::Stopped);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn infinity_waits_for_a_slow_terminate() {
    deadline(async {
        let log = Log::default();
        let slow = Probe::new("slow", &log).slow_terminate(Duration::from_secs(60));
        let sup = Supervisor::new(Strategy::OneForOne)
            .child(ChildSpec::server("slow", slow, |_| "x".into()).shutdown(Shutdown::Infinity))
            .start()
            .await
            .unwrap();
        let t0 = tokio::time::Instant::now();
        sup.stop().await;
        assert!(t0.elapsed() >= Duration::from_secs(60));
        assert_eq!(log.count("terminated slow"), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_child_failing_to_start_aborts_the_start_and_stops_the_earlier_ones() {
    deadline(async {
        let log = Log::default();
        let bad = Probe::new("bad", &log).failing_inits(1);
        let started = Supervisor::new(Strategy::OneForOne)
            .child(child("a", &log))
            .child(child("b", &log))
            .child(ChildSpec::server("bad", bad, |_| "x".into()))
            .child(child("never", &log))
            .start()
            .await;
        match started {
            Err(SupervisorError::ChildStart { id, reason }) => {
                assert_eq!(id, "bad");
                assert!(reason.contains("init refused"), "{reason}");
            }
            other => panic!("expected ChildStart, got {other:?}"),
        }
        assert_eq!(
            lifecycle(&log),
            vec![
                "start a",
                "start b",
                "terminate b shutdown",
                "terminate a shutdown"
            ]
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn duplicate_child_ids_are_refused() {
    deadline(async {
        let log = Log::default();
        let started = Supervisor::new(Strategy::OneForOne)
            .child(child("a", &log))
            .child(child("a", &log))
            .start()
            .await;
        assert!(matches!(started, Err(SupervisorError::ChildStart { id, .. }) if id == "a"));
        assert!(log.all().is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn restart_delay_postpones_restarts() {
    deadline(async {
        let log = Log::default();
        let sup = Supervisor::new(Strategy::RestForOne)
            .restart_delay(Duration::from_secs(5))
            .child(child("a", &log))
            .child(child("b", &log))
            .start()
            .await
            .unwrap();
        let t0 = tokio::time::Instant::now();
        ractor::cast!(sup.which_child::<Cmd>("a").unwrap(), Cmd::Fail).unwrap();
        until("both down", || sup.which_children().is_empty()).await;
        until("both back", || sup.which_children().len() == 2).await;
        assert!(t0.elapsed() >= Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(
            lifecycle(&log)[2..],
            [
                "terminate a error:boom",
                "terminate b shutdown",
                "start a",
                "start b"
            ]
        );
        sup.stop().await;
    })
    .await;
}
