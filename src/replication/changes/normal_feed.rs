//! Incremental parser of a `feed=normal` `_changes` body (`{"results":[row,...],"last_seq":..}`)
//! so a one-shot replication reads the whole feed in one streamed request and hands rows on as
//! they arrive, whatever the server's line layout (CouchDB puts a row per line, pouchdb-server
//! sends one long line). Takes body chunks; gives decoded rows, then `last_seq` at the end.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::replication::error::{ReplicationError, Result};

#[derive(Debug, Default, PartialEq)]
enum State {
    /// Before the `[` of `"results"`.
    #[default]
    Head,
    /// Inside the results array.
    Rows,
    /// After its `]`: the rest of the object (`last_seq`, `pending`).
    Tail,
}

/// The parser state: unconsumed bytes and where in the object it is.
#[derive(Debug, Default)]
pub struct NormalFeed {
    buf: Vec<u8>,
    state: State,
}

fn bad(what: impl std::fmt::Display) -> ReplicationError {
    ReplicationError::BadResponse(format!("_changes: {what}"))
}

impl NormalFeed {
    /// Adds a chunk and returns the rows completed by it.
    pub fn push<T: DeserializeOwned>(&mut self, chunk: &[u8]) -> Result<Vec<T>> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        if self.state == State::Head {
            let Some(at) = find(&self.buf, b"\"results\"") else {
                return Ok(out);
            };
            let Some(open) = self.buf[at..].iter().position(|b| *b == b'[') else {
                return Ok(out);
            };
            self.buf.drain(..at + open + 1);
            self.state = State::Rows;
        }
        if self.state != State::Rows {
            return Ok(out);
        }
        let mut pos = 0;
        loop {
            while pos < self.buf.len()
                && (self.buf[pos].is_ascii_whitespace() || self.buf[pos] == b',')
            {
                pos += 1;
            }
            if pos >= self.buf.len() {
                break;
            }
            if self.buf[pos] == b']' {
                pos += 1;
                self.state = State::Tail;
                break;
            }
            let mut it = serde_json::Deserializer::from_slice(&self.buf[pos..]).into_iter::<T>();
            match it.next() {
                Some(Ok(row)) => {
                    pos += it.byte_offset();
                    out.push(row);
                }
                Some(Err(e)) if e.is_eof() => break, // the row continues in the next chunk
                Some(Err(e)) => return Err(bad(e)),
                None => break,
            }
        }
        self.buf.drain(..pos);
        Ok(out)
    }

    /// The body ended: returns its `last_seq`.
    pub fn finish(self) -> Result<Value> {
        let text = match self.state {
            State::Tail => {
                let rest = String::from_utf8_lossy(&self.buf);
                let rest = rest.trim_start().trim_start_matches(',');
                format!("{{{rest}")
            }
            State::Head => String::from_utf8_lossy(&self.buf).into_owned(),
            State::Rows => return Err(bad("the body ended inside the results")),
        };
        let v: Value = serde_json::from_str(&text).map_err(bad)?;
        v.get("last_seq").cloned().ok_or_else(|| bad("no last_seq"))
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(body: &str, piece: usize) -> (Vec<Value>, Value) {
        let mut f = NormalFeed::default();
        let mut rows = Vec::new();
        for c in body.as_bytes().chunks(piece) {
            rows.extend(f.push::<Value>(c).unwrap());
        }
        (rows, f.finish().unwrap())
    }

    #[test]
    fn rows_arrive_whatever_the_chunking() {
        let body = r#"{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-x"}]},
{"seq":2,"id":"b]","changes":[{"rev":"1-y"}]}
],
"last_seq":2,"pending":0}"#;
        for piece in [1, 3, 7, 1000] {
            let (rows, last) = parse_in_pieces(body, piece);
            assert_eq!(rows.len(), 2, "piece {piece}");
            assert_eq!(rows[1]["id"], "b]");
            assert_eq!(last, serde_json::json!(2));
        }
        let (rows, last) = parse_in_pieces(r#"{"results":[],"last_seq":"5-g"}"#, 4);
        assert!(rows.is_empty());
        assert_eq!(last, serde_json::json!("5-g"));
    }

    #[test]
    fn a_cut_body_is_an_error() {
        let mut f = NormalFeed::default();
        let _ = f
            .push::<Value>(br#"{"results":[{"seq":1,"id":"a"},{"se"#)
            .unwrap();
        assert!(f.finish().is_err());
        let mut f = NormalFeed::default();
        assert!(f.push::<Value>(br#"{"results":[nonsense]}"#).is_err());
    }
}
