//! The DATA row value `(Seq, JLock, STime, Resubmit, JobDataJSON)` and the ACTIVITY value
//! `(JobId, JobDataJSON)` (CouchDB's couch_jobs.hrl and couch_jobs_fdb.erl): encoding, decoding, and the derived job state.
//!
//! Decoding never panics: foreign or corrupt bytes give [`JobsError::Encoding`].

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::store::tuple::{self, Bytes, Element, Versionstamp};

use super::error::{JobsError, JobsResult};

/// Job data: a JSON object.
pub type JobData = Map<String, Value>;

/// The state couch_jobs derives from a DATA row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting in the pending queue for a worker to accept it.
    Pending,
    /// Accepted: a worker holds its lock.
    Running,
    /// Its worker called `finish` (and it was not resubmitted meanwhile).
    Finished,
}

/// The `Seq` field: `0` pending, `null` finished, a versionstamp while running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seq {
    /// Stored as `0`: the job is queued.
    Pending,
    /// Stored as `null`: the job is done.
    Finished,
    /// A complete versionstamp, or an incomplete one when about to be written.
    Running(Versionstamp),
}

/// One decoded DATA row.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    /// Pending, finished, or the running job's activity versionstamp.
    pub seq: Seq,
    /// 32 lowercase hex characters while running.
    pub jlock: Option<String>,
    /// Scheduled time, UNIX seconds.
    pub stime: i64,
    /// Set when the job was resubmitted while running; `finish` then re-enqueues it.
    pub resubmit: bool,
    /// The job's data.
    pub data: JobData,
}

impl JobRow {
    /// `JLock ≠ null` → running; else `Seq = null` → finished; else pending.
    pub fn state(&self) -> JobState {
        match (&self.jlock, &self.seq) {
            (Some(_), _) => JobState::Running,
            (None, Seq::Finished) => JobState::Finished,
            (None, _) => JobState::Pending,
        }
    }

    /// The versionstamp of the running job's ACTIVITY key.
    pub fn running_vs(&self) -> Option<&Versionstamp> {
        match &self.seq {
            Seq::Running(vs) => Some(vs),
            _ => None,
        }
    }

    /// Encodes the row. When `Seq` holds an incomplete versionstamp the result is a
    /// versionstamped-value operand (for `set_versionstamped_value`), flagged by `true`.
    pub fn encode(&self) -> (Vec<u8>, bool) {
        let json = encode_data(&self.data);
        let seq = match &self.seq {
            Seq::Pending => Element::Int(0),
            Seq::Finished => Element::Nil,
            Seq::Running(vs) => Element::Versionstamp(vs.clone()),
        };
        let jlock = self
            .jlock
            .as_deref()
            .map(|l| Bytes(Cow::Borrowed(l.as_bytes())));
        let value = (
            seq,
            jlock,
            self.stime,
            self.resubmit,
            Bytes(Cow::Owned(json)),
        );
        match &self.seq {
            Seq::Running(vs) if !vs.is_complete() => (tuple::pack_with_versionstamp(&value), true),
            _ => (tuple::pack(&value), false),
        }
    }

    /// Decodes a DATA row value; [`JobsError::Encoding`] for anything not written by
    /// [`JobRow::encode`].
    pub fn decode(bytes: &[u8]) -> JobsResult<Self> {
        let (mut row, data) = Self::decode_with(bytes, decode_data)?;
        row.data = data;
        Ok(row)
    }

    /// Decodes a DATA row, its data with `data` (given the stored JSON bytes) instead of into
    /// a [`JobData`] map: a reader that needs a few fields of many rows (a census) decodes
    /// only those. The returned row's own `data` is then empty.
    pub fn decode_with<D>(
        bytes: &[u8],
        data: impl FnOnce(&[u8]) -> JobsResult<D>,
    ) -> JobsResult<(Self, D)> {
        let (seq, jlock, stime, resubmit, json): (Element, Option<Bytes>, i64, bool, Bytes) =
            tuple::unpack(bytes).map_err(|e| JobsError::Encoding(format!("bad job row: {e}")))?;
        let seq = match seq {
            Element::Int(0) => Seq::Pending,
            Element::Nil => Seq::Finished,
            Element::Versionstamp(vs) => Seq::Running(vs),
            other => {
                return Err(JobsError::Encoding(format!("bad job Seq {other:?}")));
            }
        };
        let jlock = match jlock {
            Some(l) => Some(
                String::from_utf8(l.into_owned())
                    .map_err(|_| JobsError::Encoding("job lock is not UTF-8".into()))?,
            ),
            None => None,
        };
        let decoded = data(&json)?;
        let row = Self {
            seq,
            jlock,
            stime,
            resubmit,
            data: JobData::new(),
        };
        Ok((row, decoded))
    }
}

