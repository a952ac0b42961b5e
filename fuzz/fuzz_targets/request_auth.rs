//! Fuzzes the API's reading of credentials: an `Authorization` header of any bytes checked
//! against configured users. Never a panic; a refusal is always CouchDB's 401 with a reason.
#![no_main]

use std::sync::OnceLock;

use couch_replicator::http::auth::{AuthSettings, Users};
use libfuzzer_sys::fuzz_target;

fn users() -> &'static Users {
    static USERS: OnceLock<Users> = OnceLock::new();
    USERS.get_or_init(|| {
        let settings = AuthSettings {
            iterations: 1,
            ..AuthSettings::default()
        };
        Users::configure(
            [("adm".to_owned(), "adm-secret".to_owned())],
            [("bob".to_owned(), "bob-secret".to_owned())],
            &settings,
        )
        .unwrap_or_default()
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = std::str::from_utf8(data)
        && let Err(e) = users().authenticate(Some(header))
    {
        assert_eq!(e.status.as_u16(), 401);
        assert!(!e.reason.trim().is_empty());
    }
});
