//! The terminate guarantees of the server behaviour: it runs on handler `Err`, on panic, on
//! supervisor shutdown and on `stop`, with a reason telling them apart, and not on `kill`
//! nor when `init` fails.

mod common;

use std::time::Duration;

use common::{Cmd, Log, Probe, deadline, until};
use supervisors::{ChildSpec, Restart, Shutdown, Strategy, Supervisor, start};

async fn lone(log: &Log) -> ractor::ActorRef<Cmd> {
    start(None, Probe::new("p", log), "x".into())
        .await
        .unwrap()
        .0
}

#[tokio::test(start_paused = true)]
async fn terminate_runs_on_handler_error() {
    deadline(async {
        let log = Log::default();
        let p = lone(&log).await;
        ractor::cast!(p, Cmd::Fail).unwrap();
        p.wait(None).await.unwrap();
        assert_eq!(
            log.all(),
            vec!["start p", "terminate p error:boom", "terminated p"]
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn terminate_runs_on_panic() {
    deadline(async {
        let log = Log::default();
        let p = lone(&log).await;
        ractor::cast!(p, Cmd::Panic).unwrap();
        p.wait(None).await.unwrap();
        assert_eq!(
            log.all(),
            vec!["start p", "terminate p error:panic: kaboom", "terminated p"]
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn terminate_runs_on_stop_with_reason_normal() {
    deadline(async {
        let log = Log::default();
        // Stopped by itself...
        let p = lone(&log).await;
        ractor::cast!(p, Cmd::Stop).unwrap();
        p.wait(None).await.unwrap();
        // ...and by another actor.
        let q = lone(&log).await;
        q.stop_and_wait(None, None).await.unwrap();
        assert_eq!(
            log.all(),
            vec![
                "start p",
                "terminate p normal",
                "terminated p",
                "start p",
                "terminate p normal",
                "terminated p"
            ]
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn terminate_does_not_run_on_kill() {
    deadline(async {
        let log = Log::default();
        let p = lone(&log).await;
        p.kill_and_wait(None).await.unwrap();
        // Give a (wrong) terminate every chance to show up.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(log.all(), vec!["start p"]);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn terminate_does_not_run_when_init_fails() {
    deadline(async {
        let log = Log::default();
        let probe = Probe::new("p", &log).failing_inits(1);
        assert!(start(None, probe, "x".into()).await.is_err());
        assert_eq!(log.all(), vec!["init-fail p"]);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn terminate_runs_on_supervisor_shutdown_with_reason_shutdown() {
    deadline(async {
        let log = Log::default();
        let sup = Supervisor::new(Strategy::OneForOne)
            .child(ChildSpec::server("a", Probe::new("a", &log), |_| {
                "x".into()
            }))
            .start()
            .await
            .unwrap();
        sup.stop().await;
        assert_eq!(
            log.all(),
            vec!["start a", "terminate a shutdown", "terminated a"]
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn brutal_shutdown_is_a_kill_without_terminate() {
    deadline(async {
        let log = Log::default();
        let sup = Supervisor::new(Strategy::OneForOne)
            .child(
                ChildSpec::server("a", Probe::new("a", &log), |_| "x".into())
                    .shutdown(Shutdown::Brutal),
            )
            .start()
            .await
            .unwrap();
        sup.stop().await;
        assert_eq!(log.all(), vec!["start a"]);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn supervised_child_terminates_with_error_before_the_supervisor_restarts_it() {
    deadline(async {
        let log = Log::default();
        let sup = Supervisor::new(Strategy::OneForOne)
            .child(
                ChildSpec::server("a", Probe::new("a", &log), |_| "x".into())
                    .restart(Restart::Permanent),
            )
            .start()
            .await
            .unwrap();
        ractor::cast!(sup.which_child::<Cmd>("a").unwrap(), Cmd::Fail).unwrap();
        until("restarted", || log.count("start a") == 2).await;
        assert_eq!(
            log.all(),
            vec![
                "start a",
                "terminate a error:boom",
                "terminated a",
                "start a"
            ]
        );
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_terminate_is_contained() {
    use ractor::ActorRef;
    use supervisors::{BoxError, ExitReason, Server};

    #[derive(Clone)]
    struct Bad;
    impl Server for Bad {
        type Msg = ();
        type State = ();
        type Args = ();
        async fn init(&self, _: ActorRef<()>, _: ()) -> Result<(), BoxError> {
            Ok(())
        }
        async fn handle(&self, _: ActorRef<()>, _: (), _: &mut ()) -> Result<(), BoxError> {
            Ok(())
        }
        async fn terminate(&self, _: ActorRef<()>, _: (), _: ExitReason) {
            panic!("terminate blew up");
        }
    }
    deadline(async {
        let (a, handle) = start(None, Bad, ()).await.unwrap();
        a.stop(None);
        // The actor still exits cleanly (its task does not propagate the panic).
        handle.await.unwrap();
        assert_eq!(a.get_status(), ractor::ActorStatus::Stopped);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn killing_a_supervisor_kills_its_children_without_terminate() {
    deadline(async {
        let log = Log::default();
        let sup = Supervisor::new(Strategy::OneForOne)
            .child(ChildSpec::server("a", Probe::new("a", &log), |_| {
                "x".into()
            }))
            .child(ChildSpec::server("b", Probe::new("b", &log), |_| {
                "x".into()
            }))
            .start()
            .await
            .unwrap();
        let a = sup.which_child::<Cmd>("a").unwrap();
        let b = sup.which_child::<Cmd>("b").unwrap();
        sup.actor().kill();
        sup.wait().await;
        // ractor tears linked children down with the killed parent: none is leaked, and (a
        // kill being a kill) none runs terminate.
        a.wait(None).await.unwrap();
        b.wait(None).await.unwrap();
        assert_eq!(a.get_status(), ractor::ActorStatus::Stopped);
        assert_eq!(b.get_status(), ractor::ActorStatus::Stopped);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(log.all(), vec!["start a", "start b"]);
    })
    .await;
}
