//! Which job store `serve` opens ([`open`]): the embedded engine under `--data-dir` (the default),
//! FoundationDB (`--fdb-cluster-file`, feature `fdb`), or an etcd cluster
//! (`--etcd-endpoints` / `[couch_jobs] etcd_endpoints`, with the key prefix, user and
//! password, and TLS files beside it). On a store that several nodes share, the server uuid
//! (part of every replication id) is recorded in the store by the first node, and a node
//! whose uuid differs is refused at start: it would compute other replication ids for the
//! same replications.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::store::embedded::EmbeddedStore;
use crate::store::etcd::{EtcdConfig, EtcdStore};
use crate::store::{Db, StoreError, Tx, tuple};

use super::config_file::ConfigFile;
use super::serve::ServeArgs;

/// The `[couch_jobs]` section.
pub const SECTION: &str = "couch_jobs";

/// The `[couch_jobs]` keys this node reads.
pub const KEYS: &[&str] = &[
    "etcd_endpoints",
    "etcd_prefix",
    "etcd_user",
    "etcd_password",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
];

/// `serve` flags for an etcd job store; each sets its `[couch_jobs]` key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EtcdArgs {
    /// Keep jobs in this etcd cluster (client URLs, comma separated) instead of the embedded
    /// store; every node of the cluster must then set the same `[couchdb] uuid`.
    #[arg(long, value_name = "URL[,URL]", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix of this cluster's jobs in etcd (default `couch-replicator/`), so one etcd
    /// can hold several clusters.
    #[arg(long, value_name = "PREFIX")]
    pub etcd_prefix: Option<String>,
    /// etcd user (with etcd's authentication on).
    #[arg(long, value_name = "NAME")]
    pub etcd_user: Option<String>,
    /// The etcd user's password.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "COUCH_REPLICATOR_ETCD_PASSWORD",
        hide_env_values = true
    )]
    pub etcd_password: Option<String>,
    /// PEM file of the CA that signed the etcd members' certificates.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd members run with `--client-cert-auth`.
    #[arg(long, value_name = "FILE")]
    pub etcd_cert_file: Option<PathBuf>,
    /// PEM private key of `--etcd-cert-file`.
    #[arg(long, value_name = "FILE")]
    pub etcd_key_file: Option<PathBuf>,
}

impl EtcdArgs {
    /// Writes the flags given into `[couch_jobs]` (flags beat the file and the environment).
    pub fn apply(&self, cfg: &mut ConfigFile) {
        if !self.etcd_endpoints.is_empty() {
            cfg.set(SECTION, "etcd_endpoints", self.etcd_endpoints.join(","));
        }
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        let values = [
            ("etcd_prefix", self.etcd_prefix.clone()),
            ("etcd_user", self.etcd_user.clone()),
            ("etcd_password", self.etcd_password.clone()),
            ("etcd_ca_file", self.etcd_ca_file.as_ref().map(path)),
            ("etcd_cert_file", self.etcd_cert_file.as_ref().map(path)),
            ("etcd_key_file", self.etcd_key_file.as_ref().map(path)),
        ];
        for (key, value) in values {
            if let Some(v) = value {
                cfg.set(SECTION, key, v);
            }
        }
    }
}

/// The etcd settings of `[couch_jobs]`, or `None` when no endpoints are set.
pub fn etcd_config(cfg: &ConfigFile) -> Result<Option<EtcdConfig>, String> {
    let get = |key: &str| {
        cfg.get(SECTION, key)
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let Some(endpoints) = get("etcd_endpoints") else {
        return Ok(None);
    };
    let endpoints: Vec<String> = endpoints
        .split(',')
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect();
    for e in &endpoints {
        let ok = url::Url::parse(e).is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
        if !ok {
            return Err(format!(
                "[couch_jobs] etcd_endpoints: {e:?} is not an http:// or https:// URL"
            ));
        }
    }
    let mut config = EtcdConfig::new(endpoints);
    if let Some(prefix) = get("etcd_prefix") {
        config.prefix = prefix.to_string();
    }
    config.user = match (get("etcd_user"), get("etcd_password")) {
        (Some(user), Some(password)) => Some((user.to_string(), password.to_string())),
        (None, None) => None,
        _ => {
            return Err("[couch_jobs] etcd_user and etcd_password must be set together".into());
        }
    };
    config.ca_file = get("etcd_ca_file").map(PathBuf::from);
    config.cert_file = get("etcd_cert_file").map(PathBuf::from);
    config.key_file = get("etcd_key_file").map(PathBuf::from);
    Ok(Some(config))
}

/// Connects to the etcd cluster `[couch_jobs]` names, if any.
pub async fn open_etcd(cfg: &ConfigFile) -> Result<Option<Db>, String> {
    let Some(config) = etcd_config(cfg)? else {
        return Ok(None);
    };
    let store = EtcdStore::connect(&config)
        .await
        .map_err(|e| format!("cannot reach etcd at {}: {e}", config.endpoints.join(",")))?;
    tracing::info!(endpoints = ?config.endpoints, prefix = %config.prefix, "job store: etcd");
    Ok(Some(Db::new(Arc::new(store))))
}

/// The server uuid kept in the data directory, so replication ids survive restarts.
pub fn server_uuid(dir: &Path) -> Result<String, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let p = dir.join("server_uuid");
    match std::fs::read_to_string(&p) {
        Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
        _ => {
            let id = uuid::Uuid::new_v4().simple().to_string();
            std::fs::write(&p, &id).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
            Ok(id)
        }
    }
}

