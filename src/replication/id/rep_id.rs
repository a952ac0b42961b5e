//! Replication ids exactly as CouchDB 3.4 computes them, so both find each other's `_local`
//! checkpoints: the lower-case hex MD5 of `term_to_binary` of a list of Erlang terms, version 4
//! being `[ServerUuid, Source, Target | Filter] ++ [<<"winning_revs_only">>]`, with `+continuous`
//! / `+create_target` appended to the full id. Versions 3, 2 and 1 (older endpoint shapes, the
//! host name and port instead of the uuid) are computed too: CouchDB still reads checkpoints
//! written under them and moves them to the version-4 id. `since_seq` is not part of any id.

use md5::{Digest, Md5};
use serde_json::Value;

use super::etf::{Term, term_to_binary};
use crate::replication::endpoint::database::Endpoint;
use crate::replication::options::spec::{Filter, ReplicationSpec};

/// The id version CouchDB 3.4 writes (`replication_id_version` in checkpoints).
pub(crate) const REP_ID_VERSION: u32 = 4;

/// The port CouchDB 3.4's version-2 ids use when its node-local HTTP server is off (the
/// default): the `[httpd] port` setting, 5986 in its default configuration.
pub(crate) const V2_HTTPD_PORT: i128 = 5986;

/// A replication id: the base (used for `_local/<base>` checkpoints) and the extension.
///
/// Stored and shown as its full text (`base ++ ext`): job records, events and JSON bodies
/// carry the string CouchDB shows, and read it back with [`RepId::from_full`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RepId {
    /// 32 hex chars.
    pub base: String,
    /// `""`, `"+continuous"`, `"+create_target"` or both.
    pub ext: String,
}

impl RepId {
    /// Reads a full id (`base ++ ext`, as `_scheduler/jobs` shows it and job records store
    /// it): the extension starts at the first `+` (`+continuous`, `+create_target`).
    pub fn from_full(full: &str) -> Self {
        match full.find('+') {
            Some(i) => RepId {
                base: full[..i].to_owned(),
                ext: full[i..].to_owned(),
            },
            None => RepId {
                base: full.to_owned(),
                ext: String::new(),
            },
        }
    }

    /// `base ++ ext`, the id shown in `_scheduler/jobs`.
    pub fn full(&self) -> String {
        format!("{}{}", self.base, self.ext)
    }
}

impl serde::Serialize for RepId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for RepId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let full = String::deserialize(d)?;
        Ok(RepId::from_full(&full))
    }
}

impl std::fmt::Display for RepId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.base, self.ext)
    }
}

fn bin(s: &str) -> Term {
    Term::Bin(s.as_bytes().to_vec())
}

fn string(s: &str) -> Term {
    Term::Str(s.as_bytes().to_vec())
}

