//! Fuzzes the `_replicator` document parser: arbitrary bytes, parsed as JSON when they are,
//! must never panic; a refusal always carries a reason.
#![no_main]

use couch_replicator::replicator::replicator_db::request::{classify_change, parse_rep_doc};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Err(e) = parse_rep_doc(&v) {
            assert!(!e.0.trim().is_empty());
        }
        let _ = classify_change(&v);
    }
});
