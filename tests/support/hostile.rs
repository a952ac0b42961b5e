//! A hostile endpoint: a small HTTP/1.1 server that looks like a CouchDB holding one document
//! (`doc1`) and turns hostile at a chosen stage of a replication. The database name says
//! where and how, `<stage>-<kind>` (e.g. `changes-huge`); any other name is a well-behaved
//! database. Faults a real server cannot produce on demand: bodies of several GiB, a gzip
//! bomb, a trickle, a lying `Content-Length`, endless headers, a redirect loop, invalid UTF-8,
//! JSON nested 100,000 deep. Raw sockets, so nothing about the answers is tidied up.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Where in a replication the endpoint turns hostile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `GET /db`.
    DbInfo,
    /// `GET /db/_local/..` (checkpoints).
    Local,
    /// `GET /db/_changes`.
    Changes,
    /// The `_revs_diff` reply.
    RevsDiff,
    /// The `_bulk_get` reply.
    BulkGet,
    /// `GET /db/doc1?open_revs=..` (`_bulk_get` is then unsupported).
    OpenRevs,
    /// The `_bulk_docs` reply.
    BulkDocs,
    /// An attachment of `doc1` (`support::hostile_attachment`).
    Attachment,
}

impl Stage {
    /// Every stage.
    pub const ALL: [Stage; 8] = [
        Stage::DbInfo,
        Stage::Local,
        Stage::Changes,
        Stage::RevsDiff,
        Stage::BulkGet,
        Stage::OpenRevs,
        Stage::BulkDocs,
        Stage::Attachment,
    ];

    /// The stage's name in a database name.
    pub fn name(self) -> &'static str {
        match self {
            Stage::DbInfo => "dbinfo",
            Stage::Local => "local",
            Stage::Changes => "changes",
            Stage::RevsDiff => "revsdiff",
            Stage::BulkGet => "bulkget",
            Stage::OpenRevs => "openrevs",
            Stage::BulkDocs => "bulkdocs",
            Stage::Attachment => "attachment",
        }
    }

    /// Whether the hostile database is the replication's target (else its source). The
    /// attachment stage writes to a well-behaved database of this endpoint (pouchdb-server
    /// dies of a multipart upload cut short).
    pub fn is_target(self) -> bool {
        matches!(self, Stage::RevsDiff | Stage::BulkDocs)
    }

    fn parse(s: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|st| st.name() == s)
    }
}

/// How the endpoint misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A chunked body of 3 GiB that looks like the start of the expected JSON.
    Huge,
    /// `Content-Encoding: gzip` of 2 GiB (a few MB on the wire).
    GzipBomb,
    /// A byte every half second, for ever.
    Trickle,
    /// `Content-Length` of 5 GiB, then a few bytes and a closed connection.
    LyingLength,
    /// Header lines without end.
    EndlessHeaders,
    /// A 302 to itself.
    RedirectLoop,
    /// JSON with bytes that are not UTF-8.
    InvalidUtf8,
    /// An array nested 100,000 deep.
    DeepJson,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 8] = [
        Kind::Huge,
        Kind::GzipBomb,
        Kind::Trickle,
        Kind::LyingLength,
        Kind::EndlessHeaders,
        Kind::RedirectLoop,
        Kind::InvalidUtf8,
        Kind::DeepJson,
    ];

    /// The kind's name in a database name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Huge => "huge",
            Kind::GzipBomb => "gzip",
            Kind::Trickle => "trickle",
            Kind::LyingLength => "lying",
            Kind::EndlessHeaders => "headers",
            Kind::RedirectLoop => "redirect",
            Kind::InvalidUtf8 => "utf8",
            Kind::DeepJson => "deep",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// The database name that is hostile at `stage` in the way of `kind`.
pub fn db_name(stage: Stage, kind: Kind) -> String {
    format!("{}-{}", stage.name(), kind.name())
}

/// A running hostile endpoint (stopped on drop).
pub struct Hostile {
    /// `http://127.0.0.1:PORT`.
    pub root: String,
    written: Arc<Mutex<HashMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const REV: &str = "1-967a00dff5e02add41819138abb3284d";
const REV_HASH: &str = "967a00dff5e02add41819138abb3284d";

fn doc1() -> String {
    format!(
        r#"{{"_id":"doc1","_rev":"{REV}","_revisions":{{"start":1,"ids":["{REV_HASH}"]}},"v":1}}"#
    )
}

impl Hostile {
    /// Starts the endpoint on a free loopback port.
    pub async fn start() -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let root = format!("http://{}", listener.local_addr().expect("addr"));
        let written: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let w = written.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let w = w.clone();
                tokio::spawn(async move {
                    let _ = serve(sock, w).await;
                });
            }
        });
        Hostile {
            root,
            written,
            task,
        }
    }

    /// The URL of database `db`.
    pub fn db_url(&self, db: &str) -> String {
        format!("{}/{db}", self.root)
    }

    /// Documents `_bulk_docs` (or a `PUT`) accepted into `db`.
    pub fn written(&self, db: &str) -> u64 {
        self.written
            .lock()
            .map(|m| m.get(db).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// One request: method, path (with query) and body.
struct Request {
    method: String,
    path: String,
    body: Vec<u8>,
}

async fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let path = parts.next().unwrap_or("/").to_owned();
    let (mut length, mut chunked) = (0usize, false);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).await? == 0 {
            return Ok(None);
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).await?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        body.resize(length, 0);
        r.read_exact(&mut body).await?;
    }
    Ok(Some(Request { method, path, body }))
}

