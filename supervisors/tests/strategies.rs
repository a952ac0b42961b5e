//! Supervisor strategies: one_for_one, one_for_all, rest_for_one (the 4-child tree with the
//! exact event sequence), and lookups after restarts.

mod common;

use common::{Cmd, Log, Probe, deadline, lifecycle, ping, until};
use ractor::ActorId;
use supervisors::{ChildSpec, Strategy, Supervisor, SupervisorRef};

async fn tree(strategy: Strategy, names: &[&str], log: &Log) -> SupervisorRef {
    let mut sup = Supervisor::new(strategy);
    for name in names {
        sup = sup.child(ChildSpec::server(*name, Probe::new(name, log), |_| {
            "x".to_string()
        }));
    }
    sup.start().await.unwrap()
}

fn ids(sup: &SupervisorRef, names: &[&str]) -> Vec<ActorId> {
    names
        .iter()
        .map(|n| sup.which_child::<Cmd>(n).unwrap().get_id())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn children_start_in_order() {
    deadline(async {
        let log = Log::default();
        let sup = tree(Strategy::OneForOne, &["a", "b", "c"], &log).await;
        assert_eq!(log.all(), vec!["start a", "start b", "start c"]);
        assert_eq!(sup.which_children(), vec!["a", "b", "c"]);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn one_for_one_restarts_only_the_crashed_child() {
    deadline(async {
        let log = Log::default();
        let names = ["a", "b", "c"];
        let sup = tree(Strategy::OneForOne, &names, &log).await;
        let before = ids(&sup, &names);
        log.take();
        ractor::cast!(sup.which_child::<Cmd>("b").unwrap(), Cmd::Fail).unwrap();
        until("b back", || log.count("start b") == 1).await;
        assert_eq!(lifecycle(&log), vec!["terminate b error:boom", "start b"]);
        let after = ids(&sup, &names);
        assert_eq!(after[0], before[0]);
        assert_ne!(after[1], before[1], "lookup returns the new b");
        assert_eq!(after[2], before[2]);
        let b = sup.which_child::<Cmd>("b").unwrap();
        assert_eq!(ping(&b).await.1, 2, "the new b answers, second start");
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn one_for_all_restarts_everyone_stopping_in_reverse_and_starting_in_order() {
    deadline(async {
        let log = Log::default();
        let names = ["a", "b", "c"];
        let sup = tree(Strategy::OneForAll, &names, &log).await;
        let before = ids(&sup, &names);
        log.take();
        ractor::cast!(sup.which_child::<Cmd>("b").unwrap(), Cmd::Panic).unwrap();
        until("all back", || log.count("start c") == 1).await;
        assert_eq!(
            lifecycle(&log),
            vec![
                "terminate b error:panic: kaboom",
                "terminate c shutdown",
                "terminate a shutdown",
                "start a",
                "start b",
                "start c",
            ]
        );
        let after = ids(&sup, &names);
        assert!(before.iter().zip(&after).all(|(x, y)| x != y));
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn rest_for_one_tree_of_four_where_the_second_crashes() {
    deadline(async {
        let log = Log::default();
        let names = ["one", "two", "three", "four"];
        let sup = tree(Strategy::RestForOne, &names, &log).await;
        let before = ids(&sup, &names);
        log.take();
        ractor::cast!(sup.which_child::<Cmd>("two").unwrap(), Cmd::Fail).unwrap();
        until("four back", || log.count("start four") == 1).await;
        // Exact sequence: two terminates on its error; four then three are shut down (reverse
        // order, each finishing its terminate before the next starts); then two, three, four
        // start in order. one is untouched.
        assert_eq!(
            log.all(),
            vec![
                "terminate two error:boom",
                "terminated two",
                "terminate four shutdown",
                "terminated four",
                "terminate three shutdown",
                "terminated three",
                "start two",
                "start three",
                "start four",
            ]
        );
        let after = ids(&sup, &names);
        assert_eq!(after[0], before[0], "one untouched");
        for i in 1..4 {
            assert_ne!(after[i], before[i], "{} is a new actor", names[i]);
        }
        for name in &names[1..] {
            let child = sup.which_child::<Cmd>(name).unwrap();
            assert_eq!(ping(&child).await, (format!("{name}:x"), 2));
        }
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn rest_for_one_crash_of_the_last_child_touches_nobody_else() {
    deadline(async {
        let log = Log::default();
        let names = ["a", "b", "c"];
        let sup = tree(Strategy::RestForOne, &names, &log).await;
        log.take();
        sup.which_child::<Cmd>("c").unwrap().kill();
        until("c back", || log.count("start c") == 1).await;
        assert_eq!(lifecycle(&log), vec!["start c"]);
        sup.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn child_handle_follows_restarts_and_is_empty_while_down() {
    deadline(async {
        let log = Log::default();
        let sup = tree(Strategy::OneForOne, &["a"], &log).await;
        let handle = sup.children().handle::<Cmd>("a");
        let first = handle.get().unwrap();
        first.kill();
        first.wait(None).await.unwrap();
        until("a back", || {
            handle.get().is_some_and(|a| a.get_id() != first.get_id())
        })
        .await;
        handle.cast(Cmd::Stop).unwrap();
        until("a back again", || log.count("start a") == 3).await;
        assert_eq!(ping(&handle.get().unwrap()).await.1, 3);
        // Wrong message type: not found.
        assert!(sup.which_child::<String>("a").is_none());
        assert!(sup.which_child::<Cmd>("nope").is_none());
        sup.stop().await;
        assert!(handle.get().is_none());
        assert!(handle.cast(Cmd::Stop).is_err());
    })
    .await;
}
