//! An endpoint as CouchDB 3.4 sees it when it computes a replication id: the URL string with the
//! user info removed and a `/` appended, the user name it picks for basic auth, and the headers
//! left once its default headers and a basic `Authorization` header are taken out, in the order
//! CouchDB keeps them. Computed from the raw input (not from our parsed URL, which normalises
//! host case, ports and escapes that CouchDB hashes as written). Holds no password.

use base64::Engine as _;

/// The headers every CouchDB 3.4.3 replication sends; they never enter an id.
const DEFAULT_HEADERS: [(&str, &str); 2] = [
    ("Accept", "application/json"),
    ("User-Agent", "CouchDB-Replicator/3.4.3"),
];

/// The parts of an endpoint that CouchDB's replication ids depend on.
#[derive(Clone, PartialEq, Eq)]
pub struct IdEndpoint {
    /// The URL without user info, with a trailing `/` unless it has a query.
    pub url: String,
    /// The basic-auth user: `auth.basic.username`, else the URL's user (when it has a
    /// password part), else the user of a basic `Authorization` header. Raw bytes.
    pub user: Option<Vec<u8>>,
    /// User headers other than CouchDB's defaults and a basic `Authorization`.
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for IdEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may be tokens: show only their names.
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("IdEndpoint")
            .field("url", &self.url)
            .field("user", &self.user.as_deref().map(String::from_utf8_lossy))
            .field("headers", &names)
            .finish()
    }
}

/// Host, port (`None` for the scheme's default, 5984 included) and path of the URL, as
/// CouchDB's version-4 id takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlInfo {
    /// Host as written (IPv6 without brackets).
    pub host: String,
    /// A port other than 80 / 5984 (http) or 443 (https).
    pub port: Option<u32>,
    /// Path as written, query included; at least `/`.
    pub path: String,
}

impl IdEndpoint {
    /// `raw_url` as the user wrote it, `headers` in the order given, `auth_user` the user name
    /// of a valid `auth.basic` object.
    pub fn new(raw_url: &str, headers: &[(String, String)], auth_user: Option<&str>) -> Self {
        let with_slash = if raw_url.contains('?') || raw_url.ends_with('/') {
            raw_url.to_owned()
        } else {
            format!("{raw_url}/")
        };
        let (url_user, url) = strip_userinfo(&with_slash);
        let (header_user, headers) = id_headers(headers);
        let user = auth_user
            .map(|u| u.as_bytes().to_vec())
            .or(url_user)
            .or(header_user);
        Self { url, user, headers }
    }

    /// Host, port and path, or `None` when the URL cannot be split (CouchDB then hashes the
    /// whole URL as the host).
    pub fn url_info(&self) -> Option<UrlInfo> {
        let (scheme, rest) = self.url.split_once("://")?;
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (h, after) = v6.split_once(']')?;
                (h, after.strip_prefix(':'))
            }
            None => match authority.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            },
        };
        let port: u32 = match port {
            Some(p) => p.parse().ok()?,
            None if scheme == "https" => 443,
            None => 80,
        };
        let port = match (scheme, port) {
            ("http", 80 | 5984) | ("https", 443) => None,
            (_, p) => Some(p),
        };
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        Some(UrlInfo {
            host: host.to_owned(),
            port,
            path,
        })
    }
}

/// Removes the user info of a URL; the user counts only with a password part (`user:`).
fn strip_userinfo(url: &str) -> (Option<Vec<u8>>, String) {
    let Some(i) = url.find("://") else {
        return (None, url.to_owned());
    };
    let start = i + 3;
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |e| start + e);
    let Some(at) = url[start..end].rfind('@').map(|a| start + a) else {
        return (None, url.to_owned());
    };
    let user = url[start..at]
        .split_once(':')
        .map(|(u, _)| u.as_bytes().to_vec());
    (user, format!("{}{}", &url[..start], &url[at + 1..]))
}