async fn serve(sock: TcpStream, written: Arc<Mutex<HashMap<String, u64>>>) -> std::io::Result<()> {
    let mut r = BufReader::new(sock);
    while let Some(req) = read_request(&mut r).await? {
        let (path, query) = req.path.split_once('?').unwrap_or((&req.path, ""));
        let segs: Vec<&str> = path.trim_start_matches('/').splitn(2, '/').collect();
        let db = segs.first().copied().unwrap_or("");
        let rest = segs.get(1).copied().unwrap_or("");
        let (stage, kind) = db
            .split_once('-')
            .and_then(|(s, k)| Some((Stage::parse(s)?, Kind::parse(k)?)))
            .unzip();
        let at = match stage_of(rest) {
            Some(Stage::OpenRevs) if stage == Some(Stage::Attachment) => Some(Stage::Attachment),
            at => at,
        };
        if let (Some(stage), Some(kind)) = (stage, kind)
            && at == Some(stage)
        {
            if stage == Stage::Attachment {
                let s = r.get_mut();
                return super::hostile_attachment::answer(s, kind, &req.path, REV, REV_HASH).await;
            }
            return hostile(r.get_mut(), stage, kind, &req.path).await;
        }
        let (status, body) = answer(&req, db, rest, query, stage, &written);
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let s = r.get_mut();
        s.write_all(head.as_bytes()).await?;
        s.write_all(body.as_bytes()).await?;
        if query.contains("feed=continuous") {
            // Heartbeats for a minute, then the feed ends.
            for _ in 0..60 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            return Ok(());
        }
    }
    Ok(())
}

/// The stage a request under a database belongs to.
fn stage_of(rest: &str) -> Option<Stage> {
    Some(match rest {
        "" => Stage::DbInfo,
        r if r.starts_with("_local/") => Stage::Local,
        "_changes" => Stage::Changes,
        "_revs_diff" => Stage::RevsDiff,
        "_bulk_get" => Stage::BulkGet,
        "_bulk_docs" => Stage::BulkDocs,
        "doc1" => Stage::OpenRevs,
        _ => return None,
    })
}

