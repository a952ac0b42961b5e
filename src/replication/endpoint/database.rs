//! A replication endpoint: the database URL without credentials, the credentials kept apart,
//! and user headers. Parsed from the forms a `_replicator` document or `POST /_replicate`
//! body uses (a URL string, or `{"url", "headers", "auth": {"basic": {...}}}`). Its `Display`
//! never shows a password, so errors, logs and stats can print endpoints freely. Also the
//! crate's one decoder of a `Basic` `Authorization` header (`decode_basic`), which the HTTP
//! layer uses for its callers.

use std::fmt;

use base64::Engine as _;
use serde_json::Value;
use url::Url;

use crate::replication::error::{ReplicationError, Result};
use crate::replication::id::id_endpoint::IdEndpoint;

/// Credentials for an endpoint. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name (shown in ids and `_active_tasks` as `user`).
    pub username: String,
    /// Password, never displayed.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials({}:*****)", self.username)
    }
}

/// A CouchDB-compatible database reachable over HTTP. `Debug` masks the values of headers
/// that carry secrets (`Authorization` other than basic, `Cookie`, `Proxy-Authorization`).
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Database URL without userinfo, no trailing slash.
    url: Url,
    /// Credentials moved out of the URL / `Authorization` header / `auth.basic`.
    pub credentials: Option<Credentials>,
    /// User headers (sorted by name), excluding `Authorization: Basic`.
    pub headers: Vec<(String, String)>,
    /// The endpoint as CouchDB's replication ids see it (from the raw input).
    id: IdEndpoint,
    /// The form it was given in (credentials included), for the job's document.
    raw: Value,
}

