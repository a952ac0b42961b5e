//! How to reach an etcd cluster: endpoints, the key prefix this cluster's store lives under,
//! user and password, TLS (CA, client certificate) and request timeouts. Never prints the
//! password.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{BalancedChannelBuilder, Channel, Client, ConnectOptions};

use super::tls_channel::TlsFiles;

use super::errors::read_error;
use crate::store::StoreError;

/// Commit `Txn`s in flight per process by default. Measured (docs/decisions/
/// 2026-11-26-etcd-store.md): deeper pipelines lost to one `Txn` in flight, because each read
/// conflict fails the `Txn`s behind it (their predicted clock) and batches get smaller, so
/// 1 until a design that survives conflicts.
pub const DEFAULT_PIPELINE: usize = 1;

/// First-read `Txn`s (which also fetch read versions, `read_version.rs`) in flight per
/// process by default: measured in docs/decisions/2026-11-27-etcd-throughput.md.
pub const DEFAULT_READ_PIPELINE: usize = 2;

/// The settings of the etcd engine (`serve --etcd-endpoints`, `[couch_jobs] etcd_*`).
#[derive(Clone)]
pub struct EtcdConfig {
    /// Client URLs, `http://host:2379` or `https://…` (several: the client balances and fails
    /// over between them).
    pub endpoints: Vec<String>,
    /// Every key of this store starts with it, so one etcd can hold several clusters.
    pub prefix: String,
    /// etcd user and password (etcd's `auth enable`).
    pub user: Option<(String, String)>,
    /// PEM file of the CA that signed the members' certificates.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for members run with `--client-cert-auth`.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's PEM private key.
    pub key_file: Option<PathBuf>,
    /// Every request fails after this (a commit's fate is then asked of etcd, `resolve.rs`).
    pub request_timeout: Duration,
    /// Connecting fails after this.
    pub connect_timeout: Duration,
    /// Commit `Txn`s one process keeps in flight at most (1: each waits for the previous).
    pub pipeline: usize,
    /// First-read `Txn`s one process keeps in flight at most (reads that start meanwhile
    /// wait and go out together in the next).
    pub read_pipeline: usize,
    /// Serve reads from a local replica of the prefix kept by a watch (`replica.rs`), asking
    /// etcd only for read versions; `false` reads every key from etcd.
    pub local_reads: bool,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

impl EtcdConfig {
    /// Endpoints with the defaults: prefix `couch-replicator/`, no auth, no TLS, 5 s timeouts.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: "couch-replicator/".into(),
            user: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            pipeline: DEFAULT_PIPELINE,
            read_pipeline: DEFAULT_READ_PIPELINE,
            local_reads: true,
        }
    }

    /// The same settings under another key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The TLS files when any endpoint is `https://` or a CA or certificate is given.
    fn tls(&self) -> Option<TlsFiles> {
        let wants_tls = self.ca_file.is_some()
            || self.cert_file.is_some()
            || self.key_file.is_some()
            || self.endpoints.iter().any(|e| e.starts_with("https://"));
        wants_tls.then(|| TlsFiles {
            ca: self.ca_file.clone(),
            cert: self.cert_file.clone(),
            key: self.key_file.clone(),
        })
    }

    /// An etcd client with these settings (what the store itself uses).
    pub async fn client(&self) -> Result<Client, StoreError> {
        if self.endpoints.is_empty() {
            return Err(StoreError::Invalid("no etcd endpoints".into()));
        }
        if self.prefix.is_empty() {
            return Err(StoreError::Invalid("the etcd key prefix is empty".into()));
        }
        let mut options = ConnectOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.connect_timeout)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        if let Some((name, password)) = &self.user {
            // etcd drops a token unused for `--auth-token-ttl` (300 s): a node cut off
            // longer than that would otherwise be refused ("invalid auth token") for good.
            options = options
                .with_user(name.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        let endpoints: Vec<String> = self
            .endpoints
            .iter()
            .map(|e| e.trim_end_matches('/').to_string())
            .collect();
        if let Some(tls) = self.tls() {
            return Client::connect_with_balanced_channel(endpoints, Some(options), tls.channel()?)
                .await
                .map_err(read_error);
        }
        Client::connect_with_balanced_channel(endpoints, Some(options), PlainChannel)
            .await
            .map_err(read_error)
    }
}

/// tonic's own balanced channel for `http://` endpoints. etcd-client's OpenSSL transport
/// (which it uses for every endpoint once its `tls-openssl` feature is on) leaves Nagle's
/// algorithm on, and each small request then waits ~40 ms for a delayed ACK on loopback;
/// tonic's connector sets `TCP_NODELAY` (`https://` goes through `tls_channel.rs`).
struct PlainChannel;

type EndpointUpdater = tokio::sync::mpsc::Sender<
    tonic::transport::channel::Change<tonic::codegen::http::Uri, tonic::transport::Endpoint>,
>;

impl BalancedChannelBuilder for PlainChannel {
    type Error = tonic::transport::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(Channel, EndpointUpdater), Self::Error> {
        let (channel, updates) = tonic::transport::Channel::balance_channel(buffer_size);
        Ok((Channel::Tonic(channel), updates))
    }
}
