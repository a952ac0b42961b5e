//! Restart types under a Supervisor: permanent, transient, temporary, for each way a child
//! can end (error, kill, normal stop).

mod common;

use std::time::Duration;

use common::{Cmd, Log, Probe, deadline, until};
use supervisors::{ChildSpec, Restart, Strategy, Supervisor, SupervisorRef};

async fn one(restart: Restart, log: &Log) -> SupervisorRef {
    Supervisor::new(Strategy::OneForOne)
        .intensity(10, Duration::from_secs(5))
        .child(ChildSpec::server("a", Probe::new("a", log), |_| "x".into()).restart(restart))
        .child(ChildSpec::server("z", Probe::new("z", log), |_| "x".into()))
        .start()
        .await
        .unwrap()
}

fn a(sup: &SupervisorRef) -> ractor::ActorRef<Cmd> {
    sup.which_child::<Cmd>("a").unwrap()
}

/// Let any (wrong) restart happen before asserting there was none.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn permanent_restarts_after_error_kill_and_normal_stop() {
    deadline(async {
        let log = Log::default();
        let sup = one(Restart::Permanent, &log).await;
        ractor::cast!(a(&sup), Cmd::Fail).unwrap();
        until("2nd start", || {
            log.count("start a") == 2 && sup.which_child::<Cmd>("a").is_some()
        })
        .await;
        a(&sup).kill();
        until("3rd start", || {
            log.count("start a") == 3 && sup.which_child::<Cmd>("a").is_some()
        })
        .await;
        ractor::cast!(a(&sup), Cmd::Stop).unwrap();
        until("4th start", || {
            log.count("start a") == 4 && sup.which_child::<Cmd>("a").is_some()
        })
        .await;
        assert_eq!(sup.which_children(), vec!["a", "z"]);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn transient_restarts_after_error_and_kill_but_not_after_normal_stop() {
    deadline(async {
        let log = Log::default();
        let sup = one(Restart::Transient, &log).await;
        ractor::cast!(a(&sup), Cmd::Panic).unwrap();
        until("2nd start", || {
            log.count("start a") == 2 && sup.which_child::<Cmd>("a").is_some()
        })
        .await;
        a(&sup).kill();
        until("3rd start", || {
            log.count("start a") == 3 && sup.which_child::<Cmd>("a").is_some()
        })
        .await;
        let last = a(&sup);
        ractor::cast!(last, Cmd::Stop).unwrap();
        last.wait(None).await.unwrap();
        settle().await;
        assert_eq!(log.count("start a"), 3);
        assert_eq!(sup.which_children(), vec!["z"]);
        // Still known (a transient child that stopped normally stays in the spec, like OTP).
        assert_eq!(sup.children().ids(), vec!["a", "z"]);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn temporary_is_never_restarted_and_is_forgotten() {
    deadline(async {
        let log = Log::default();
        let sup = one(Restart::Temporary, &log).await;
        ractor::cast!(a(&sup), Cmd::Fail).unwrap();
        until("a gone", || sup.children().ids() == vec!["z"]).await;
        settle().await;
        assert_eq!(log.count("start a"), 1);
        assert_eq!(log.count("terminate a error:boom"), 1);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn temporary_sibling_is_dropped_by_a_one_for_all_restart() {
    deadline(async {
        let log = Log::default();
        let sup = Supervisor::new(Strategy::OneForAll)
            .child(ChildSpec::server("a", Probe::new("a", &log), |_| {
                "x".into()
            }))
            .child(
                ChildSpec::server("t", Probe::new("t", &log), |_| "x".into())
                    .restart(Restart::Temporary),
            )
            .start()
            .await
            .unwrap();
        ractor::cast!(a(&sup), Cmd::Fail).unwrap();
        until("a back", || {
            log.count("start a") == 2 && sup.which_child::<Cmd>("a").is_some()
        })
        .await;
        settle().await;
        assert_eq!(log.count("terminate t shutdown"), 1);
        assert_eq!(log.count("start t"), 1, "temporary not restarted");
        assert_eq!(sup.children().ids(), vec!["a"]);
        sup.stop().await;
    })
    .await;
}