/// Header names whose values are secrets.
fn is_secret_header(name: &str) -> bool {
    ["authorization", "cookie", "proxy-authorization"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(k, v)| {
                let shown = if is_secret_header(k) {
                    "*****"
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("Endpoint")
            .field("url", &self.url.as_str())
            .field("credentials", &self.credentials)
            .field("headers", &headers)
            .finish()
    }
}

impl Endpoint {
    /// Parses a URL string such as `http://user:pass@127.0.0.1:5984/db`.
    pub fn parse(url: &str) -> Result<Self> {
        Self::build(url, Vec::new(), None, Value::String(url.to_owned()))
    }

    /// The form the endpoint was given in (a URL string or an object), as a replication
    /// document holds it: it carries the credentials, so it is for the job's record (whose
    /// views mask them), never for logs.
    pub fn to_json(&self) -> Value {
        self.raw.clone()
    }

    /// Parses the JSON form (`"http://..."` or `{"url": ..., "headers": {...}, "auth": ...}`).
    pub fn from_json(v: &Value) -> Result<Self> {
        match v {
            Value::String(s) => Self::parse(s),
            Value::Object(m) => {
                let url = m.get("url").and_then(Value::as_str).ok_or_else(|| {
                    ReplicationError::InvalidEndpoint("endpoint object needs a `url` string".into())
                })?;
                let mut headers = Vec::new();
                match m.get("headers") {
                    None | Some(Value::Null) => {}
                    Some(Value::Object(h)) => {
                        for (k, v) in h {
                            let v = v.as_str().ok_or_else(|| {
                                ReplicationError::InvalidEndpoint(format!(
                                    "header `{k}` must be a string"
                                ))
                            })?;
                            headers.push((k.clone(), v.to_owned()));
                        }
                    }
                    Some(_) => {
                        return Err(ReplicationError::InvalidEndpoint(
                            "`headers` must be an object".into(),
                        ));
                    }
                }
                let basic = m.get("auth").and_then(|a| a.get("basic"));
                let creds = match basic {
                    None | Some(Value::Null) => None,
                    Some(b) => {
                        let user = b.get("username").and_then(Value::as_str);
                        let pass = b.get("password").and_then(Value::as_str);
                        match (user, pass) {
                            (Some(u), Some(p)) => Some(Credentials {
                                username: u.into(),
                                password: p.into(),
                            }),
                            _ => {
                                return Err(ReplicationError::InvalidEndpoint(
                                    "auth.basic needs string `username` and `password`".into(),
                                ));
                            }
                        }
                    }
                };
                Self::build(url, headers, creds, v.clone())
            }
            _ => Err(ReplicationError::InvalidEndpoint(
                "endpoint must be a URL string or an object".into(),
            )),
        }
    }

    fn build(
        url: &str,
        headers: Vec<(String, String)>,
        creds: Option<Credentials>,
        raw: Value,
    ) -> Result<Self> {
        let mut parsed = Url::parse(url).map_err(|e| {
            ReplicationError::InvalidEndpoint(format!(
                "`{}` is not a valid URL: {e}",
                redact_str(url)
            ))
        })?;
        match parsed.scheme() {
            "http" | "https" => {}
            s => {
                return Err(ReplicationError::InvalidEndpoint(format!(
                    "unsupported protocol `{s}` (local endpoints are not supported; use http or https)"
                )));
            }
        }
        if parsed.host_str().is_none() {
            return Err(ReplicationError::InvalidEndpoint("URL has no host".into()));
        }
        let id = IdEndpoint::new(url, &headers, creds.as_ref().map(|c| c.username.as_str()));
        let mut credentials = creds;
        if !parsed.username().is_empty() {
            let dec = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            let from_url = Credentials {
                username: dec(parsed.username()),
                password: dec(parsed.password().unwrap_or("")),
            };
            credentials.get_or_insert(from_url);
            // Cannot fail for http(s) URLs with a host.
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
        }
        let mut kept = Vec::new();
        for (k, v) in headers {
            if k.eq_ignore_ascii_case("authorization")
                && let Some(c) = decode_basic(&v)
            {
                credentials.get_or_insert(c);
                continue;
            }
            kept.push((k, v));
        }
        kept.sort();
        let path = parsed.path().trim_end_matches('/').to_owned();
        if path.is_empty() {
            return Err(ReplicationError::InvalidEndpoint(format!(
                "`{parsed}` names no database"
            )));
        }
        parsed.set_path(&path);
        parsed.set_query(None);
        parsed.set_fragment(None);
        Ok(Self {
            url: parsed,
            credentials,
            headers: kept,
            id,
            raw,
        })
    }

    /// The database URL (no credentials, no trailing slash).
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// The URL as CouchDB shows it in `_scheduler/*` and `_active_tasks`: credentials
    /// stripped (not masked) and a trailing slash.
    pub(crate) fn couch_url(&self) -> String {
        format!("{}/", self.url.as_str().trim_end_matches('/'))
    }

    /// The parsed database URL.
    pub(crate) fn parsed_url(&self) -> &Url {
        &self.url
    }

    /// The URL of a path under the database (`path` is already encoded); an empty path or
    /// a bare query (`?...`) addresses the database itself.
    pub fn join(&self, path: &str) -> String {
        if path.is_empty() || path.starts_with('?') {
            format!("{}{path}", self.url.as_str())
        } else {
            format!("{}/{path}", self.url.as_str())
        }
    }

    /// The server root (scheme://host:port/), for `_session`.
    pub(crate) fn server_root(&self) -> String {
        let mut u = self.url.clone();
        u.set_path("/");
        u.to_string()
    }

    /// The endpoint as CouchDB's replication ids see it.
    pub(crate) fn id_view(&self) -> &IdEndpoint {
        &self.id
    }

    /// The basic-auth user name, if any.
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.username.as_str())
    }
}

impl fmt::Display for Endpoint {
    /// The URL with the user name kept and the password masked, like CouchDB's `_active_tasks`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.credentials {
            None => f.write_str(self.url.as_str()),
            Some(c) => {
                let mut u = self.url.clone();
                let _ = u.set_username(&c.username);
                let _ = u.set_password(Some("*****"));
                f.write_str(u.as_str())
            }
        }
    }
}