/// JSON as CouchDB holds it (objects are `{[{Key, Value}]}`), keys sorted when `sorted`.
fn ejson(v: &Value, sorted: bool) -> Term {
    match v {
        Value::Null => Term::Atom("null"),
        Value::Bool(true) => Term::Atom("true"),
        Value::Bool(false) => Term::Atom("false"),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Term::Int(i128::from(i)),
            (_, Some(u)) => Term::Int(i128::from(u)),
            _ => Term::Float(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => bin(s),
        Value::Array(a) => Term::List(a.iter().map(|x| ejson(x, sorted)).collect()),
        Value::Object(m) => {
            let mut pairs: Vec<(&String, &Value)> = m.iter().collect();
            if sorted {
                pairs.sort_by(|a, b| a.0.cmp(b.0));
            }
            let props = pairs
                .into_iter()
                .map(|(k, v)| Term::Tuple(vec![bin(k), ejson(v, sorted)]))
                .collect();
            Term::Tuple(vec![Term::List(props)])
        }
    }
}

fn headers_term(ep: &Endpoint) -> Term {
    Term::List(
        ep.id_view()
            .headers
            .iter()
            .map(|(k, v)| Term::Tuple(vec![string(k), string(v)]))
            .collect(),
    )
}

/// `{remote, User, Host, Port, Path, Headers, undefined}`.
fn v4_endpoint(ep: &Endpoint) -> Term {
    let view = ep.id_view();
    let user = match &view.user {
        Some(u) => Term::Str(u.clone()),
        None => Term::Atom("undefined"),
    };
    let (host, port, path) = match view.url_info() {
        Some(i) => (
            string(&i.host),
            i.port
                .map_or(Term::Atom("default"), |p| Term::Int(i128::from(p))),
            string(&i.path),
        ),
        None => (
            string(&view.url),
            Term::Atom("undefined"),
            Term::Atom("undefined"),
        ),
    };
    Term::Tuple(vec![
        Term::Atom("remote"),
        user,
        host,
        port,
        path,
        headers_term(ep),
        Term::Atom("undefined"),
    ])
}

/// `{remote, Url, Headers}` (versions 1 to 3).
fn old_endpoint(ep: &Endpoint) -> Term {
    Term::Tuple(vec![
        Term::Atom("remote"),
        string(&ep.id_view().url),
        headers_term(ep),
    ])
}

/// A filter function's code as CouchDB hashes it: its `^ *(.*?) *$` rewrite, which trims
/// spaces (not other white space) only when no line break is left inside.
pub(crate) fn trim_filter_code(code: &str) -> String {
    let (body, tail) = match code.strip_suffix('\n') {
        Some(b) => (b, "\n"),
        None => (code, ""),
    };
    let inner = body.trim_matches(' ');
    if inner.contains('\n') {
        code.to_owned()
    } else {
        format!("{inner}{tail}")
    }
}

fn filter_terms(spec: &ReplicationSpec, filter_code: Option<&str>) -> Vec<Term> {
    let o = &spec.options;
    let mut parts = Vec::new();
    match &o.filter {
        Filter::None => {}
        Filter::DocIds(ids) => parts.push(Term::List(ids.iter().map(|i| bin(i)).collect())),
        Filter::Selector(sel) => {
            // Options parsing has rejected selectors that do not normalise.
            let n = super::selector::normalize(sel).unwrap_or_else(|_| sel.clone());
            parts.push(ejson(&n, true));
        }
        Filter::Named { name, query_params } => {
            let head = if name.starts_with('_') {
                name.clone()
            } else {
                trim_filter_code(filter_code.unwrap_or(name))
            };
            parts.push(bin(&head));
            parts.push(ejson(&Value::Object(query_params.clone()), false));
        }
    }
    if o.winning_revs_only {
        parts.push(bin("winning_revs_only"));
    }
    parts
}

/// The base id of `version` (1 to 4). `server_uuid` is the replicating node's uuid;
/// `filter_code` the code of a user filter `ddoc/name` as stored in the source.
pub fn base_id(
    version: u32,
    server_uuid: &str,
    spec: &ReplicationSpec,
    filter_code: Option<&str>,
) -> String {
    base_id_on_host(version, server_uuid, &local_hostname(), spec, filter_code)
}

/// [`base_id`] as computed on a machine named `host` (versions 1 and 2 contain it).
pub fn base_id_on_host(
    version: u32,
    server_uuid: &str,
    host: &str,
    spec: &ReplicationSpec,
    filter_code: Option<&str>,
) -> String {
    let (src, tgt) = (&spec.source, &spec.target);
    let mut parts = match version {
        4 => vec![bin(server_uuid), v4_endpoint(src), v4_endpoint(tgt)],
        3 => vec![bin(server_uuid), old_endpoint(src), old_endpoint(tgt)],
        2 => vec![
            string(host),
            Term::Int(V2_HTTPD_PORT),
            old_endpoint(src),
            old_endpoint(tgt),
        ],
        _ => vec![string(host), old_endpoint(src), old_endpoint(tgt)],
    };
    parts.extend(filter_terms(spec, filter_code));
    hex::encode(Md5::digest(term_to_binary(&Term::List(parts))))
}

/// The current (version 4) id with its extension.
pub fn replication_id(
    server_uuid: &str,
    spec: &ReplicationSpec,
    filter_code: Option<&str>,
) -> RepId {
    let o = &spec.options;
    let mut ext = String::new();
    if o.continuous {
        ext.push_str("+continuous");
    }
    if o.create_target {
        ext.push_str("+create_target");
    }
    RepId {
        base: base_id(REP_ID_VERSION, server_uuid, spec, filter_code),
        ext,
    }
}

/// The name of the design-document filter whose code is part of `spec`'s id (it must be
/// read from the source first); `None` when the id depends on the request alone.
pub fn filter_needing_code(spec: &ReplicationSpec) -> Option<&str> {
    match &spec.options.filter {
        Filter::Named { name, .. } if !name.starts_with('_') => Some(name),
        _ => None,
    }
}

/// The id of `spec` when it can be computed without asking the source (no design-document
/// filter), as CouchDB shows it for a job that has not run yet.
pub fn replication_id_offline(server_uuid: &str, spec: &ReplicationSpec) -> Option<RepId> {
    filter_needing_code(spec)
        .is_none()
        .then(|| replication_id(server_uuid, spec, None))
}

/// The base ids of versions 4, 3, 2 and 1, newest first: where a checkpoint may be found.
pub fn checkpoint_ids(
    server_uuid: &str,
    spec: &ReplicationSpec,
    filter_code: Option<&str>,
) -> Vec<String> {
    (1..=REP_ID_VERSION)
        .rev()
        .map(|v| base_id(v, server_uuid, spec, filter_code))
        .collect()
}

/// This machine's host name up to the first dot, as Erlang's `inet:gethostname/0` gives it.
fn local_hostname() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc != 0 {
            return "localhost".to_owned();
        }
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        let name = String::from_utf8_lossy(&buf[..end]).into_owned();
        name.split('.').next().unwrap_or_default().to_owned()
    })
    .clone()
}

