//! Bad input (issue 7, item 4): property tests that the `_changes` feed-line parser, the
//! couch_jobs key and value decoders, and the `_replicator` doc / `POST /_replicate` body
//! parsers never panic on arbitrary input and reject it with a non-empty reason, and that
//! valid input round-trips.

use couch_replicator::jobs::Keys;
use couch_replicator::jobs::job_data::{JobRow, decode_activity, decode_data};
use couch_replicator::replication::changes::reader::parse_feed_line;
use couch_replicator::replicator::replicator_db::request::{
    DocAction, classify_change, parse_rep_doc, parse_replicate_body,
};
use proptest::prelude::*;
use serde_json::{Value, json};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![
            Just("http://127.0.0.1:9/db".to_owned()),
            Just("http://u:p@127.0.0.1:9/x".to_owned()),
            Just("_local/x".to_owned()),
            ".{0,12}",
        ]
        .prop_map(Value::String),
    ];
    let keys = prop_oneof![
        Just("source".to_owned()),
        Just("target".to_owned()),
        Just("url".to_owned()),
        Just("headers".to_owned()),
        Just("continuous".to_owned()),
        Just("cancel".to_owned()),
        Just("doc_ids".to_owned()),
        Just("filter".to_owned()),
        Just("selector".to_owned()),
        Just("since_seq".to_owned()),
        Just("_id".to_owned()),
        Just("_replication_state".to_owned()),
        Just("worker_processes".to_owned()),
        Just("query_params".to_owned()),
        Just("user_ctx".to_owned()),
        Just("roles".to_owned()),
        Just("_deleted".to_owned()),
        Just("socket_options".to_owned()),
        Just("auth".to_owned()),
        "[a-z_]{1,8}",
    ];
    leaf.prop_recursive(4, 48, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(keys.clone(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bytes that look like feed lines: JSON fragments, truncations, garbage.
fn arb_line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        arb_json().prop_map(|v| v.to_string().into_bytes()),
        (arb_json(), any::<prop::sample::Index>()).prop_map(|(v, i)| {
            let s = v.to_string().into_bytes();
            let cut = i.index(s.len() + 1);
            s[..cut].to_vec()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn changes_lines_never_panic_and_errors_say_why(line in arb_line()) {
        match parse_feed_line(&line) {
            Ok(_) => {}
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("_changes line"), "unclear error: {msg}");
            }
        }
    }

    #[test]
    fn valid_change_rows_parse(id in "[a-z0-9]{1,10}", seq in 0u64..1_000_000, n in 1usize..4) {
        let revs: Vec<Value> = (0..n).map(|i| json!({"rev": format!("{}-abc", i + 1)})).collect();
        let line = format!("{}\n", json!({"seq": seq, "id": id, "changes": revs}));
        prop_assert!(matches!(parse_feed_line(line.as_bytes()), Ok(Some(_))));
        prop_assert!(matches!(parse_feed_line(b"  \r\n"), Ok(None)));
        // A row cut anywhere short of its closing brace is refused.
        let body = line.trim_end();
        for cut in 1..body.len() {
            prop_assert!(parse_feed_line(&body.as_bytes()[..cut]).is_err(), "{}", &body[..cut]);
        }
    }

    #[test]
    fn job_key_decoders_never_panic(prefix in prop::collection::vec(any::<u8>(), 0..6),
                                   raw in prop::collection::vec(any::<u8>(), 0..80),
                                   keep in 0usize..80) {
        let keys = Keys::new(&prefix);
        // Arbitrary bytes, and arbitrary bytes behind a correct prefix.
        let mut prefixed = keys.jobs_prefix().to_vec();
        prefixed.extend_from_slice(&raw[..keep.min(raw.len())]);
        for k in [&raw, &prefixed] {
            for r in [
                keys.decode_data_key(k).map(|_| ()),
                keys.decode_pending_key(k).map(|_| ()),
                keys.decode_activity_timeout_key(k).map(|_| ()),
                keys.decode_activity_key(k).map(|_| ()),
                keys.decode_watches_activity(k).map(|_| ()),
                Keys::decode_timeout(k).map(|_| ()),
                JobRow::decode(k).map(|_| ()),
                decode_data(k).map(|_| ()),
                decode_activity(k).map(|_| ()),
            ] {
                if let Err(e) = r {
                    prop_assert!(!e.to_string().trim().is_empty());
                }
            }
        }
    }

    #[test]
    fn job_keys_round_trip_and_reject_other_kinds(ty in "[a-z_]{1,10}", id in "\\PC{0,20}",
                                                  stime in any::<i64>(),
                                                  prefix in prop::collection::vec(any::<u8>(), 0..6)) {
        let keys = Keys::new(&prefix);
        prop_assert_eq!(keys.decode_data_key(&keys.data(&ty, &id)).unwrap(), id.clone());
        prop_assert_eq!(
            keys.decode_pending_key(&keys.pending(&ty, stime, &id)).unwrap(),
            (stime, id.clone())
        );
        prop_assert!(keys.decode_pending_key(&keys.data(&ty, &id)).is_err());
        prop_assert!(keys.decode_data_key(&keys.pending(&ty, stime, &id)).is_err());
        prop_assert_eq!(Keys::decode_timeout(&Keys::encode_timeout(stime)).unwrap(), stime);
        // Every strict prefix of a valid key is refused, never half-decoded.
        let full = keys.data(&ty, &id);
        for cut in 0..full.len() {
            prop_assert!(keys.decode_data_key(&full[..cut]).is_err());
        }
    }

    #[test]
    fn rep_doc_and_replicate_body_rejections_have_reasons(v in arb_json()) {
        if let Err(e) = parse_rep_doc(&v) {
            prop_assert!(!e.0.trim().is_empty(), "empty reason for {v}");
        }
        if let Err(e) = parse_replicate_body(&v) {
            prop_assert!(!e.0.trim().is_empty(), "empty reason for {v}");
        }
        // What the doc processor does with a `_replicator` change (never panics either).
        if let DocAction::Fail { reason, .. } = classify_change(&v) {
            prop_assert!(!reason.0.trim().is_empty(), "empty reason for {v}");
        }
    }
}

#[test]
fn rep_doc_rejections_name_the_problem() {
    let cases = [
        (
            json!({"_id": "x", "target": "http://127.0.0.1:9/t"}),
            "source",
        ),
        (
            json!({"_id": "x", "source": "http://127.0.0.1:9/s"}),
            "target",
        ),
        (json!([1, 2]), ""),
    ];
    for (doc, word) in cases {
        let e = parse_rep_doc(&doc).expect_err("must be refused");
        assert!(
            e.0.to_lowercase().contains(word),
            "{doc}: reason `{}` does not mention `{word}`",
            e.0
        );
    }
    let e = parse_replicate_body(&json!({"source": 1, "target": "x"})).expect_err("refused");
    assert!(!e.0.is_empty());
}
