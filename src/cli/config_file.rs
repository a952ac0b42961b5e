//! The node's configuration file: CouchDB's ini format (`[section]`, `key = value`, `;`/`#`
//! comments), which also reads flat TOML files (quoted strings are unquoted), plus environment
//! overrides `COUCH_REPLICATOR__<SECTION>__<KEY>=value`. Sections keep CouchDB's names:
//! `[replicator]`, `[admins]`, `[chttpd]`, `[couchdb]`; ours are `[users]` (non-admin
//! Basic-auth users) and `[replicator_dbs]` (`name = URL` of `_replicator` databases).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use couch_replicator::replicator::ReplicatorSettings;

/// Sections of key/value pairs, in file order of keys per section (later keys win).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFile {
    sections: BTreeMap<String, Vec<(String, String)>>,
}

/// The prefix of environment overrides.
pub const ENV_PREFIX: &str = "COUCH_REPLICATOR__";

impl ConfigFile {
    /// Parses ini/flat-TOML text; errors name the line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut cfg = Self::default();
        let mut section: Option<String> = None;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[') {
                let name = name
                    .strip_suffix(']')
                    .ok_or_else(|| format!("line {}: unterminated section header", n + 1))?;
                section = Some(name.trim().to_owned());
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected `key = value`", n + 1))?;
            let sec = section.clone().ok_or_else(|| {
                format!("line {}: `{}` is outside any [section]", n + 1, k.trim())
            })?;
            cfg.set(&sec, k.trim(), unquote(v.trim()));
        }
        Ok(cfg)
    }

    /// Sets one value (later values win).
    pub fn set(&mut self, section: &str, key: &str, value: String) {
        let s = self.sections.entry(section.to_owned()).or_default();
        s.retain(|(k, _)| k != key);
        s.push((key.to_owned(), value));
    }

    /// Applies `COUCH_REPLICATOR__SECTION__KEY=value` overrides (section and key lowercased).
    pub fn apply_env(&mut self, vars: impl IntoIterator<Item = (String, String)>) {
        for (k, v) in vars {
            if let Some(rest) = k.strip_prefix(ENV_PREFIX)
                && let Some((sec, key)) = rest.split_once("__")
            {
                self.set(&sec.to_lowercase(), &key.to_lowercase(), v);
            }
        }
    }

    /// One value.
    pub fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.sections
            .get(section)?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every pair of a section.
    pub fn section(&self, section: &str) -> &[(String, String)] {
        self.sections.get(section).map_or(&[], Vec::as_slice)
    }

    /// `[replicator]` as typed settings: numbers and booleans are read as such, `node_types`
    /// as a comma-separated list; unknown keys are errors naming the key.
    pub fn replicator_settings(&self) -> Result<ReplicatorSettings, String> {
        let mut m = Map::new();
        for (k, v) in self.section("replicator") {
            let val = if k == "node_types" {
                Value::Array(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| Value::String(s.to_owned()))
                        .collect(),
                )
            } else if let Ok(n) = v.parse::<u64>() {
                Value::from(n)
            } else if let Ok(x) = v.parse::<f64>() {
                Value::from(x)
            } else {
                Value::String(v.clone())
            };
            m.insert(k.clone(), val);
        }
        // `[replicator.shares]`: fair-share weight per `_replicator` database.
        let mut shares = Map::new();
        for (db, v) in self.section("replicator.shares") {
            let n: u32 = v
                .parse()
                .map_err(|_| format!("[replicator.shares] {db}: not a number of shares"))?;
            shares.insert(db.clone(), Value::from(n));
        }
        if !shares.is_empty() {
            m.insert("shares".into(), Value::Object(shares));
        }
        let s: ReplicatorSettings =
            serde_json::from_value(Value::Object(m)).map_err(|e| format!("[replicator]: {e}"))?;
        s.validate()?;
        Ok(s)
    }
}

fn unquote(v: &str) -> String {
    // A quoted TOML string ends at its closing quote; anything after it is a comment.
    for q in ['"', '\''] {
        if let Some(rest) = v.strip_prefix(q)
            && let Some(end) = rest.find(q)
        {
            return rest[..end].to_owned();
        }
    }
    // An unquoted value may carry a trailing ` #` / ` ;` comment.
    match v.find(" #").or_else(|| v.find(" ;")) {
        Some(i) => v[..i].trim_end().to_owned(),
        None => v.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use couch_replicator::replicator::NodeType;

    #[test]
    fn ini_toml_and_env() {
        let text = "; CouchDB style\n[replicator]\nmax_jobs = 50\nnode_types = replication\n\n\
                    [admins]\nadmin = \"s3cret\" # toml comment\n[chttpd]\nport = 6000\n";
        let mut c = ConfigFile::parse(text).unwrap();
        assert_eq!(c.get("admins", "admin"), Some("s3cret"));
        let q = ConfigFile::parse("[a]\nx = 'p # q' ; c\ny = plain ; c\nz = a=b").unwrap();
        assert_eq!(q.get("a", "x"), Some("p # q"));
        assert_eq!(q.get("a", "y"), Some("plain"));
        assert_eq!(q.get("a", "z"), Some("a=b"));
        c.apply_env([
            (
                "COUCH_REPLICATOR__CHTTPD__PORT".to_string(),
                "7000".to_string(),
            ),
            ("OTHER".to_string(), "x".to_string()),
        ]);
        assert_eq!(c.get("chttpd", "port"), Some("7000"));
        let s = c.replicator_settings().unwrap();
        assert_eq!(s.max_jobs, 50);
        assert_eq!(s.node_types, vec![NodeType::Replication]);
        assert!(ConfigFile::parse("x = 1").unwrap_err().contains("line 1"));
        assert!(ConfigFile::parse("[a\n").is_err());
        let fair = ConfigFile::parse(
            "[replicator]\nusage_coeff = 0.25\n[replicator.shares]\nbig/_replicator = 900\n",
        )
        .unwrap()
        .replicator_settings()
        .unwrap();
        assert_eq!(fair.usage_coeff, 0.25);
        assert_eq!(fair.shares["big/_replicator"], 900);
        let bad = ConfigFile::parse("[replicator]\nmax_jobz = 1").unwrap();
        assert!(bad.replicator_settings().unwrap_err().contains("max_jobz"));
        let zero = ConfigFile::parse("[replicator]\nmax_jobs = 0").unwrap();
        assert!(zero.replicator_settings().unwrap_err().contains("max_jobs"));
    }
}