/// Masks the password of a URL-like string that could not be parsed.
pub(crate) fn redact_str(s: &str) -> String {
    match (s.find("://"), s.rfind('@')) {
        (Some(i), Some(j)) if j > i => format!("{}://*****@{}", &s[..i], &s[j + 1..]),
        _ => s.to_owned(),
    }
}

/// The credentials of a `Basic` `Authorization` header value, the one decoder of the crate
/// (the HTTP API's callers and endpoint headers alike): the scheme name is matched in any
/// case (RFC 7235 §2.1, RFC 7617), the rest is base64 of `name:password`.
pub(crate) fn decode_basic(v: &str) -> Option<Credentials> {
    let (scheme, b64) = v.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    Some(Credentials {
        username: u.into(),
        password: p.into(),
    })
}

/// Percent-encodes a document id for use as a path segment (`_design/x` keeps its slash).
pub(crate) fn encode_doc_id(id: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const SEG: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    if let Some(rest) = id.strip_prefix("_design/") {
        format!("_design/{}", utf8_percent_encode(rest, SEG))
    } else if let Some(rest) = id.strip_prefix("_local/") {
        format!("_local/{}", utf8_percent_encode(rest, SEG))
    } else {
        utf8_percent_encode(id, SEG).to_string()
    }
}

/// Percent-encodes a query parameter value.
pub(crate) fn encode_query(v: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const Q: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    utf8_percent_encode(v, Q).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_moved_out_and_masked() {
        let e = Endpoint::parse("http://bob:s3cret@127.0.0.1:5984/db/").unwrap();
        assert_eq!(e.url(), "http://127.0.0.1:5984/db");
        assert_eq!(e.user(), Some("bob"));
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("bob"));
    }

    #[test]
    fn secret_headers_are_masked_in_debug() {
        let v = serde_json::json!({"url": "http://127.0.0.1/db", "headers": {
            "Authorization": "Bearer tok3n", "Cookie": "AuthSession=c00kie", "X-Trace": "t1"}});
        let shown = format!("{:?}", Endpoint::from_json(&v).unwrap());
        assert!(
            !shown.contains("tok3n") && !shown.contains("c00kie"),
            "{shown}"
        );
        assert!(shown.contains("t1"), "{shown}");
    }

    #[test]
    fn basic_header_becomes_credentials() {
        let v = serde_json::json!({"url": "http://127.0.0.1/db", "headers": {"Authorization": "Basic Ym9iOnB3", "X-A": "1"}});
        let e = Endpoint::from_json(&v).unwrap();
        assert_eq!(e.credentials.as_ref().unwrap().password, "pw");
        assert_eq!(e.headers, vec![("X-A".to_owned(), "1".to_owned())]);
    }

    #[test]
    fn basic_scheme_matches_in_any_case() {
        for h in [
            "Basic Ym9iOnB3",
            "basic Ym9iOnB3",
            "BASIC  Ym9iOnB3 ",
            " bAsIc Ym9iOnB3",
        ] {
            let c = decode_basic(h).unwrap_or_else(|| panic!("{h:?}"));
            assert_eq!((c.username.as_str(), c.password.as_str()), ("bob", "pw"));
        }
        assert!(decode_basic("Bearer Ym9iOnB3").is_none());
        assert!(decode_basic("Basic bm9jb2xvbg==").is_none());
    }

    #[test]
    fn bad_urls_are_typed_errors_without_secrets() {
        let err = Endpoint::parse("ftp://u:topsecret@x/db").unwrap_err();
        assert!(!err.to_string().contains("topsecret"));
        assert!(Endpoint::parse("not a url:pw@").is_err());
        assert!(Endpoint::parse("http://127.0.0.1:5984/").is_err());
        assert_eq!(redact_str("http://a:b@h/x"), "http://*****@h/x");
    }

    #[test]
    fn doc_ids_are_encoded() {
        assert_eq!(encode_doc_id("a b/c"), "a%20b%2Fc");
        assert_eq!(encode_doc_id("_design/x y"), "_design/x%20y");
    }
}
