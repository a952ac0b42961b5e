//! The task behind a shared change watch ([`super::watch`]): follows one database's
//! continuous `_changes` feed, with no filter, and reports what it sees to the watch's
//! [`FeedSink`]: the ids of the changed documents.
//!
//! It starts from `since=now` and reports a blind spot when that request is answered: a
//! job's read that ended before this feed existed may have missed a write, so every waiting
//! job reads once more. After that the feed resumes from the last sequence it saw, so nothing
//! between two connections is missed. When a request fails (the database was deleted, the
//! server is down) it reports a break, so the waiting jobs check their source themselves, and
//! retries from "now" again, with a wait that doubles while requests keep failing at once and
//! starts over after a feed that ran (cut by a proxy, say). It never ends by itself: the watch aborts
//! it when the last job lets go.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio::task::AbortHandle;

use crate::backoff::Backoff;

use super::feed_line::{FeedLines, parse_feed_line, refused, seq_arg};
use super::watch::FeedSink;
use crate::replication::error::{ReplicationError, Result};
use crate::replication::http::client::{HttpClient, Req, describe};

/// Spawns the feed task of a watch on `client`'s endpoint, asking for a heartbeat every
/// `heartbeat` (so the client's inactivity timeout never fires on a quiet database).
pub fn start(client: Arc<HttpClient>, heartbeat: Duration, sink: FeedSink) -> AbortHandle {
    tokio::spawn(follow(client, heartbeat, sink)).abort_handle()
}

async fn follow(client: Arc<HttpClient>, heartbeat: Duration, sink: FeedSink) {
    let mut since: Option<Value> = None;
    let mut wait = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
    loop {
        let began = tokio::time::Instant::now();
        match follow_once(&client, heartbeat, &mut since, &sink).await {
            // The server ended the feed: reconnect from where it stopped, at once unless it
            // keeps ending feeds as soon as they start.
            Ok(()) if began.elapsed() >= Duration::from_secs(1) => wait.reset(),
            Ok(()) => wait.wait().await,
            Err(e) => {
                tracing::debug!(error = %e, endpoint = %client.endpoint(), "change watch interrupted");
                // A feed that ran a while and was cut (a proxy's idle or age limit) starts
                // the backoff over: kept doubling across such cuts, the wait reached 16 s
                // after six cuts 2 s apart, and the jobs' documents waited with it.
                if began.elapsed() >= Duration::from_secs(1) {
                    wait.reset();
                }
                since = None;
                sink.broke();
                wait.wait().await;
            }
        }
    }
}

/// One request of the feed, until the server ends it (`Ok`) or it fails.
async fn follow_once(
    client: &HttpClient,
    heartbeat: Duration,
    since: &mut Option<Value>,
    sink: &FeedSink,
) -> Result<()> {
    let from = since.as_ref().map_or_else(|| "now".to_owned(), seq_arg);
    let beat = heartbeat.as_millis().max(1000);
    let mut req = Req::get(format!(
        "_changes?feed=continuous&since={from}&heartbeat={beat}"
    ));
    // A compressing server buffers a gzip stream until it ends: ask for it uncompressed.
    req.headers.push(("accept-encoding", "identity".to_owned()));
    let resp = client.send_streaming(&req).await?;
    if !resp.status().is_success() {
        return Err(refused(client.endpoint(), resp.status()));
    }
    if since.is_none() {
        sink.blind();
    }
    let mut body = resp.bytes_stream();
    let mut lines = FeedLines::new(client.limits(), client.connection_timeout());
    let from = format!("GET {}/_changes", client.endpoint());
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ReplicationError::ChangesReqFailed(describe(&e)))?;
        lines.push(&chunk).map_err(|e| e.at(&from))?;
        let (mut ids, mut ended) = (Vec::new(), false);
        while let Some(line) = lines.next_line().map_err(|e| e.at(&from))? {
            let Some(row) = parse_feed_line(line.as_bytes()).map_err(|e| e.at(&from))? else {
                continue; // heartbeat
            };
            if let Some(last) = row.last_seq {
                *since = Some(last);
                ended = true;
                break;
            }
            if let Some(seq) = row.seq {
                *since = Some(seq);
                ids.push(row.id.unwrap_or_default());
            }
        }
        sink.changed(ids);
        if ended {
            return Ok(());
        }
    }
    Ok(())
}
