//! The validate design document our node installs in every `_replicator` database it follows,
//! so that invalid replication documents are refused at write time with `403 forbidden`, as
//! CouchDB 3.3+ refuses them (CouchDB checks in its own `before_doc_update`; a remote
//! database can only be given a `validate_doc_update` function). Documents that were already
//! present when it was installed are still parsed by the doc processor and marked `failed`.
//!
//! The function checks the structure CouchDB checks (endpoints, option types, the state
//! field, `cancel`), and that only the document's `owner` or an admin edits it; the full
//! rules (URL parsing, filter combinations) stay in `replicator_db/request.rs`.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::replication::ReplicationError;
use crate::replication::http::client::{HttpClient, Req};

/// The id of the design document.
pub const DDOC_ID: &str = "_design/_replicator";

/// The validation function (JavaScript, run by the database server).
pub const VALIDATE_DOC_UPDATE: &str = r#"function (newDoc, oldDoc, userCtx) {
  function reject(reason) { throw({forbidden: reason}); }
  var isAdmin = (userCtx.roles || []).indexOf('_admin') !== -1;
  if (oldDoc && oldDoc.owner && !isAdmin && oldDoc.owner !== userCtx.name) {
    reject('only the owner of a replication document or an admin may change it');
  }
  if (newDoc._deleted === true || newDoc._id.indexOf('_design/') === 0) { return; }
  // The replicator writing a final state into a document that is already there (an invalid
  // document gets `failed` with the reason).
  var fin = newDoc._replication_state;
  if (oldDoc && (fin === 'failed' || fin === 'completed')) { return; }
  if (newDoc.owner !== undefined && newDoc.owner !== null && typeof newDoc.owner !== 'string') {
    reject('`owner` must be a string');
  }
  function endpoint(k) {
    var v = newDoc[k];
    if (typeof v === 'string' && v.length > 0) { return; }
    if (v && typeof v === 'object' && !Array.isArray(v) && typeof v.url === 'string') { return; }
    reject('`' + k + '` must be a URL string or an object with a `url`');
  }
  endpoint('source');
  endpoint('target');
  var states = ['triggered', 'error', 'completed', 'failed'];
  var st = newDoc._replication_state;
  if (st !== undefined && st !== null && states.indexOf(st) === -1) {
    reject('`_replication_state` must be one of triggered, error, completed, failed');
  }
  if (newDoc.cancel === true) {
    reject('`cancel` is not allowed in a _replicator document: delete the document to stop the replication');
  }
  ['continuous', 'create_target', 'use_checkpoints', 'winning_revs_only', 'use_bulk_get']
    .forEach(function (k) {
      if (newDoc[k] !== undefined && newDoc[k] !== null && typeof newDoc[k] !== 'boolean') {
        reject('`' + k + '` must be a boolean');
      }
    });
  ['worker_processes', 'worker_batch_size', 'http_connections', 'connection_timeout',
   'retries_per_request', 'checkpoint_interval'].forEach(function (k) {
    var v = newDoc[k];
    if (v === undefined || v === null) { return; }
    if (typeof v === 'string' && /^[0-9]+$/.test(v)) { v = parseInt(v, 10); }
    if (typeof v !== 'number' || v % 1 !== 0 || v < 1) {
      reject('`' + k + '` must be a positive integer');
    }
  });
  if (newDoc.doc_ids !== undefined && newDoc.doc_ids !== null) {
    if (!Array.isArray(newDoc.doc_ids) ||
        newDoc.doc_ids.some(function (d) { return typeof d !== 'string'; })) {
      reject('`doc_ids` must be an array of strings');
    }
  }
  ['selector', 'query_params', 'user_ctx'].forEach(function (k) {
    var v = newDoc[k];
    if (v !== undefined && v !== null && (typeof v !== 'object' || Array.isArray(v))) {
      reject('`' + k + '` must be a JSON object');
    }
  });
  if (newDoc.filter !== undefined && newDoc.filter !== null && typeof newDoc.filter !== 'string') {
    reject('`filter` must be a string');
  }
}"#;

/// Installs (or updates) the design document in the database `client` points at. `Ok(false)`
/// when the server refused it (no admin rights): the doc processor still fails bad documents.
pub async fn install(client: &HttpClient) -> Result<bool, ReplicationError> {
    let r = client.send(&Req::get(DDOC_ID.to_owned())).await?;
    let mut ddoc = json!({"_id": DDOC_ID, "language": "javascript"});
    if r.status == StatusCode::OK {
        let old: Value = r.json("design document")?;
        if old.get("validate_doc_update").and_then(Value::as_str) == Some(VALIDATE_DOC_UPDATE) {
            return Ok(true);
        }
        if let Some(rev) = old.get("_rev") {
            ddoc["_rev"] = rev.clone();
        }
    }
    ddoc["validate_doc_update"] = json!(VALIDATE_DOC_UPDATE);
    let body = serde_json::to_vec(&ddoc)
        .map_err(|e| ReplicationError::BadResponse(format!("cannot encode design doc: {e}")))?;
    let w = client
        .send(&Req::json(Method::PUT, DDOC_ID.to_owned(), body))
        .await?;
    Ok(w.status.is_success())
}