/// CouchDB's header list for the id: unique names sorted, merged with its defaults, a basic
/// `Authorization` removed (its user returned), the defaults removed again.
fn id_headers(given: &[(String, String)]) -> (Option<Vec<u8>>, Vec<(String, String)>) {
    let mut hs: Vec<(String, String)> = Vec::new();
    for (k, v) in given {
        if !hs.iter().any(|(n, _)| n == k) {
            hs.push((k.clone(), v.clone()));
        }
    }
    for (k, v) in DEFAULT_HEADERS {
        if !hs.iter().any(|(n, _)| n == k) {
            hs.push((k.to_owned(), v.to_owned()));
        }
    }
    hs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut user = None;
    if hs
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
    {
        // With an Authorization header present CouchDB rebuilds the list through its header
        // table: names compared without case, equal names joined, ordered by lower-case name.
        hs = header_table(hs);
        if let Some(i) = hs
            .iter()
            .position(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        {
            let value = &hs[i].1;
            let (scheme, rest) = value.split_at(value.find(' ').unwrap_or(value.len()));
            if scheme.eq_ignore_ascii_case("basic") && rest.starts_with(' ') {
                user = basic_user(&rest[1..]);
                hs.remove(i);
            }
        }
    }
    for d in DEFAULT_HEADERS {
        if let Some(i) = hs.iter().position(|(k, v)| k == d.0 && v == d.1) {
            hs.remove(i);
        }
    }
    (user, hs)
}

fn header_table(hs: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in hs {
        match out.iter_mut().find(|(n, _)| n.eq_ignore_ascii_case(&k)) {
            Some((_, old)) => {
                old.push_str(", ");
                old.push_str(&v);
            }
            None => out.push((k, v)),
        }
    }
    out.sort_by_key(|(k, _)| k.to_ascii_lowercase());
    out
}

/// The user of `base64(user:password)`, or `None` when it does not decode to that form.
fn basic_user(b64: &str) -> Option<Vec<u8>> {
    let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let colon = raw.iter().position(|b| *b == b':')?;
    Some(raw[..colon].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Known answers from CouchDB 3.4.3's own `normalize_basic_auth` and `ibrowse_lib:parse_url`.
    #[test]
    fn urls_are_cut_as_couchdb_cuts_them() {
        let e = IdEndpoint::new("http://a:b@H/x%2Fy/?q=1", &[], None);
        assert_eq!(e.url, "http://H/x%2Fy/?q=1");
        assert_eq!(e.user.as_deref(), Some(&b"a"[..]));
        let i = e.url_info().unwrap();
        assert_eq!(
            (i.host.as_str(), i.port, i.path.as_str()),
            ("H", None, "/x%2Fy/?q=1")
        );

        let e = IdEndpoint::new("http://a:b@[::1]:5984/x", &[], None);
        assert_eq!(e.url, "http://[::1]:5984/x/");
        let i = e.url_info().unwrap();
        assert_eq!((i.host.as_str(), i.port), ("::1", None));

        // No password part: no user, but the user info is still dropped.
        let e = IdEndpoint::new("http://a@h/x/", &[], None);
        assert_eq!((e.url.as_str(), e.user.is_none()), ("http://h/x/", true));
        let e = IdEndpoint::new("http://:p@h/x/", &[], None);
        assert_eq!(e.user.as_deref(), Some(&b""[..]));
        // The user is not unescaped.
        let e = IdEndpoint::new("http://a%40b:p%3Aq@h/x/", &[], None);
        assert_eq!(e.user.as_deref(), Some(&b"a%40b"[..]));

        let port = |u: &str| IdEndpoint::new(u, &[], None).url_info().unwrap().port;
        assert_eq!(port("http://h:080/a/"), None);
        assert_eq!(port("https://h:443/a"), None);
        assert_eq!(port("https://h:5984/a"), Some(5984));
        assert_eq!(port("http://h:1/a"), Some(1));
        assert_eq!(
            IdEndpoint::new("http://h?x=1", &[], None)
                .url_info()
                .unwrap()
                .path,
            "/?x=1"
        );
        assert!(
            IdEndpoint::new("http://h:abc/", &[], None)
                .url_info()
                .is_none()
        );
    }

    #[test]
    fn headers_are_kept_as_couchdb_keeps_them() {
        // Without Authorization: sorted by name, defaults dropped.
        let e = IdEndpoint::new(
            "http://h/x",
            &h(&[("X-b", "1"), ("Accept", "application/json"), ("a", "2")]),
            None,
        );
        assert_eq!(e.headers, h(&[("X-b", "1"), ("a", "2")]));
        // With a non-basic Authorization: ordered by lower-case name, kept.
        let e = IdEndpoint::new(
            "http://h/x",
            &h(&[("X-b", "1"), ("authorization", "Bearer x"), ("a", "2")]),
            None,
        );
        assert_eq!(
            e.headers,
            h(&[("a", "2"), ("authorization", "Bearer x"), ("X-b", "1")])
        );
        assert!(e.user.is_none());
        // A basic one is removed and gives the user; bad base64 is removed without a user.
        let e = IdEndpoint::new(
            "http://h/x",
            &h(&[("Z", "1"), ("Authorization", "basic Ym9iOnB3"), ("a", "2")]),
            None,
        );
        assert_eq!(e.headers, h(&[("a", "2"), ("Z", "1")]));
        assert_eq!(e.user.as_deref(), Some(&b"bob"[..]));
        let e = IdEndpoint::new("http://h/x", &h(&[("Authorization", "Basic bad")]), None);
        assert!(e.headers.is_empty() && e.user.is_none());
        // auth.basic wins over the URL, which wins over the header.
        let e = IdEndpoint::new(
            "http://u1:p@h/x",
            &h(&[("Authorization", "Basic dTI6cA==")]),
            Some("u3"),
        );
        assert_eq!(e.user.as_deref(), Some(&b"u3"[..]));
        let e = IdEndpoint::new(
            "http://u1:p@h/x",
            &h(&[("Authorization", "Basic dTI6cA==")]),
            None,
        );
        assert_eq!(e.user.as_deref(), Some(&b"u1"[..]));
    }

    #[test]
    fn debug_shows_no_header_values() {
        let e = IdEndpoint::new(
            "http://h/x",
            &h(&[("Authorization", "Bearer s3cret")]),
            None,
        );
        assert!(!format!("{e:?}").contains("s3cret"));
    }
}
