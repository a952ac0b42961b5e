//! Last line of defence for credentials in replies: every JSON value the API returns is
//! walked, passwords in URL strings are replaced by `*****`, and the values of credential
//! fields and headers (`password`, `Authorization`, `Cookie`) are masked. The replicator
//! already stores masked URLs; this catches anything a future field might carry.

use serde_json::Value;

use crate::replication::endpoint::database::redact_str;

const SECRET_KEYS: [&str; 4] = ["password", "authorization", "cookie", "proxy-authorization"];

/// Masks secrets in place.
pub fn mask(v: &mut Value) {
    match v {
        Value::String(s) => {
            if let Some(masked) = mask_url(s) {
                *s = masked;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(mask),
        Value::Object(m) => {
            for (k, val) in m.iter_mut() {
                if SECRET_KEYS.iter().any(|s| k.eq_ignore_ascii_case(s)) && !val.is_null() {
                    *val = Value::String("*****".into());
                } else {
                    mask(val);
                }
            }
        }
        _ => {}
    }
}

/// `scheme://user:pass@host...` → `scheme://user:*****@host...`; `None` when nothing to mask.
fn mask_url(s: &str) -> Option<String> {
    let start = s.find("://")? + 3;
    let at = start + s[start..].find('@')?;
    let userinfo = &s[start..at];
    // A slash before the `@` means the `@` is in the path, not userinfo.
    if userinfo.contains('/') {
        return None;
    }
    match userinfo.split_once(':') {
        Some((_, "*****")) | None => None,
        Some((user, _)) if !user.is_empty() => {
            Some(format!("{}{user}:*****{}", &s[..start], &s[at..]))
        }
        Some(_) => Some(redact_str(s)),
    }
}

/// Masks and returns.
pub fn masked(mut v: Value) -> Value {
    mask(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn urls_headers_and_fields_are_masked() {
        let v = masked(json!({
            "source": "http://bob:hunter2@127.0.0.1:5984/db",
            "target": {"url": "https://:pw@h/x", "headers": {"Authorization": "Basic abc", "X-Ok": "1"}},
            "auth": {"basic": {"username": "bob", "password": "pw"}},
            "list": ["http://u:p@h/db", "http://h/a@b", "plain"],
            "already": "http://bob:*****@h/db",
        }));
        let s = v.to_string();
        for secret in ["hunter2", "\"pw\"", ":pw@", "Basic abc", "u:p@"] {
            assert!(!s.contains(secret), "{secret} in {s}");
        }
        assert_eq!(v["source"], "http://bob:*****@127.0.0.1:5984/db");
        assert_eq!(v["target"]["headers"]["X-Ok"], "1");
        assert_eq!(v["list"][1], "http://h/a@b");
        assert_eq!(v["already"], "http://bob:*****@h/db");
        assert_eq!(v["auth"]["basic"]["username"], "bob");
    }
}
