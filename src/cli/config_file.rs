//! The node's configuration: one or more CouchDB ini files layered in order (later files win,
//! a directory stands for its `*.ini` files in name order, as CouchDB does), then environment
//! overrides `COUCH_REPLICATOR__<SECTION>__<KEY>=value`. The dialect is CouchDB's
//! (`[section]`, `key = value`, `;` comments, inline only after a space or tab), which also
//! reads flat TOML files (`#` comments, quoted strings unquoted). Sections keep CouchDB's
//! names: `[replicator]`, `[admins]`, `[chttpd]`, `[chttpd_auth]`, `[couchdb]`; ours are
//! `[users]` (non-admin users), `[replicator_dbs]` (`name = URL` of `_replicator` databases),
//! `[steps]` and `[auth_couchdb]` (a CouchDB whose users may call this node). Whatever else a
//! CouchDB file holds is reported by [`ConfigFile::unused`] and otherwise ignored.
//!
//! A hand-written reader rather than an ini crate: CouchDB's dialect differs from what those
//! implement (only ` ;`/`\t;` start an inline comment, `#` and backslashes are literal,
//! ` = ` splits before `=`, repeated sections merge), and it is a screenful of code.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Sections of key/value pairs, in file order of keys per section (later keys win). `Debug`
/// shows section and key names only: values include passwords and secrets.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConfigFile {
    sections: BTreeMap<String, Vec<(String, String)>>,
}

impl std::fmt::Debug for ConfigFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        for (sec, pairs) in &self.sections {
            let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
            m.entry(sec, &keys);
        }
        m.finish()
    }
}

/// Why the configuration could not be read; the message names the file and line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not in CouchDB's ini dialect.
    #[error("{}: {error}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Where and what.
        #[source]
        error: SyntaxError,
    },
}

/// A line the ini reader cannot read.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {kind}")]
pub struct SyntaxError {
    /// The line number (from 1).
    pub line: usize,
    /// What is wrong with it.
    pub kind: SyntaxKind,
}

/// What is wrong with a line.
#[derive(Debug, thiserror::Error)]
pub enum SyntaxKind {
    /// `[name` without its `]`.
    #[error("unterminated section header")]
    UnterminatedSection,
    /// Neither a section, a comment nor `key = value`.
    #[error("expected `key = value`")]
    ExpectedKeyValue,
    /// A `key = value` line before the first section.
    #[error("`{0}` is outside any [section]")]
    OutsideSection(String),
}

/// The prefix of environment overrides.
pub const ENV_PREFIX: &str = "COUCH_REPLICATOR__";

impl ConfigFile {
    /// Reads and layers `paths` (files, or directories of `*.ini` files); errors name the
    /// file and line.
    pub fn load(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        let mut cfg = Self::default();
        for p in expand(paths)? {
            let text = std::fs::read_to_string(&p).map_err(|source| ConfigError::Read {
                path: p.clone(),
                source,
            })?;
            cfg.merge_text(&text)
                .map_err(|error| ConfigError::Syntax { path: p, error })?;
        }
        Ok(cfg)
    }

    /// Parses ini/flat-TOML text; errors name the line.
    #[cfg(test)]
    pub fn parse(text: &str) -> Result<Self, SyntaxError> {
        let mut cfg = Self::default();
        cfg.merge_text(text)?;
        Ok(cfg)
    }

    /// Adds the pairs of `text` over the current ones.
    fn merge_text(&mut self, text: &str) -> Result<(), SyntaxError> {
        let cfg = self;
        let mut section: Option<String> = None;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[') {
                let name = name
                    .strip_suffix(']')
                    .ok_or_else(|| syntax(n, SyntaxKind::UnterminatedSection))?;
                section = Some(name.trim().to_owned());
                continue;
            }
            // CouchDB splits on ` = ` first, so a key may contain `=`.
            let (k, v) = line
                .split_once(" = ")
                .or_else(|| line.split_once('='))
                .ok_or_else(|| syntax(n, SyntaxKind::ExpectedKeyValue))?;
            let sec = section
                .clone()
                .ok_or_else(|| syntax(n, SyntaxKind::OutsideSection(k.trim().to_owned())))?;
            let v = unquote(v.trim());
            // CouchDB skips `key =` lines (an empty value deletes nothing and sets nothing).
            if !v.is_empty() {
                cfg.set(&sec, k.trim(), v);
            }
        }
        Ok(())
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

