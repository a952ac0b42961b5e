//! Fuzzes the `POST /_replicate` body parser: never a panic; a refusal always has a reason.
#![no_main]

use couch_replicator::replicator::replicator_db::request::parse_replicate_body;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data)
        && let Err(e) = parse_replicate_body(&v)
    {
        assert!(!e.0.trim().is_empty());
    }
});
