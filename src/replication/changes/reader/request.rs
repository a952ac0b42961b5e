//! The changes reader's request (`feed_request`): `_changes` with the feed (`normal` or
//! `continuous`, the latter with a heartbeat and uncompressed), `style` (`all_docs`, or
//! `main_only` for winning revisions only), `since`, an optional `limit`, and the
//! replication's filter: `doc_ids` and `selector` as a `POST` body, a named filter with its
//! `query_params` as query arguments.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::replication::changes::feed_line::seq_arg;
use crate::replication::endpoint::database::encode_query;
use crate::replication::http::client::Req;
use crate::replication::options::spec::{Filter, ReplicationOptions};

/// The request for the source's `feed` (`normal` or `continuous`) from `since`, at most `limit`
/// rows, with the replication's filter: what the reader sends, and what a start-up that knows
/// the first `since` early may send ahead of it (see [`super::ChangesReader::with_first_response`]).
pub(crate) fn feed_request(
    opts: &ReplicationOptions,
    feed: &str,
    since: &Value,
    limit: Option<usize>,
) -> Req {
    let style = if opts.winning_revs_only {
        "main_only"
    } else {
        "all_docs"
    };
    let mut q = format!(
        "_changes?feed={feed}&style={style}&since={}",
        seq_arg(since)
    );
    if let Some(l) = limit {
        q.push_str(&format!("&limit={l}"));
    }
    if feed == "continuous" {
        // CouchDB ends the response after `timeout`; pouchdb-server never does, so ask
        // for heartbeats too, keeping the read timeout from firing on an idle feed.
        let t = heartbeat(opts).as_millis();
        q.push_str(&format!("&timeout={t}&heartbeat={t}"));
    }
    let mut req = filtered(opts, q);
    if feed == "continuous" {
        // A compressing server (pouchdb-server's express) buffers a gzip stream until it
        // ends, so a live feed would never arrive: ask for it uncompressed.
        req.headers.push(("accept-encoding", "identity".to_owned()));
    }
    req
}

/// A third of the inactivity timeout, at least a second: what a live feed asks for.
pub(super) fn heartbeat(opts: &ReplicationOptions) -> Duration {
    (opts.connection_timeout / 3).max(Duration::from_secs(1))
}

/// The request for query `q` with the replication's filter.
fn filtered(opts: &ReplicationOptions, mut q: String) -> Req {
    match &opts.filter {
        Filter::None => Req::get(q),
        Filter::DocIds(ids) => {
            q.push_str("&filter=_doc_ids");
            Req::json(Method::POST, q, json!({ "doc_ids": ids }).to_string())
        }
        Filter::Selector(sel) => {
            q.push_str("&filter=_selector");
            Req::json(Method::POST, q, json!({ "selector": sel }).to_string())
        }
        Filter::Named { name, query_params } => {
            q.push_str(&format!("&filter={}", encode_query(name)));
            for (k, v) in query_params {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                q.push_str(&format!("&{}={}", encode_query(k), encode_query(&v)));
            }
            Req::get(q)
        }
    }
}