    /// Sections and keys this node does not use, one line per section (so loading CouchDB's
    /// `default.ini` logs a screenful, not hundreds of lines). `known(section, key)` says
    /// whether a key is used; sections of names (`[admins]`, ...) accept every key.
    pub fn unused(&self, known: impl Fn(&str, &str) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        for (sec, pairs) in &self.sections {
            let keys: Vec<&str> = pairs
                .iter()
                .map(|(k, _)| k.as_str())
                .filter(|k| !known(sec, k))
                .collect();
            if keys.is_empty() {
                continue;
            }
            if keys.len() == pairs.len() && !known(sec, "") {
                out.push(format!(
                    "[{sec}] is not used by this node ({} keys)",
                    keys.len()
                ));
            } else {
                out.push(format!(
                    "[{sec}] keys not used by this node: {}",
                    keys.join(", ")
                ));
            }
        }
        out
    }
}

/// Files in layering order: each path as given, a directory as its `*.ini` files sorted.
fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ConfigError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut inis: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|source| ConfigError::Read {
                    path: p.clone(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "ini") && f.is_file())
                .collect();
            inis.sort();
            out.extend(inis);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// The error of line index `n`.
fn syntax(n: usize, kind: SyntaxKind) -> SyntaxError {
    SyntaxError { line: n + 1, kind }
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
    let at = [" #", " ;", "\t#", "\t;"]
        .iter()
        .filter_map(|c| v.find(c))
        .min();
    match at {
        Some(i) => v[..i].trim_end().to_owned(),
        None => v.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_toml_and_env() {
        let text = "; CouchDB style\n[replicator]\nmax_jobs = 50\nnode_types = replication\n\n\
                    [admins]\nadmin = \"s3cret\" # toml comment\n[chttpd]\nport = 6000\n";
        let mut c = ConfigFile::parse(text).unwrap();
        assert_eq!(c.get("admins", "admin"), Some("s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
        let q = ConfigFile::parse("[a]\nx = 'p # q' ; c\ny = plain\t; c\nz = a=b\nw =\n").unwrap();
        assert_eq!(q.get("a", "x"), Some("p # q"));
        assert_eq!(q.get("a", "y"), Some("plain"));
        assert_eq!(q.get("a", "z"), Some("a=b"));
        assert_eq!(q.get("a", "w"), None);
        c.apply_env([
            (
                "COUCH_REPLICATOR__CHTTPD__PORT".to_string(),
                "7000".to_string(),
            ),
            ("OTHER".to_string(), "x".to_string()),
        ]);
        assert_eq!(c.get("chttpd", "port"), Some("7000"));
        assert!(
            ConfigFile::parse("x = 1")
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
        assert!(ConfigFile::parse("[a\n").is_err());
    }

    #[test]
    fn files_and_directories_layer_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("default.ini"),
            "[chttpd]\nport = 1\nbind_address = 0.0.0.0\n",
        )
        .unwrap();
        std::fs::create_dir(d.join("local.d")).unwrap();
        std::fs::write(d.join("local.d/b.ini"), "[chttpd]\nport = 3\n").unwrap();
        std::fs::write(d.join("local.d/a.ini"), "[chttpd]\nport = 2\n[x]\ny = 1\n").unwrap();
        std::fs::write(d.join("local.d/notes.txt"), "not ini").unwrap();
        let c = ConfigFile::load(&[d.join("default.ini"), d.join("local.d")]).unwrap();
        assert_eq!(c.get("chttpd", "port"), Some("3"));
        assert_eq!(c.get("chttpd", "bind_address"), Some("0.0.0.0"));
        assert_eq!(c.get("x", "y"), Some("1"));
        let e = ConfigFile::load(&[d.join("missing.ini")]).unwrap_err();
        assert!(e.to_string().contains("missing.ini"), "{e}");
    }

    #[test]
    fn couchdb_default_ini_loads_and_unused_parts_are_summarised() {
        let text = include_str!("../../tests/fixtures/couchdb-3.4.3-default.ini");
        let c = ConfigFile::parse(text).unwrap();
        assert_eq!(c.get("chttpd", "port"), Some("5984"));
        let unused = c.unused(|sec, key| sec == "chttpd" && key == "port");
        assert!(
            unused
                .iter()
                .any(|l| l.starts_with("[couchdb] is not used")),
            "{unused:?}"
        );
        let chttpd: Vec<_> = unused
            .iter()
            .filter(|l| l.starts_with("[chttpd]"))
            .collect();
        assert_eq!(chttpd.len(), 1, "{unused:?}");
        assert!(chttpd[0].contains("bind_address") && !chttpd[0].contains("port,"));
    }
}