fn open_local(args: &ServeArgs) -> Result<Db, String> {
    #[cfg(feature = "fdb")]
    if let Some(f) = &args.fdb_cluster_file {
        use crate::store::fdb::{FdbStore, boot_network};
        let path = f
            .to_str()
            .ok_or_else(|| format!("cluster file path {} is not UTF-8", f.display()))?;
        boot_network().map_err(|e| format!("cannot start the FoundationDB client: {e}"))?;
        let store = FdbStore::open(Some(path))
            .map_err(|e| format!("cannot open FoundationDB through {}: {e}", f.display()))?;
        return Ok(Db::new(Arc::new(store)));
    }
    std::fs::create_dir_all(&args.data_dir)
        .map_err(|e| format!("cannot create {}: {e}", args.data_dir.display()))?;
    let store = EmbeddedStore::open(args.data_dir.join("jobs.redb"))
        .map_err(|e| format!("cannot open the store in {}: {e}", args.data_dir.display()))?;
    Ok(Db::new(Arc::new(store)))
}

/// The job store `serve` runs on, and whether other nodes may share it (etcd, FoundationDB).
pub async fn open(args: &ServeArgs, cfg: &ConfigFile) -> Result<(Db, bool), String> {
    if let Some(db) = open_etcd(cfg).await? {
        return Ok((db, true));
    }
    #[cfg(feature = "fdb")]
    let shared = args.fdb_cluster_file.is_some();
    #[cfg(not(feature = "fdb"))]
    let shared = false;
    Ok((open_local(args)?, shared))
}

/// Records `uuid` as the cluster's server uuid if none is yet, and refuses a different one.
pub async fn check_uuid(db: &Db, uuid: &str) -> Result<(), String> {
    let key = tuple::pack(&("couch_replicator", "server_uuid"));
    let recorded = db
        .run(|tx: Tx| {
            let key = key.clone();
            async move {
                match tx.get(&key, false).await? {
                    Some(v) => Ok(String::from_utf8_lossy(&v).into_owned()),
                    None => {
                        tx.set(&key, uuid.as_bytes());
                        Ok::<_, StoreError>(uuid.to_string())
                    }
                }
            }
        })
        .await
        .map_err(|e| format!("cannot check the server uuid in the job store: {e}"))?;
    if recorded != uuid {
        return Err(format!(
            "this node's server uuid {uuid} differs from {recorded}, the uuid of the cluster \
             whose job store it joins: set [couchdb] uuid = {recorded} on every node sharing it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_settings_from_flags_and_file() {
        let mut cfg =
            ConfigFile::parse("[couch_jobs]\netcd_endpoints = http://a:2379, http://b:2379\n")
                .unwrap();
        let c = etcd_config(&cfg).unwrap().unwrap();
        assert_eq!(c.endpoints, ["http://a:2379", "http://b:2379"]);
        assert_eq!(c.prefix, "couch-replicator/");
        let flags = EtcdArgs {
            etcd_prefix: Some("two/".into()),
            etcd_user: Some("root".into()),
            etcd_password: Some("s3cret".into()),
            ..EtcdArgs::default()
        };
        flags.apply(&mut cfg);
        let c = etcd_config(&cfg).unwrap().unwrap();
        assert_eq!(c.prefix, "two/");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(
            etcd_config(&ConfigFile::parse("").unwrap())
                .unwrap()
                .is_none()
        );
        let bad = ConfigFile::parse("[couch_jobs]\netcd_endpoints = a:2379\n").unwrap();
        assert!(etcd_config(&bad).unwrap_err().contains("etcd_endpoints"));
        let half =
            ConfigFile::parse("[couch_jobs]\netcd_endpoints = http://a\netcd_user = u\n").unwrap();
        assert!(etcd_config(&half).unwrap_err().contains("together"));
    }

    #[tokio::test]
    async fn a_second_uuid_is_refused() {
        let db = Db::new(Arc::new(crate::store::memory::MemoryStore::new()));
        check_uuid(&db, "u1").await.unwrap();
        check_uuid(&db, "u1").await.unwrap();
        let e = check_uuid(&db, "u2").await.unwrap_err();
        assert!(e.contains("u1") && e.contains("[couchdb] uuid"), "{e}");
    }
}
