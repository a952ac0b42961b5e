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

/// Where the scan of the row being received stands: each byte is looked at once, so a long
/// row costs time linear in its length however it is chunked.
#[derive(Debug, Default)]
struct Scan {
    /// Bytes of `buf` already scanned.
    at: usize,
    /// Where the row being scanned starts (after the blanks and commas before it).
    row_start: usize,
    /// Brackets and braces open.
    depth: u32,
    in_string: bool,
    escaped: bool,
}

/// The parser state: unconsumed bytes and where in the object it is.
#[derive(Debug)]
pub struct NormalFeed {
    buf: Vec<u8>,
    state: State,
    scan: Scan,
    /// The most bytes one row (or the head, or the tail) may take.
    max_row: usize,
}

impl Default for NormalFeed {
    fn default() -> Self {
        Self::new(crate::replication::http::limits::DEFAULT_MAX_FEED_LINE_BYTES)
    }
}

fn bad(what: impl std::fmt::Display) -> ReplicationError {
    ReplicationError::BadResponse(format!("_changes: {what}"))
}

const RESULTS: &[u8] = b"\"results\"";

impl NormalFeed {
    /// A parser that refuses rows longer than `max_row` bytes.
    pub fn new(max_row: usize) -> Self {
        Self {
            buf: Vec::new(),
            state: State::Head,
            scan: Scan::default(),
            max_row,
        }
    }

    /// Adds a chunk and returns the rows completed by it.
    pub fn push<T: DeserializeOwned>(&mut self, chunk: &[u8]) -> Result<Vec<T>> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        if self.state == State::Head {
            // Only the bytes not searched yet, plus a needle's length of overlap.
            let from = self.scan.at.saturating_sub(RESULTS.len());
            let Some(at) = find(&self.buf[from..], RESULTS).map(|i| from + i) else {
                self.scan.at = self.buf.len();
                return self.bounded(out);
            };
            let Some(open) = self.buf[at..].iter().position(|b| *b == b'[') else {
                return self.bounded(out);
            };
            self.buf.drain(..at + open + 1);
            self.state = State::Rows;
            self.scan = Scan::default();
        }
        while self.state == State::Rows {
            let Some((start, end)) = self.row_end()? else {
                break;
            };
            let row = &self.buf[start..end];
            if row == b"]" {
                self.state = State::Tail;
            } else {
                out.push(serde_json::from_slice(row).map_err(bad)?);
            }
            self.buf.drain(..end);
            self.scan = Scan::default();
        }
        self.bounded(out)
    }

    /// The bytes held for the row being received.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// `out`, unless the bytes held for one unfinished row passed the cap.
    fn bounded<T>(&self, out: Vec<T>) -> Result<Vec<T>> {
        if self.buf.len() > self.max_row {
            return Err(ReplicationError::EndpointResponseTooLarge(format!(
                "_changes: a row longer than {} bytes; the cap is [replicator] max_feed_line_bytes",
                self.max_row
            )));
        }
        Ok(out)
    }

    /// The next row in `buf` as a range (its value, or a closing `]`), skipping the blanks and
    /// commas before it; `None` while it is incomplete. Blanks scanned without a row are
    /// dropped, so `buf` then holds only the start of an unfinished row.
    fn row_end(&mut self) -> Result<Option<(usize, usize)>> {
        let s = &mut self.scan;
        while s.at < self.buf.len() {
            let b = self.buf[s.at];
            s.at += 1;
            if s.in_string {
                match b {
                    _ if s.escaped => s.escaped = false,
                    b'\\' => s.escaped = true,
                    b'"' => s.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' if s.depth > 0 => s.in_string = true,
                b'{' | b'[' => s.depth += 1,
                b'}' | b']' if s.depth > 0 => {
                    s.depth -= 1;
                    if s.depth == 0 {
                        return Ok(Some((s.row_start, s.at)));
                    }
                }
                // The end of the results array.
                b']' => return Ok(Some((s.row_start, s.at))),
                // Separators between rows.
                b',' if s.depth == 0 => s.row_start = s.at,
                b if s.depth == 0 && b.is_ascii_whitespace() => s.row_start = s.at,
                _ if s.depth == 0 => return Err(bad("a row that is not an object")),
                _ => {}
            }
        }
        if s.depth == 0 {
            self.buf.drain(..s.at);
            *s = Scan::default();
        }
        Ok(None)
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

    #[test]
    fn a_row_past_the_cap_is_refused_while_it_arrives() {
        let mut f = NormalFeed::new(1000);
        let _ = f.push::<Value>(br#"{"results":[{"seq":1,"id":""#).unwrap();
        let mut refused = None;
        for i in 0..100 {
            if let Err(e) = f.push::<Value>(&[b'a'; 100]) {
                refused = Some((i, e));
                break;
            }
        }
        let (at, e) = refused.expect("the row was never refused");
        assert!(at < 11, "refused after {at} pushes");
        assert!(
            matches!(e, ReplicationError::EndpointResponseTooLarge(_)),
            "{e}"
        );
        // Nor can a head without "results" grow past it.
        let mut f = NormalFeed::new(1000);
        assert!((0..20).any(|_| f.push::<Value>(&[b' '; 100]).is_err()));
    }

    #[test]
    fn brackets_and_quotes_inside_strings_do_not_end_a_row() {
        let body = r#"{"results":[{"seq":"1-]}","id":"a\"}{[","changes":[{"rev":"1-x"}]}],"last_seq":"1-]}"}"#;
        for piece in [1, 2, 5, 100] {
            let (rows, last) = parse_in_pieces(body, piece);
            assert_eq!(rows.len(), 1, "piece {piece}");
            assert_eq!(rows[0]["id"], "a\"}{[");
            assert_eq!(last, serde_json::json!("1-]}"));
        }
    }
}
