//! A client of a node's HTTP API for the CLI's commands that talk to a running node
//! (`steps`, `jobs`).
//!
//! Credentials go in the node URL (`http://name:password@127.0.0.1:5984`) or in
//! `COUCH_REPLICATOR_AUTH=name:password`; they are taken out of the URL before any request
//! is built, so no message printed here (errors included) can show them.

use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use url::Url;

/// The `--url` of the commands that talk to a node.
#[derive(Debug, clap::Args)]
pub(super) struct NodeUrl {
    /// The node's base URL; may carry Basic credentials as `http://name:password@host:port`.
    #[arg(
        long,
        env = "COUCH_REPLICATOR_URL",
        default_value = "http://127.0.0.1:5984"
    )]
    pub(super) url: String,
}

/// A node's HTTP API, credentials kept apart from the URL.
pub(super) struct NodeClient {
    client: Client,
    base: Url,
    auth: Option<(String, String)>,
}

impl NodeClient {
    /// A client of the node at `url` (credentials in it, or in `COUCH_REPLICATOR_AUTH`).
    pub(super) fn new(url: &str) -> Result<Self, String> {
        let mut base = Url::parse(url).map_err(|e| format!("bad node URL: {e}"))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err("the node URL must be http or https".into());
        }
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let mut auth = match (base.username(), base.password()) {
            ("", None) => None,
            (u, p) => Some((decode(u), decode(p.unwrap_or("")))),
        };
        // Neither call fails for http(s) URLs, which have a host.
        let _ = base.set_username("");
        let _ = base.set_password(None);
        if auth.is_none()
            && let Ok(pair) = std::env::var("COUCH_REPLICATOR_AUTH")
        {
            let Some((u, p)) = pair.split_once(':') else {
                return Err("COUCH_REPLICATOR_AUTH must be name:password".into());
            };
            auth = Some((u.to_string(), p.to_string()));
        }
        let client = Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self { client, base, auth })
    }

    /// `base/seg1/seg2/...`, each segment escaped as one path segment.
    pub(super) fn endpoint(&self, segments: &[&str]) -> Url {
        let mut u = self.base.clone();
        if let Ok(mut segs) = u.path_segments_mut() {
            segs.pop_if_empty().extend(segments);
        }
        u
    }

    /// `method url` with the credentials and an optional JSON body; the JSON answer, or
    /// the node's error as `status error: reason`.
    pub(super) async fn call(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<Value, String> {
        let mut req = self.client.request(method, url);
        if let Some((u, p)) = &self.auth {
            req = req.basic_auth(u, Some(p));
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| format!("reading the reply failed: {e}"))?;
        let value: Value = serde_json::from_str(&text).map_err(|_| {
            format!("{status}: the node sent no JSON (is this a couch-replicator node?)")
        })?;
        if status.is_success() {
            return Ok(value);
        }
        let field = |k: &str| {
            value
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let hint = if status == StatusCode::UNAUTHORIZED {
            " (give admin credentials in the URL or COUCH_REPLICATOR_AUTH)"
        } else {
            ""
        };
        Err(format!(
            "{status} {}: {}{hint}",
            field("error"),
            field("reason")
        ))
    }
}
