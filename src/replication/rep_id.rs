//! The replication id (digest D.1, version 4): lowercase hex MD5 over the Erlang External Term
//! Format encoding of `[ServerUUID, SrcInfo, TgtInfo | FilterParts] ++ [winning_revs_only]`,
//! with `+continuous` / `+create_target` appended to the full id. The term structure and the
//! ETF bytes follow CouchDB 3.x (`minor_version 1`: Latin-1 atoms, `STRING_EXT` for char
//! lists, `BINARY_EXT` for binaries, `NEW_FLOAT_EXT`). Bit-compatibility with a real CouchDB
//! has not been verified against one (none is available here); the id is deterministic and
//! covers everything that changes the result.

use md5::{Digest, Md5};
use serde_json::Value;

use super::endpoint::Endpoint;
use super::options::{Filter, ReplicationSpec};

/// A replication id: the base (used for `_local/<base>` checkpoints) and the extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepId {
    /// 32 hex chars.
    pub base: String,
    /// `""`, `"+continuous"`, `"+create_target"` or both.
    pub ext: String,
}

impl RepId {
    /// `base ++ ext`, the id shown in `_scheduler/jobs`.
    pub fn full(&self) -> String {
        format!("{}{}", self.base, self.ext)
    }
}

impl std::fmt::Display for RepId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.base, self.ext)
    }
}

/// An Erlang term, only the shapes the id needs.
#[derive(Debug, Clone)]
enum Term {
    Atom(&'static str),
    Bin(Vec<u8>),
    /// An Erlang string (char list).
    Str(Vec<u8>),
    Int(i64),
    Float(f64),
    Tuple(Vec<Term>),
    List(Vec<Term>),
}

fn encode(t: &Term, out: &mut Vec<u8>) {
    match t {
        Term::Atom(a) => {
            out.push(100);
            out.extend_from_slice(&(a.len() as u16).to_be_bytes());
            out.extend_from_slice(a.as_bytes());
        }
        Term::Bin(b) => {
            out.push(109);
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.extend_from_slice(b);
        }
        Term::Str(s) if s.is_empty() => out.push(106),
        Term::Str(s) if s.len() <= 0xffff => {
            out.push(107);
            out.extend_from_slice(&(s.len() as u16).to_be_bytes());
            out.extend_from_slice(s);
        }
        Term::Str(s) => encode(
            &Term::List(s.iter().map(|b| Term::Int(i64::from(*b))).collect()),
            out,
        ),
        Term::Int(i) if (0..256).contains(i) => {
            out.push(97);
            out.push(*i as u8);
        }
        Term::Int(i) if i32::try_from(*i).is_ok() => {
            out.push(98);
            out.extend_from_slice(&(*i as i32).to_be_bytes());
        }
        Term::Int(i) => {
            let mut mag = i.unsigned_abs();
            let mut digits = Vec::new();
            while mag > 0 {
                digits.push((mag & 0xff) as u8);
                mag >>= 8;
            }
            out.push(110);
            out.push(digits.len() as u8);
            out.push(u8::from(*i < 0));
            out.extend_from_slice(&digits);
        }
        Term::Float(f) => {
            out.push(70);
            out.extend_from_slice(&f.to_be_bytes());
        }
        Term::Tuple(items) => {
            out.push(104);
            out.push(items.len() as u8);
            for i in items {
                encode(i, out);
            }
        }
        Term::List(items) if items.is_empty() => out.push(106),
        Term::List(items) => {
            out.push(108);
            out.extend_from_slice(&(items.len() as u32).to_be_bytes());
            for i in items {
                encode(i, out);
            }
            out.push(106);
        }
    }
}

/// JSON as CouchDB's EJSON term (`{PropList}` objects, binaries, atoms).
fn ejson(v: &Value, sort_keys: bool) -> Term {
    match v {
        Value::Null => Term::Atom("null"),
        Value::Bool(true) => Term::Atom("true"),
        Value::Bool(false) => Term::Atom("false"),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Term::Int(i),
            None => Term::Float(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => Term::Bin(s.as_bytes().to_vec()),
        Value::Array(a) => Term::List(a.iter().map(|x| ejson(x, sort_keys)).collect()),
        Value::Object(m) => {
            let mut pairs: Vec<(&String, &Value)> = m.iter().collect();
            if sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(b.0));
            }
            let props = pairs
                .into_iter()
                .map(|(k, v)| {
                    Term::Tuple(vec![Term::Bin(k.as_bytes().to_vec()), ejson(v, sort_keys)])
                })
                .collect();
            Term::Tuple(vec![Term::List(props)])
        }
    }
}

fn endpoint_term(ep: &Endpoint) -> Term {
    let u = ep.parsed_url();
    let user = match ep.user() {
        Some(name) => Term::Bin(name.as_bytes().to_vec()),
        None => Term::Atom("undefined"),
    };
    let port = match (u.scheme(), u.port_or_known_default()) {
        ("http", Some(80 | 5984)) | ("https", Some(443)) => Term::Atom("default"),
        (_, Some(p)) => Term::Int(i64::from(p)),
        (_, None) => Term::Atom("default"),
    };
    let headers = ep
        .headers
        .iter()
        .filter(|(k, v)| !(k.eq_ignore_ascii_case("accept") && v == "application/json"))
        .filter(|(k, _)| !k.eq_ignore_ascii_case("user-agent"))
        .map(|(k, v)| {
            Term::Tuple(vec![
                Term::Str(k.as_bytes().to_vec()),
                Term::Str(v.as_bytes().to_vec()),
            ])
        })
        .collect();
    Term::Tuple(vec![
        Term::Atom("remote"),
        user,
        Term::Str(u.host_str().unwrap_or("").as_bytes().to_vec()),
        port,
        Term::Str(u.path().as_bytes().to_vec()),
        Term::List(headers),
        Term::Atom("undefined"),
    ])
}

