//! The API's request parsing under arbitrary requests (issue 39, point 7; RELIABILITY.md
//! "Inbound"): a seeded generator sends a node thousands of requests mixing known routes and
//! made-up ones, odd methods, Basic headers that are not base64 or carry no colon or random
//! names, `AuthSession` cookies of random bytes, every content type, and bodies that are
//! invalid UTF-8, truncated or deeply nested JSON, or too large. Every answer must be a
//! CouchDB-style error or success (never a 5xx, never a closed connection), and the node must
//! still answer its admin afterwards. The same parsing is a cargo-fuzz target
//! (`fuzz/fuzz_targets/request_auth.rs`) for longer runs.

use std::time::{Duration, Instant};

use base64::Engine as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::deadline;
use crate::support::http::Node;
use couch_replicator::http::HttpConfig;
use couch_replicator::http::auth::{AuthSettings, Users};

const PATHS: &[&str] = &[
    "/_replicate",
    "/_verify",
    "/_session",
    "/_scheduler/jobs",
    "/_scheduler/jobs/x",
    "/_scheduler/docs",
    "/_scheduler/docs/_replicator/a%2Fb",
    "/_active_tasks",
    "/_up",
    "/",
    "/metrics",
    "/_node/_local/_stats/couch_replicator/jobs",
    "/_node/x/_prometheus",
    "/_utils/replicator/status.json?state=%ZZ&skip=-1",
    "/_steps",
    "/nope/%00/..",
    "/_scheduler/all_dbs",
    "/_session?basic=true",
];
const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "BREW", "OPTIONS",
];
const TYPES: &[&str] = &[
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
    "APPLICATION/JSON",
];

fn bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..rng.random_range(0..n)).map(|_| rng.random()).collect()
}

fn authorization(rng: &mut StdRng) -> Option<String> {
    let b64 = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
    Some(match rng.random_range(0..8) {
        0 => return None,
        1 => format!("Basic {}", b64(&bytes(rng, 40))),
        2 => format!("Basic {}", b64(b"adm:wrong")),
        3 => format!(
            "Basic {}",
            b64(format!("u{}:p", rng.random::<u16>()).as_bytes())
        ),
        4 => "Basic !!!not-base64".to_owned(),
        5 => "Bearer abc".to_owned(),
        6 => format!("Basic {}", b64(b"adm:adm-secret")),
        _ => "Basic".to_owned(),
    })
}

fn cookie(rng: &mut StdRng) -> Option<String> {
    let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    Some(match rng.random_range(0..5) {
        0 | 1 => return None,
        2 => format!("AuthSession={}", b64(&bytes(rng, 60))),
        3 => format!("AuthSession={}", b64(b"adm:FFFFFFFF:xxxx")),
        _ => format!("a=b; AuthSession=; AuthSession={}", b64(b"::")),
    })
}

fn body(rng: &mut StdRng) -> Vec<u8> {
    match rng.random_range(0..7) {
        0 => Vec::new(),
        1 => bytes(rng, 200),
        2 => b"{\"source\": \"http://127.0.0.1:9/a\", \"target\": ".to_vec(),
        3 => format!("{}1{}", "[".repeat(20_000), "]".repeat(20_000)).into_bytes(),
        4 => br#"{"source": {"url": 7}, "target": [], "continuous": "yes"}"#.to_vec(),
        5 => vec![b'x'; 2 << 20],
        _ => br#"{"name": "adm", "password": "nope"}"#.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_requests_get_couchdb_answers() {
    deadline(180, "arbitrary requests", async {
        let settings = AuthSettings {
            iterations: 10,
            ..AuthSettings::default()
        };
        let users = Users::configure(
            [("adm".to_owned(), "adm-secret".to_owned())],
            [("bob".to_owned(), "bob-secret".to_owned())],
            &settings,
        )
        .unwrap();
        let node = Node::frontend_with_own_users(HttpConfig {
            users,
            ..HttpConfig::default()
        })
        .await;
        // A connection each: one the node closed after refusing an oversized body must not
        // be reused for the next request (that failure would be the client's).
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let mut rng = StdRng::seed_from_u64(39);
        let started = Instant::now();
        let mut sent = 0;
        while sent < 15_000 && started.elapsed() < Duration::from_secs(60) {
            let method =
                reqwest::Method::from_bytes(METHODS[rng.random_range(0..METHODS.len())].as_bytes())
                    .unwrap();
            let path = PATHS[rng.random_range(0..PATHS.len())];
            let mut r = http.request(method.clone(), format!("{}{path}", node.base));
            if let Some(a) = authorization(&mut rng) {
                r = r.header("authorization", a);
            }
            if let Some(c) = cookie(&mut rng) {
                r = r.header("cookie", c);
            }
            let ty = TYPES[rng.random_range(0..TYPES.len())];
            if !ty.is_empty() {
                r = r.header("content-type", ty);
            }
            let body = body(&mut rng);
            let oversized = body.len() > HttpConfig::default().max_body_bytes;
            let resp = match r.body(body).send().await {
                Ok(resp) => resp,
                // Refused before it was read (413, 405, 401...), a body larger than the
                // node takes may be cut off while it is still being sent.
                Err(_) if oversized => {
                    sent += 1;
                    continue;
                }
                Err(e) => panic!("{method} {path}: no answer: {e:?}"),
            };
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            assert!(status < 500, "{method} {path}: {status} {text}");
            if status >= 400 && method != reqwest::Method::HEAD {
                let v: serde_json::Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{method} {path}: {status} not JSON ({e}): {text}"));
                assert!(
                    v["error"].is_string() && v["reason"].is_string(),
                    "{method} {path}: {v}"
                );
            }
            sent += 1;
        }
        assert!(sent >= 500, "only {sent} requests in a minute");
        eprintln!("{sent} arbitrary requests in {:?}", started.elapsed());
        let ok = http
            .get(format!("{}/_scheduler/jobs", node.base))
            .basic_auth("adm", Some("adm-secret"))
            .send()
            .await
            .unwrap();
        // The right password from this address may be locked out by the wrong ones above,
        // as CouchDB would: a 403 is an answer too.
        assert!(matches!(ok.status().as_u16(), 200 | 403), "{}", ok.status());
        let up = http.get(format!("{}/_up", node.base)).send().await.unwrap();
        assert_eq!(up.status().as_u16(), 200);
    })
    .await;
}
