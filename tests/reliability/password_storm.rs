//! A burst of wrong passwords does not stall the node (RELIABILITY.md "Inbound"): PBKDF2
//! runs on the blocking pool, so while 200 wrong-password requests (known and unknown names,
//! the lockout off so every one is hashed) queue for it, `GET /_up` keeps answering at once.
//! Before, hashing ran on the async runtime: `_up` took 2.8 s under 60 such requests.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::deadline;
use crate::support::serve::spawn_serve;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_answers_at_once_while_wrong_passwords_are_hashed() {
    deadline(240, "_up under a password storm", async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("node.ini");
        // Fewer rounds than CouchDB's 600,000 keep the test short in a debug build; each
        // hash still takes tens of milliseconds, and 200 of them queue for one thread.
        std::fs::write(
            &cfg,
            "[admins]\nadmin = secret\n[users]\nbob = bob-secret\n\
             [chttpd_auth]\niterations = 100000\n[chttpd_auth_lockout]\nmode = off\n",
        )
        .unwrap();
        let data = dir.path().join("data");
        let node = spawn_serve(&data, &cfg, &[], "warn", Stdio::inherit()).await;
        let http = reqwest::Client::new();
        let up = format!("{}/_up", node.base);
        http.get(&up).send().await.unwrap();
        let storm: Vec<_> = (0..200)
            .map(|i| {
                let name = ["admin", "bob", "nobody"][i % 3];
                let r = http
                    .get(format!("{}/_session", node.base))
                    .basic_auth(name, Some("wrong"))
                    .timeout(Duration::from_secs(200))
                    .send();
                tokio::spawn(async move { r.await.map(|r| r.status().as_u16()) })
            })
            .collect();
        let started = Instant::now();
        let mut probes = Vec::new();
        while !storm.iter().all(|t| t.is_finished()) && started.elapsed() < Duration::from_secs(180)
        {
            let t = Instant::now();
            let s = http.get(&up).send().await.unwrap().status().as_u16();
            assert_eq!(s, 200);
            probes.push(t.elapsed());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let took = started.elapsed();
        for t in storm {
            assert_eq!(
                t.await.unwrap().unwrap(),
                401,
                "every wrong password is refused"
            );
        }
        probes.sort();
        let median = probes[probes.len() / 2];
        let max = probes[probes.len() - 1];
        eprintln!(
            "{} probes over {took:?}: median {median:?}, max {max:?}",
            probes.len()
        );
        assert!(
            probes.len() >= 5,
            "the storm ended too soon to probe ({took:?})"
        );
        // 50 ms is the promise; the maximum allows for a CI machine running other tests.
        assert!(median <= Duration::from_millis(50), "median {median:?}");
        assert!(max <= Duration::from_millis(500), "max {max:?}");
    })
    .await;
}
