//! Replication ids are CouchDB 3.4.3's, byte for byte: every case of the recorded fixture
//! (`tests/fixtures/couchdb-replication-ids.json`: request bodies and the ids a real CouchDB
//! answered, with its server uuid and the filter code of its source design document) gives
//! the same id without network, plus cases generated against a real CouchDB 3.4.3.

use couch_replicator::replication::ReplicationSpec;
use couch_replicator::replication::rep_id::replication_id;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture file")).expect("JSON")
}

/// The code of a `ddoc/name` filter from the fixture's design documents.
fn filter_code(fx: &Value, body: &Value) -> Option<String> {
    let (ddoc, name) = body.get("filter")?.as_str()?.split_once('/')?;
    fx["source_design_docs"]
        .as_object()?
        .iter()
        .find(|(url, _)| url.ends_with(&format!("/_design/{ddoc}")))
        .and_then(|(_, d)| d["filters"][name].as_str())
        .map(str::to_owned)
}

/// Checks every case of a fixture file; returns how many were checked.
fn check_all(file: &str) -> usize {
    let fx = fixture(file);
    let uuid = fx["server_uuid"].as_str().expect("server_uuid");
    let cases = fx["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let mut body = case["body"].clone();
        // The fixture's ids were recorded with `continuous: true`.
        body["continuous"] = Value::Bool(true);
        let spec = ReplicationSpec::from_json(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
        let code = filter_code(&fx, &body);
        let got = replication_id(uuid, &spec, code.as_deref()).full();
        if got != case["replication_id"] {
            failures.push(format!(
                "{name}: got {got}, CouchDB {}",
                case["replication_id"]
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    cases.len()
}

#[test]
fn every_recorded_couchdb_id_is_reproduced() {
    assert_eq!(check_all("couchdb-replication-ids.json"), 19);
}