/// Computes the v4 id. `server_uuid` is the replicator node's uuid; `filter_code` is the
/// source code of a user `ddoc/name` filter (fetched from the source, trimmed).
pub fn replication_id(
    server_uuid: &str,
    spec: &ReplicationSpec,
    filter_code: Option<&str>,
) -> RepId {
    let o = &spec.options;
    let mut parts = vec![
        Term::Bin(server_uuid.as_bytes().to_vec()),
        endpoint_term(&spec.source),
        endpoint_term(&spec.target),
    ];
    match &o.filter {
        Filter::None => {}
        Filter::DocIds(ids) => {
            parts.push(Term::List(
                ids.iter()
                    .map(|i| Term::Bin(i.as_bytes().to_vec()))
                    .collect(),
            ));
        }
        Filter::Selector(sel) => parts.push(ejson(&super::selector::normalize(sel), true)),
        Filter::Named { name, query_params } => {
            let head = if name.starts_with('_') {
                name.as_str()
            } else {
                filter_code.unwrap_or(name).trim()
            };
            parts.push(Term::Bin(head.as_bytes().to_vec()));
            parts.push(ejson(&Value::Object(query_params.clone()), false));
        }
    }
    if o.winning_revs_only {
        parts.push(Term::Bin(b"winning_revs_only".to_vec()));
    }
    // A given start sequence changes what is replicated (CouchDB main, digest D.4).
    if let Some(since) = &o.since_seq {
        parts.push(ejson(since, false));
    }
    let mut bytes = vec![131];
    encode(&Term::List(parts), &mut bytes);
    let base = hex::encode(Md5::digest(&bytes));
    let mut ext = String::new();
    if o.continuous {
        ext.push_str("+continuous");
    }
    if o.create_target {
        ext.push_str("+create_target");
    }
    RepId { base, ext }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(src: &str, tgt: &str) -> ReplicationSpec {
        ReplicationSpec::new(Endpoint::parse(src).unwrap(), Endpoint::parse(tgt).unwrap())
    }

    #[test]
    fn etf_bytes_of_known_terms() {
        let mut b = vec![131];
        encode(
            &Term::List(vec![
                Term::Bin(b"ab".to_vec()),
                Term::Str(b"x".to_vec()),
                Term::Atom("ok"),
            ]),
            &mut b,
        );
        // term_to_binary([<<"ab">>, "x", ok], [{minor_version, 1}])
        assert_eq!(
            b,
            [
                131, 108, 0, 0, 0, 3, 109, 0, 0, 0, 2, 97, 98, 107, 0, 1, 120, 100, 0, 2, 111, 107,
                106
            ]
        );
        let mut b = vec![];
        encode(&Term::Int(5984), &mut b);
        assert_eq!(b, [98, 0, 0, 23, 96]);
    }

    #[test]
    fn id_is_deterministic_and_ignores_passwords() {
        let a = replication_id(
            "u",
            &spec("http://bob:pw1@127.0.0.1:5984/a", "http://127.0.0.1:9/b"),
            None,
        );
        let b = replication_id(
            "u",
            &spec("http://bob:pw2@127.0.0.1/a", "http://127.0.0.1:9/b"),
            None,
        );
        let other_port = replication_id(
            "u",
            &spec("http://bob:pw1@127.0.0.1:81/a", "http://127.0.0.1:9/b"),
            None,
        );
        let c = replication_id(
            "u",
            &spec("http://eve:pw1@127.0.0.1:5984/a", "http://127.0.0.1:9/b"),
            None,
        );
        assert_eq!(a.base.len(), 32);
        assert_eq!(
            a, b,
            "password and default port (80 / 5984) do not change the id"
        );
        assert_ne!(a, other_port);
        assert_ne!(a, c, "user is part of the id");
        let d = replication_id(
            "v",
            &spec("http://bob:pw1@127.0.0.1:5984/a", "http://127.0.0.1:9/b"),
            None,
        );
        assert_ne!(a, d, "server uuid is part of the id");
    }

    #[test]
    fn options_that_change_the_result_change_the_id() {
        let base = spec("http://127.0.0.1:1/a", "http://127.0.0.1:2/b");
        let id0 = replication_id("u", &base, None);
        let mut s = base.clone();
        s.options.filter = Filter::DocIds(vec!["x".into()]);
        assert_ne!(replication_id("u", &s, None).base, id0.base);
        let mut s = base.clone();
        s.options.continuous = true;
        s.options.create_target = true;
        let id = replication_id("u", &s, None);
        assert_eq!(id.base, id0.base);
        assert_eq!(id.ext, "+continuous+create_target");
        let mut s = base.clone();
        s.options.winning_revs_only = true;
        assert_ne!(replication_id("u", &s, None).base, id0.base);
        let mut s1 = base.clone();
        s1.options.filter = Filter::Named {
            name: "d/f".into(),
            query_params: Default::default(),
        };
        let f1 = replication_id("u", &s1, Some("function(d){return true}"));
        let f2 = replication_id("u", &s1, Some(" function(d){return false} "));
        assert_ne!(f1, f2);
        let mut s = base.clone();
        s.options.since_seq = Some(serde_json::json!(42));
        let since42 = replication_id("u", &s, None).base;
        assert_ne!(since42, id0.base);
        s.options.since_seq = Some(serde_json::json!(43));
        assert_ne!(replication_id("u", &s, None).base, since42);
    }
}
