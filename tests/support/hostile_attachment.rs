//! The hostile endpoint's attachment stage (`support::hostile`, stage `attachment`): `doc1`
//! carries a 1 MiB attachment, so `_bulk_get` answers it as a stub and the replicator fetches
//! it alone with `GET doc1?open_revs=..` as `multipart/mixed`; that answer turns hostile inside
//! the document's `multipart/related` part: the attachment's bytes (3 GiB instead of 1 MiB,
//! a gzip bomb, a trickle, a connection closed under a lying `Content-Length`), its part
//! headers (without end), or the document's JSON part (invalid UTF-8, nested 100,000 deep).

use std::io::Write;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::hostile::{Kind, chunked};

/// The attachment's declared length.
const ATT_LEN: usize = 1 << 20;
const GIB: u64 = 1 << 30;

/// `doc1` with `blob` as a stub (what `_bulk_get` answers without attachments).
pub fn doc1_with_stub(rev: &str, rev_hash: &str) -> String {
    format!(
        r#"{{"_id":"doc1","_rev":"{rev}","_revisions":{{"start":1,"ids":["{rev_hash}"]}},"v":1,"_attachments":{{"blob":{{"content_type":"application/octet-stream","revpos":1,"digest":"md5-x","length":{ATT_LEN},"stub":true}}}}}}"#
    )
}

/// The multipart answer up to where `kind` turns it hostile.
fn opening(kind: Kind, rev: &str, rev_hash: &str) -> Vec<u8> {
    let mut json = doc1_with_stub(rev, rev_hash)
        .replace(r#""stub":true"#, r#""follows":true"#)
        .into_bytes();
    match kind {
        Kind::InvalidUtf8 => json.splice(9..9, *b"\xff\xfe\xc3\x28").for_each(drop),
        Kind::DeepJson => {
            let deep = [vec![b'['; 100_000], vec![b']'; 100_000]].concat();
            let at = json.len() - 1;
            json.splice(at..at, [b",\"deep\":".as_slice(), &deep].concat())
                .for_each(drop);
        }
        _ => {}
    }
    let mut out = b"--OUT\r\nContent-Type: multipart/related; boundary=\"IN\"\r\n\r\n\
        --IN\r\nContent-Type: application/json\r\n\r\n"
        .to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(b"\r\n--IN\r\n");
    if kind != Kind::EndlessHeaders {
        out.extend_from_slice(
            format!(
                "Content-Disposition: attachment; filename=\"blob\"\r\n\
                 Content-Type: application/octet-stream\r\nContent-Length: {ATT_LEN}\r\n\r\n"
            )
            .as_bytes(),
        );
    }
    out
}

/// Answers `GET doc1?open_revs=..` of the attachment stage, hostile in the way of `kind`.
pub async fn answer(
    s: &mut TcpStream,
    kind: Kind,
    path: &str,
    rev: &str,
    rev_hash: &str,
) -> std::io::Result<()> {
    let head = |extra: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: multipart/mixed; boundary=\"OUT\"\r\n\
             Connection: close\r\n{extra}\r\n"
        )
        .into_bytes()
    };
    let open = opening(kind, rev, rev_hash);
    let block = vec![b'a'; 64 << 10];
    match kind {
        Kind::Huge => {
            s.write_all(&head("Transfer-Encoding: chunked\r\n")).await?;
            chunked(s, &open).await?;
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
            gz.write_all(&open)?;
            let block = vec![b'a'; 1 << 20];
            for _ in 0..(2 * GIB / block.len() as u64) {
                gz.write_all(&block)?;
                let out = std::mem::take(gz.get_mut());
                if !out.is_empty() {
                    chunked(s, &out).await?;
                }
            }
            chunked(s, &gz.finish()?).await?;
            s.write_all(b"0\r\n\r\n").await
        }
        Kind::Trickle => {
            s.write_all(&head("Transfer-Encoding: chunked\r\n")).await?;
            chunked(s, &open).await?;
            for _ in 0..1200 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                chunked(s, b"a").await?;
            }
            Ok(())
        }
        Kind::LyingLength => {
            s.write_all(&head(&format!("Content-Length: {}\r\n", 5 * GIB)))
                .await?;
            s.write_all(&open).await?;
            s.write_all(&vec![b'a'; ATT_LEN / 2]).await?;
            s.shutdown().await
        }
        Kind::EndlessHeaders => {
            s.write_all(&head("Transfer-Encoding: chunked\r\n")).await?;
            chunked(s, &open).await?;
            let line = format!("X-Junk: {}\r\n", "a".repeat(1000));
            for _ in 0..1_000_000 {
                chunked(s, line.as_bytes()).await?;
            }
            Ok(())
        }
        Kind::RedirectLoop => {
            let head = format!(
                "HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            s.write_all(head.as_bytes()).await
        }
        Kind::InvalidUtf8 | Kind::DeepJson => {
            s.write_all(&head("Transfer-Encoding: chunked\r\n")).await?;
            chunked(s, &open).await?;
            chunked(s, &vec![b'a'; ATT_LEN]).await?;
            chunked(s, b"\r\n--IN--\r\n--OUT--").await?;
            s.write_all(b"0\r\n\r\n").await
        }
    }
}
