//! Fuzzes the couch_jobs key and value decoders on arbitrary bytes, raw and behind a valid
//! jobs prefix: never a panic; every refusal has a message.
#![no_main]

use couch_replicator::jobs::Keys;
use couch_replicator::jobs::job_data::{JobRow, decode_activity, decode_data};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let keys = Keys::new(b"fz");
    let mut prefixed = keys.jobs_prefix().to_vec();
    prefixed.extend_from_slice(data);
    for k in [data, prefixed.as_slice()] {
        let errs = [
            keys.decode_data_key(k).err(),
            keys.decode_pending_key(k).err(),
            keys.decode_activity_timeout_key(k).err(),
            keys.decode_activity_key(k).err(),
            keys.decode_watches_activity(k).err(),
            Keys::decode_timeout(k).err(),
            JobRow::decode(k).err(),
            decode_data(k).err(),
            decode_activity(k).err(),
        ];
        for e in errs.into_iter().flatten() {
            assert!(!e.to_string().trim().is_empty());
        }
    }
});
