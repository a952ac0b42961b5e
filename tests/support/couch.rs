//! Small CouchDB client helpers for tests: create/delete databases, write documents (normal
//! and `new_edits=false`), read every leaf revision of a database with its `_revisions` and
//! attachment stubs (digests), and compare two databases leaf by leaf.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// A client bound to one server root (`http://127.0.0.1:PORT/`).
#[derive(Clone)]
pub struct Couch {
    http: reqwest::Client,
    root: String,
}

/// Every leaf of a database: `(id, rev)` -> the revision's body (with `_revisions`, stubs).
pub type Leaves = BTreeMap<(String, String), Value>;

impl Couch {
    /// A client for the server at `root` (with or without trailing slash).
    pub fn new(root: &str) -> Self {
        Self {
            // A stuck server fails the test with the request named, rather than hanging it.
            http: super::http_client()
                .timeout(std::time::Duration::from_secs(30))
                .build()
                .expect("test http client"),
            root: root.trim_end_matches('/').to_owned(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{}", self.root, path)
    }

    async fn call(&self, req: reqwest::RequestBuilder, what: &str) -> (u16, Value) {
        let r = req
            .header("accept", "application/json")
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what}: request failed: {e}"));
        let status = r.status().as_u16();
        let body = r
            .bytes()
            .await
            .unwrap_or_else(|e| panic!("{what}: body: {e}"));
        let v = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        (status, v)
    }

    /// `PUT /db`, asserting it was created.
    pub async fn create_db(&self, db: &str) {
        let (s, v) = self.call(self.http.put(self.url(db)), "create db").await;
        assert!(s == 201 || s == 202, "PUT /{db} answered {s}: {v}");
    }

    /// `PUT /db`: the status (201, or 412 when it exists).
    pub async fn try_create_db(&self, db: &str) -> u16 {
        self.call(self.http.put(self.url(db)), "create db").await.0
    }

    /// `DELETE /db`: the status.
    pub async fn delete_db(&self, db: &str) -> u16 {
        self.call(self.http.delete(self.url(db)), "delete db")
            .await
            .0
    }

    /// `GET /db`: `(status, body)`.
    pub async fn db_info(&self, db: &str) -> (u16, Value) {
        self.call(self.http.get(self.url(db)), "db info").await
    }

    /// Writes documents with normal edits; returns the new revs in order.
    pub async fn bulk_insert(&self, db: &str, docs: &[Value]) -> Vec<String> {
        let mut revs = Vec::with_capacity(docs.len());
        for chunk in docs.chunks(1000) {
            let (s, v) = self
                .call(
                    self.http
                        .post(self.url(&format!("{db}/_bulk_docs")))
                        .json(&json!({ "docs": chunk })),
                    "bulk insert",
                )
                .await;
            assert!(s == 201 || s == 200, "_bulk_docs answered {s}: {v}");
            for r in v.as_array().expect("bulk_docs array") {
                let rev = r["rev"]
                    .as_str()
                    .unwrap_or_else(|| panic!("write failed: {r}"));
                revs.push(rev.to_owned());
            }
        }
        revs
    }

    /// Writes full revisions as a replicator does (`new_edits=false`).
    pub async fn bulk_no_edits(&self, db: &str, docs: &[Value]) {
        let (s, v) = self
            .call(
                self.http
                    .post(self.url(&format!("{db}/_bulk_docs")))
                    .json(&json!({ "docs": docs, "new_edits": false })),
                "bulk new_edits=false",
            )
            .await;
        assert!(
            s == 201 || s == 200,
            "_bulk_docs new_edits=false answered {s}: {v}"
        );
    }

    /// `PUT /db/id` with `body`; returns `(status, body)`.
    pub async fn put_doc(&self, db: &str, id: &str, body: &Value) -> (u16, Value) {
        self.call(
            self.http.put(self.url(&format!("{db}/{id}"))).json(body),
            "put doc",
        )
        .await
    }

    /// `GET /db/id?query`; returns `(status, body)`.
    pub async fn get_doc(&self, db: &str, id_and_query: &str) -> (u16, Value) {
        self.call(
            self.http.get(self.url(&format!("{db}/{id_and_query}"))),
            "get doc",
        )
        .await
    }

    /// Raw bytes of an attachment.
    pub async fn attachment(&self, db: &str, id: &str, name: &str) -> Vec<u8> {
        let r = self
            .http
            .get(self.url(&format!("{db}/{id}/{name}")))
            .send()
            .await
            .expect("attachment GET");
        assert_eq!(r.status().as_u16(), 200, "attachment {id}/{name}");
        r.bytes().await.expect("attachment body").to_vec()
    }

    /// `(id, leaf revs)` of every document from `_changes?style=all_docs`.
    pub async fn leaf_revs(&self, db: &str) -> BTreeMap<String, Vec<String>> {
        let (s, v) = self
            .call(
                self.http
                    .get(self.url(&format!("{db}/_changes?style=all_docs"))),
                "changes",
            )
            .await;
        assert_eq!(s, 200, "_changes of {db}: {v}");
        let mut out = BTreeMap::new();
        for r in v["results"].as_array().expect("results") {
            let id = r["id"].as_str().expect("id").to_owned();
            let mut revs: Vec<String> = r["changes"]
                .as_array()
                .expect("changes")
                .iter()
                .map(|c| c["rev"].as_str().expect("rev").to_owned())
                .collect();
            revs.sort();
            out.insert(id, revs);
        }
        out
    }

    /// Every leaf revision of `db` with its history and attachment stubs.
    pub async fn leaves(&self, db: &str) -> Leaves {
        let pairs: Vec<(String, String)> = self
            .leaf_revs(db)
            .await
            .into_iter()
            .flat_map(|(id, revs)| revs.into_iter().map(move |r| (id.clone(), r)))
            .collect();
        let mut out = Leaves::new();
        for chunk in pairs.chunks(500) {
            let docs: Vec<Value> = chunk
                .iter()
                .map(|(i, r)| json!({"id": i, "rev": r}))
                .collect();
            let (s, v) = self
                .call(
                    self.http
                        .post(self.url(&format!("{db}/_bulk_get?revs=true")))
                        .json(&json!({ "docs": docs })),
                    "bulk_get",
                )
                .await;
            assert_eq!(s, 200, "_bulk_get of {db}: {v}");
            for r in v["results"].as_array().expect("results") {
                for d in r["docs"].as_array().expect("docs") {
                    let ok = d.get("ok").unwrap_or_else(|| panic!("bulk_get error: {d}"));
                    let key = (
                        ok["_id"].as_str().expect("_id").to_owned(),
                        ok["_rev"].as_str().expect("_rev").to_owned(),
                    );
                    out.insert(key, normalise(ok.clone()));
                }
            }
        }
        out
    }

    /// Asserts `a` and `b` (on this or another server) hold the same leaves, body for body.
    pub async fn assert_same(&self, a: &str, other: &Couch, b: &str) -> usize {
        let (la, lb) = tokio::join!(self.leaves(a), other.leaves(b));
        assert_same_leaves(&la, &lb, a, b);
        la.len()
    }
}

/// Drops fields that legitimately differ between copies (`revpos` is recomputed by targets).
fn normalise(mut doc: Value) -> Value {
    if let Some(atts) = doc.get_mut("_attachments").and_then(Value::as_object_mut) {
        for a in atts.values_mut() {
            if let Some(o) = a.as_object_mut() {
                o.remove("revpos");
            }
        }
    }
    doc
}

/// Panics with the first differences when two leaf sets differ.
pub fn assert_same_leaves(la: &Leaves, lb: &Leaves, a: &str, b: &str) {
    let mut diffs = Vec::new();
    for (k, v) in la {
        match lb.get(k) {
            None => diffs.push(format!("{k:?} missing in {b}")),
            Some(w) if w != v => diffs.push(format!("{k:?} differs:\n  {a}: {v}\n  {b}: {w}")),
            _ => {}
        }
    }
    for k in lb.keys().filter(|k| !la.contains_key(*k)) {
        diffs.push(format!("{k:?} only in {b}"));
    }
    assert!(
        diffs.is_empty(),
        "{a} and {b} differ in {} leaves ({} vs {}); first: \n{}",
        diffs.len(),
        la.len(),
        lb.len(),
        diffs.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// `n` small documents `doc-00000`..: `{"_id", "n", "text"}`.
pub fn numbered_docs(prefix: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"_id": format!("{prefix}{i:05}"), "n": i, "text": format!("value {i}")}))
        .collect()
}