/// A well-behaved answer.
fn answer(
    req: &Request,
    db: &str,
    rest: &str,
    query: &str,
    stage: Option<Stage>,
    written: &Mutex<HashMap<String, u64>>,
) -> (&'static str, String) {
    let ok = "200 OK";
    match (req.method.as_str(), rest) {
        (_, _) if db.is_empty() => (
            ok,
            r#"{"couchdb":"Welcome","version":"3.4.3","uuid":"0b4d0b4d0b4d0b4d0b4d0b4d0b4d0b4d"}"#
                .into(),
        ),
        ("PUT", "") => (
            "412 Precondition Failed",
            r#"{"error":"file_exists"}"#.into(),
        ),
        (_, "") => (
            ok,
            format!(r#"{{"db_name":"{db}","update_seq":"1-g1","instance_start_time":"0"}}"#),
        ),
        ("GET", r) if r.starts_with("_local/") => (
            "404 Object Not Found",
            r#"{"error":"not_found","reason":"missing"}"#.into(),
        ),
        ("PUT", r) if r.starts_with("_local/") => (
            "201 Created",
            format!(r#"{{"ok":true,"id":"{r}","rev":"0-1"}}"#),
        ),
        (_, "_changes") if query.contains("feed=continuous") && query.contains("since=1-g1") => {
            (ok, String::new())
        }
        (_, "_changes") if query.contains("feed=continuous") => (
            ok,
            format!("{{\"seq\":\"1-g1\",\"id\":\"doc1\",\"changes\":[{{\"rev\":\"{REV}\"}}]}}\n"),
        ),
        (_, "_changes") => (
            ok,
            format!(
                r#"{{"results":[{{"seq":"1-g1","id":"doc1","changes":[{{"rev":"{REV}"}}]}}],"last_seq":"1-g1","pending":0}}"#
            ),
        ),
        ("POST", "_revs_diff") => {
            // Everything asked for is missing.
            let asked: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(&req.body).unwrap_or_default();
            let missing: serde_json::Map<String, serde_json::Value> = asked
                .into_iter()
                .map(|(id, revs)| (id, serde_json::json!({ "missing": revs })))
                .collect();
            (ok, serde_json::Value::Object(missing).to_string())
        }
        ("POST", "_bulk_get") if stage == Some(Stage::OpenRevs) => (
            "404 Object Not Found",
            r#"{"error":"not_found","reason":"missing"}"#.into(),
        ),
        ("POST", "_bulk_get") => {
            let doc = if stage == Some(Stage::Attachment) {
                super::hostile_attachment::doc1_with_stub(REV, REV_HASH)
            } else {
                doc1()
            };
            (
                ok,
                format!(r#"{{"results":[{{"id":"doc1","docs":[{{"ok":{doc}}}]}}]}}"#),
            )
        }
        ("GET", "doc1") => (ok, format!(r#"[{{"ok":{}}}]"#, doc1())),
        ("POST", "_bulk_docs") => {
            let n = serde_json::from_slice::<serde_json::Value>(&req.body)
                .ok()
                .and_then(|v| v["docs"].as_array().map(Vec::len))
                .unwrap_or(0) as u64;
            if let Ok(mut w) = written.lock() {
                *w.entry(db.to_owned()).or_default() += n;
            }
            ("201 Created", "[]".into())
        }
        // A document written whole (the attachment stage's target is well-behaved).
        ("PUT", r) if !r.starts_with('_') => {
            if let Ok(mut w) = written.lock() {
                *w.entry(db.to_owned()).or_default() += 1;
            }
            (
                "201 Created",
                format!(r#"{{"ok":true,"id":"{r}","rev":"{REV}"}}"#),
            )
        }
        ("POST", "_ensure_full_commit") => (
            "201 Created",
            r#"{"ok":true,"instance_start_time":"0"}"#.into(),
        ),
        _ => (
            "404 Object Not Found",
            r#"{"error":"not_found","reason":"missing"}"#.into(),
        ),
    }
}

/// What the body of a hostile answer starts with, so that a parser reads on.
fn prefix(stage: Stage) -> &'static [u8] {
    match stage {
        Stage::Changes => br#"{"results":[{"seq":"1-g1","id":""#,
        Stage::OpenRevs | Stage::BulkDocs => br#"[{"ok":{"_id":""#,
        _ => br#"{"a":""#,
    }
}

const GIB: u64 = 1 << 30;

async fn hostile(s: &mut TcpStream, stage: Stage, kind: Kind, path: &str) -> std::io::Result<()> {
    let head = |extra: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n{extra}\r\n"
        )
        .into_bytes()
    };
    match kind {
        Kind::Huge => {
            s.write_all(&head("Transfer-Encoding: chunked\r\n")).await?;
            chunked(s, prefix(stage)).await?;
            let block = vec![b'a'; 64 << 10];
            for _ in 0..(3 * GIB / block.len() as u64) {
                chunked(s, &block).await?;
            }
            s.write_all(b"0\r\n\r\n").await
        }
        Kind::GzipBomb => {
            s.write_all(&head(
                "Transfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n",
            ))
            .await?;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(prefix(stage))?;
            let block = vec![b'a'; 1 << 20];
            for _ in 0..(2 * GIB / block.len() as u64) {
                gz.write_all(&block)?;
                let out = std::mem::take(gz.get_mut());
                if !out.is_empty() {
                    chunked(s, &out).await?;
                }
            }
            let out = gz.finish()?;
            chunked(s, &out).await?;
            s.write_all(b"0\r\n\r\n").await
        }
        Kind::Trickle => {
            s.write_all(&head("Transfer-Encoding: chunked\r\n")).await?;
            chunked(s, prefix(stage)).await?;
            for _ in 0..1200 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                chunked(s, b"a").await?;
            }
            Ok(())
        }
        Kind::LyingLength => {
            s.write_all(&head(&format!("Content-Length: {}\r\n", 5 * GIB)))
                .await?;
            s.write_all(prefix(stage)).await?;
            s.write_all(&vec![b'a'; 1 << 20]).await?;
            s.shutdown().await
        }
        Kind::EndlessHeaders => {
            s.write_all(b"HTTP/1.1 200 OK\r\n").await?;
            let line = format!("X-Junk: {}\r\n", "a".repeat(1000));
            for _ in 0..1_000_000 {
                s.write_all(line.as_bytes()).await?;
            }
            Ok(())
        }
        Kind::RedirectLoop => {
            let head = format!(
                "HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            s.write_all(head.as_bytes()).await
        }
        Kind::InvalidUtf8 => {
            let mut body = prefix(stage).to_vec();
            body.extend_from_slice(b"\xff\xfe\xc3\x28\"}]}");
            s.write_all(&head(&format!("Content-Length: {}\r\n", body.len())))
                .await?;
            s.write_all(&body).await
        }
        Kind::DeepJson => {
            let mut body = prefix(stage).to_vec();
            body.extend_from_slice(b"x\",\"deep\":");
            body.extend(std::iter::repeat_n(b'[', 100_000));
            body.extend(std::iter::repeat_n(b']', 100_000));
            body.extend_from_slice(b"}]}");
            s.write_all(&head(&format!("Content-Length: {}\r\n", body.len())))
                .await?;
            s.write_all(&body).await
        }
    }
}

/// Writes `data` as one chunk of a chunked body.
pub async fn chunked(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    s.write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .await?;
    s.write_all(data).await?;
    s.write_all(b"\r\n").await
}
