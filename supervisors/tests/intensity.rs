//! Restart intensity: exactly `max_restarts` within the period is fine, one more fails the
//! supervisor (children stopped in reverse order, failure reported to its parent), and old
//! restarts age out of the window. Paused time makes the window exact.

mod common;

use std::time::Duration;

use common::{Cmd, Log, Probe, deadline, until};
use ractor::ActorStatus;
use supervisors::{ChildSpec, Strategy, Supervisor, SupervisorRef};

fn spec(log: &Log) -> Supervisor {
    Supervisor::new(Strategy::OneForOne)
        .intensity(3, Duration::from_secs(10))
        .child(ChildSpec::server("a", Probe::new("a", log), |_| "x".into()))
        .child(ChildSpec::server("b", Probe::new("b", log), |_| "x".into()))
        .child(ChildSpec::server("c", Probe::new("c", log), |_| "x".into()))
}

/// Crash `b` and wait for its restart.
async fn crash_b(sup: &SupervisorRef, log: &Log) {
    let starts = log.count("start b");
    ractor::cast!(sup.which_child::<Cmd>("b").unwrap(), Cmd::Fail).unwrap();
    until("b restarted", || {
        log.count("start b") == starts + 1 && sup.which_child::<Cmd>("b").is_some()
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn exactly_max_restarts_is_allowed() {
    deadline(async {
        let log = Log::default();
        let sup = spec(&log).start().await.unwrap();
        for _ in 0..3 {
            crash_b(&sup, &log).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(sup.actor().get_status(), ActorStatus::Running);
        assert_eq!(sup.which_children(), vec!["a", "b", "c"]);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn one_past_the_limit_stops_children_in_reverse_and_fails() {
    deadline(async {
        let log = Log::default();
        let sup = spec(&log).start().await.unwrap();
        for _ in 0..3 {
            crash_b(&sup, &log).await;
        }
        log.take();
        ractor::cast!(sup.which_child::<Cmd>("b").unwrap(), Cmd::Fail).unwrap();
        sup.wait().await;
        assert_eq!(
            log.all(),
            vec![
                "terminate b error:boom",
                "terminated b",
                "terminate c shutdown",
                "terminated c",
                "terminate a shutdown",
                "terminated a",
            ]
        );
        assert!(sup.which_children().is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn restarts_age_out_of_the_window() {
    deadline(async {
        let log = Log::default();
        let sup = spec(&log).start().await.unwrap();
        // Three restarts at t=0, then 10.5 s later three more: each batch alone is at the
        // limit, and the first batch has aged out when the second comes.
        for _ in 0..3 {
            crash_b(&sup, &log).await;
        }
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        for _ in 0..3 {
            crash_b(&sup, &log).await;
        }
        assert_eq!(sup.actor().get_status(), ActorStatus::Running);
        // But a 4th within this window is one too many.
        ractor::cast!(sup.which_child::<Cmd>("a").unwrap(), Cmd::Fail).unwrap();
        sup.wait().await;
        assert_eq!(log.count("start b"), 7);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_restart_exactly_one_period_old_still_counts() {
    deadline(async {
        let log = Log::default();
        let sup = Supervisor::new(Strategy::OneForOne)
            .intensity(1, Duration::from_secs(10))
            .child(ChildSpec::server("b", Probe::new("b", &log), |_| {
                "x".into()
            }))
            .start()
            .await
            .unwrap();
        let t0 = tokio::time::Instant::now();
        crash_b(&sup, &log).await;
        // Second crash exactly 10 s after the first restart: OTP counts it (`=<` period).
        tokio::time::sleep_until(t0 + Duration::from_secs(10)).await;
        ractor::cast!(sup.which_child::<Cmd>("b").unwrap(), Cmd::Fail).unwrap();
        sup.wait().await;
        assert_eq!(log.count("start b"), 2);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_supervisor_is_restarted_by_its_parent() {
    deadline(async {
        let log = Log::default();
        let inner = Supervisor::new(Strategy::OneForOne)
            .intensity(0, Duration::from_secs(5))
            .child(ChildSpec::server("w", Probe::new("w", &log), |_| {
                "x".into()
            }));
        let inner_children = inner.children();
        let top = Supervisor::new(Strategy::OneForOne)
            .child(inner.into_child_spec("inner"))
            .start()
            .await
            .unwrap();
        let first = top.children().cell("inner").unwrap();
        // Intensity 0: the first crash of w is already one too many for `inner`.
        ractor::cast!(inner_children.get::<Cmd>("w").unwrap(), Cmd::Fail).unwrap();
        until("inner restarted by top", || {
            top.children()
                .cell("inner")
                .is_some_and(|c| c.get_id() != first.get_id())
                && inner_children.get::<Cmd>("w").is_some()
        })
        .await;
        assert_eq!(log.count("start w"), 2);
        top.stop().await;
        assert_eq!(log.count("terminate w shutdown"), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_child_that_keeps_failing_to_restart_exhausts_the_intensity() {
    deadline(async {
        let log = Log::default();
        let flaky = Probe::new("b", &log);
        let sup = Supervisor::new(Strategy::OneForOne)
            .intensity(3, Duration::from_secs(10))
            .child(ChildSpec::server("a", Probe::new("a", &log), |_| {
                "x".into()
            }))
            .child(ChildSpec::server("b", flaky.clone(), |_| "x".into()))
            .start()
            .await
            .unwrap();
        // From now on b's init fails: 1 restart for the crash + 3 failed starts = 4 > 3.
        flaky
            .fail_inits
            .store(100, std::sync::atomic::Ordering::SeqCst);
        ractor::cast!(sup.which_child::<Cmd>("b").unwrap(), Cmd::Fail).unwrap();
        sup.wait().await;
        assert_eq!(log.count("init-fail b"), 3);
        assert_eq!(log.count("terminate a shutdown"), 1);
    })
    .await;
}
