//! The test harness itself: a pouchdb-server is gone (no orphan process, port closed) once
//! its handle is dropped, also when the test holding it panics; the proxy forwards faithfully.

use std::time::Duration;

use crate::support::couch::Couch;
use crate::support::proxy::FaultProxy;
use crate::support::server::PouchServer;
use crate::support::wait_for;

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

async fn port_closed(port: u16) -> Option<()> {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
        .then_some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_die_with_their_handle_even_on_panic() {
    let s = PouchServer::start().await;
    let (pid, port) = (s.pid(), s.port());
    assert!(alive(pid));
    drop(s);
    wait_for(10, "the dropped server's process to go", || async move {
        (!alive(pid)).then_some(())
    })
    .await;
    wait_for(10, "the dropped server's port to close", || {
        port_closed(port)
    })
    .await;

    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let s = PouchServer::start().await;
        let _ = tx.send((s.pid(), s.port()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        panic!("a failing test holding a server");
    });
    let (pid, port) = rx.await.expect("server started");
    assert!(task.await.unwrap_err().is_panic());
    wait_for(10, "the panicking test's server to go", || async move {
        (!alive(pid)).then_some(())
    })
    .await;
    wait_for(10, "its port to close", || port_closed(port)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_forwards_requests_and_bodies() {
    let s = PouchServer::start().await;
    let p = FaultProxy::start(&s.root()).await;
    let direct = Couch::new(&s.root());
    direct.create_db("db").await;
    let root = p.db_url("").trim_end_matches('/').to_owned();
    let via = Couch::new(&root);
    let (st, v) = via.put_doc("db", "x", &serde_json::json!({"a": 1})).await;
    assert_eq!(st, 201, "{v}");
    let (st, v) = direct.get_doc("db", "x").await;
    assert_eq!((st, v["a"].as_i64()), (200, Some(1)));
    let log = p.requests_to("/db/x");
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].body.as_ref(), br#"{"a":1}"#);
}
