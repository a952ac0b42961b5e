//! Fuzzes the continuous `_changes` feed-line parser: never a panic; errors name the line.
#![no_main]

use couch_replicator::replication::changes::reader::parse_feed_line;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = parse_feed_line(data) {
        assert!(e.to_string().contains("_changes line"));
    }
});