/// Job data as stored: compact JSON.
pub(crate) fn encode_data(data: &JobData) -> Vec<u8> {
    // A map with string keys always serializes; an empty object is the safe fallback.
    serde_json::to_vec(data).unwrap_or_else(|_| b"{}".to_vec())
}

/// Parses stored job data; [`JobsError::Encoding`] if it is not a JSON object.
pub fn decode_data(bytes: &[u8]) -> JobsResult<JobData> {
    serde_json::from_slice(bytes).map_err(|e| JobsError::Encoding(format!("bad job data: {e}")))
}

/// The ACTIVITY value `(JobId, JobDataJSON)`.
pub(crate) fn encode_activity(id: &str, data: &JobData) -> Vec<u8> {
    tuple::pack(&(
        Bytes(Cow::Borrowed(id.as_bytes())),
        Bytes(Cow::Owned(encode_data(data))),
    ))
}

/// Decodes an ACTIVITY value into the job id and its data.
pub fn decode_activity(bytes: &[u8]) -> JobsResult<(String, JobData)> {
    let (id, json): (Bytes, Bytes) = tuple::unpack(bytes)
        .map_err(|e| JobsError::Encoding(format!("bad activity value: {e}")))?;
    let id = String::from_utf8(id.into_owned())
        .map_err(|_| JobsError::Encoding("job id is not UTF-8".into()))?;
    Ok((id, decode_data(&json)?))
}

/// A fresh job lock: 32 lowercase hex characters (16 random bytes).
pub(crate) fn new_jlock() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn data() -> JobData {
        json!({"a": 1, "b": "x"}).as_object().cloned().unwrap()
    }

    #[test]
    fn rows_round_trip_in_every_state() {
        let vs = Versionstamp::complete([1; 10], 7);
        for (seq, jlock, state) in [
            (Seq::Pending, None, JobState::Pending),
            (Seq::Finished, None, JobState::Finished),
            (Seq::Running(vs), Some(new_jlock()), JobState::Running),
        ] {
            let row = JobRow {
                seq,
                jlock,
                stime: 1234,
                resubmit: true,
                data: data(),
            };
            let (bytes, stamped) = row.encode();
            assert!(!stamped);
            let back = JobRow::decode(&bytes).unwrap();
            assert_eq!(back, row);
            assert_eq!(back.state(), state);
        }
    }

    #[test]
    fn incomplete_seq_gives_a_versionstamp_operand() {
        let row = JobRow {
            seq: Seq::Running(Versionstamp::incomplete(5)),
            jlock: Some(new_jlock()),
            stime: 0,
            resubmit: false,
            data: JobData::new(),
        };
        let (bytes, stamped) = row.encode();
        assert!(stamped);
        let filled = crate::store::fill_versionstamp(&bytes, &[9; 10]).unwrap();
        let back = JobRow::decode(&filled).unwrap();
        assert_eq!(back.seq, Seq::Running(Versionstamp::complete([9; 10], 5)));
    }

    #[test]
    fn corrupt_bytes_are_errors_not_panics() {
        for bad in [
            &b""[..],
            b"\xff\xff\xff",
            b"\x14\x00\x14\x26",
            b"\x02hello\x00",
            b"\x15\x07\x00\x14\x26\x01{}\x00",
        ] {
            assert!(matches!(JobRow::decode(bad), Err(JobsError::Encoding(_))));
        }
        // A well-formed tuple whose JSON is not an object.
        let not_obj = tuple::pack(&(
            0i64,
            Option::<i64>::None,
            0i64,
            false,
            Bytes(Cow::Borrowed(b"[1]")),
        ));
        assert!(matches!(
            JobRow::decode(&not_obj),
            Err(JobsError::Encoding(_))
        ));
        assert!(decode_activity(b"\x01a\x00").is_err());
        let (id, d) = decode_activity(&encode_activity("j", &data())).unwrap();
        assert_eq!((id.as_str(), d), ("j", data()));
    }

    #[test]
    fn jlocks_are_32_hex() {
        let l = new_jlock();
        assert_eq!(l.len(), 32);
        assert!(
            l.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }
}