#[cfg(test)]
mod tests {
    #[test]
    fn rep_ids_read_back_from_their_full_text() {
        for full in [
            "0123abcd",
            "0123abcd+continuous",
            "0123abcd+continuous+create_target",
        ] {
            let id: super::RepId = serde_json::from_value(serde_json::json!(full)).unwrap();
            assert_eq!(id.full(), full);
            assert_eq!(serde_json::to_value(&id).unwrap(), serde_json::json!(full));
        }
        let id = super::RepId::from_full("0123abcd+continuous+create_target");
        assert_eq!(
            (id.base.as_str(), id.ext.as_str()),
            ("0123abcd", "+continuous+create_target")
        );
    }

    use super::*;

    fn spec(src: &str, tgt: &str) -> ReplicationSpec {
        ReplicationSpec::new(Endpoint::parse(src).unwrap(), Endpoint::parse(tgt).unwrap())
    }

    /// Known answers: `couch_util:to_hex(crypto:hash(md5, term_to_binary(T, [{minor_version,
    /// 1}])))` evaluated by CouchDB 3.4.3's runtime for these terms.
    #[test]
    fn version_3_and_4_terms_hash_as_in_erlang() {
        let s = spec(
            "http://127.0.0.1:5984/fx_src",
            "http://127.0.0.1:5984/fx_tgt",
        );
        let uuid = "15f3d267c7c2af38a6aa418e864a39f9";
        assert_eq!(
            base_id(4, uuid, &s, None),
            "c34cd4d715344b464217f1904b3a19a5"
        );
        // [U, {remote, "http://127.0.0.1:5984/fx_src/", []}, {remote, ".../fx_tgt/", []}]
        assert_eq!(
            base_id(3, uuid, &s, None),
            "297a0495b7d2fc96bf827d9c907b2444"
        );
    }

    #[test]
    fn filter_code_is_trimmed_like_couchdb() {
        // Known answers from re:replace(Code, "^\s*(.*?)\s*$", "\\1") in Erlang, where "\s"
        // is a plain space.
        let cases = [
            ("  f  ", "f"),
            ("  f \n", "f\n"),
            (" f\r\n", "f\r\n"),
            ("\n f", "\n f"),
            ("f \n\n", "f \n\n"),
            ("\tf\t", "\tf\t"),
            ("  ", ""),
            ("", ""),
            (" a b ", "a b"),
            ("f\n ", "f\n "),
            (" \n", "\n"),
        ];
        for (code, want) in cases {
            assert_eq!(trim_filter_code(code), want, "{code:?}");
        }
    }

    #[test]
    fn extensions_and_what_changes_the_base() {
        let base = spec("http://127.0.0.1:1/a", "http://127.0.0.1:2/b");
        let id0 = replication_id("u", &base, None);
        let mut s = base.clone();
        s.options.continuous = true;
        s.options.create_target = true;
        let id = replication_id("u", &s, None);
        assert_eq!(id.base, id0.base);
        assert_eq!(id.ext, "+continuous+create_target");
        let mut s = base.clone();
        s.options.since_seq = Some(serde_json::json!(42));
        assert_eq!(
            replication_id("u", &s, None),
            id0,
            "since_seq is not in the id"
        );
        assert_ne!(replication_id("v", &base, None), id0, "the uuid is");
        let ids = checkpoint_ids("u", &base, None);
        assert_eq!(ids.len(), 4);
        assert_eq!(ids[0], id0.base);
    }
}
