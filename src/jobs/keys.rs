//! The couch_jobs key layout (CouchDB's couch_jobs.hrl key layout) under a configurable prefix.
//!
//! `prefix ‖ pack((51, Sub, ...))` with sub-spaces DATA 1, PENDING 2, WATCHES_PENDING 3,
//! WATCHES_ACTIVITY 4, ACTIVITY_TIMEOUT 5, ACTIVITY 6. Types and job ids are encoded as tuple
//! *byte strings* (code 0x01), as erlfdb encodes Erlang binaries. Versionstamps are the
//! 96-bit tuple form (code 0x33: 10-byte commit stamp + 2-byte user version), because
//! foundationdb-tuple 0.11 has no 80-bit form; the user version keeps two activity keys
//! written in one transaction apart (see [`next_user_version`]).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::store::strinc;
use crate::store::tuple::{self, Bytes, TuplePack, Versionstamp};

use super::error::{JobsError, JobsResult};

/// `?JOBS`: the tuple element appended to the layer prefix.
pub const JOBS: i64 = 51;
/// `?DATA`: the sub-space of each job's DATA row, `(1, Type, JobId)`.
pub const DATA: i64 = 1;
/// `?PENDING`: the pending queue, `(2, Type, STime, JobId)`, ordered by scheduled time.
pub const PENDING: i64 = 2;
/// `?WATCHES_PENDING`: a per-type counter bumped on every enqueue; acceptors watch it.
pub const WATCHES_PENDING: i64 = 3;
/// `?WATCHES_ACTIVITY`: a per-type versionstamp bumped whenever a job of the type changes;
/// notifiers and activity monitors watch it.
pub const WATCHES_ACTIVITY: i64 = 4;
/// `?ACTIVITY_TIMEOUT`: each type's activity timeout in seconds; its presence makes the type
/// known.
pub const ACTIVITY_TIMEOUT: i64 = 5;
/// `?ACTIVITY`: running jobs by the versionstamp of their last update, `(6, Type, Vs)`.
pub const ACTIVITY: i64 = 6;

/// The user version written into the activity watch: the highest, so "activity keys with a
/// versionstamp ≤ the watch value" includes every key of the watch's own commit.
pub const WATCH_USER_VERSION: u16 = u16::MAX;

static USER_VERSION: AtomicU16 = AtomicU16::new(0);

/// A process-wide cycling user version for job versionstamps (`Seq` and ACTIVITY keys). Two
/// jobs updated in one transaction get different versionstamps (erlfdb's 80-bit form would
/// give both the same ACTIVITY key and lose one). Never returns [`WATCH_USER_VERSION`].
pub fn next_user_version() -> u16 {
    USER_VERSION.fetch_add(1, Ordering::Relaxed) % WATCH_USER_VERSION
}

pub(crate) fn b(s: &str) -> Bytes<'_> {
    Bytes(Cow::Borrowed(s.as_bytes()))
}

fn bytes_to_string(bytes: Bytes<'_>, what: &str) -> JobsResult<String> {
    String::from_utf8(bytes.into_owned())
        .map_err(|_| JobsError::Encoding(format!("{what} is not UTF-8")))
}

/// Key builder for one couch_jobs instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    jobs: Vec<u8>,
}

impl Keys {
    /// `prefix` is the layer prefix (CouchDB's directory for `"couchdb"`); the jobs prefix is
    /// `prefix ‖ pack((51))`.
    pub fn new(prefix: &[u8]) -> Self {
        let mut jobs = prefix.to_vec();
        tuple::pack_into(&(JOBS,), &mut jobs);
        Self { jobs }
    }

    /// `prefix ‖ pack((51))`.
    pub fn jobs_prefix(&self) -> &[u8] {
        &self.jobs
    }

    fn pack<T: TuplePack>(&self, t: &T) -> Vec<u8> {
        let mut key = self.jobs.clone();
        tuple::pack_into(t, &mut key);
        key
    }

    fn pack_vs<T: TuplePack>(&self, t: &T) -> Vec<u8> {
        let mut key = self.jobs.clone();
        tuple::pack_into_with_versionstamp(t, &mut key);
        key
    }

    fn prefix_range(prefix: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
        // Tuple-packed prefixes never end in 0xFF, so strinc always exists.
        let end = strinc(&prefix).unwrap_or_else(|| vec![0xFF]);
        (prefix, end)
    }

    fn strip<'a>(&self, key: &'a [u8]) -> JobsResult<&'a [u8]> {
        key.strip_prefix(self.jobs.as_slice())
            .ok_or_else(|| JobsError::Encoding("key outside the jobs prefix".into()))
    }

    /// The DATA key of one job.
    pub fn data(&self, ty: &str, id: &str) -> Vec<u8> {
        self.pack(&(DATA, b(ty), b(id)))
    }

    /// Every DATA key of a type.
    pub fn data_range(&self, ty: &str) -> (Vec<u8>, Vec<u8>) {
        Self::prefix_range(self.pack(&(DATA, b(ty))))
    }

    /// The job id of a DATA key.
    pub fn decode_data_key(&self, key: &[u8]) -> JobsResult<String> {
        let (sub, _ty, id): (i64, Bytes, Bytes) = tuple::unpack(self.strip(key)?)
            .map_err(|e| JobsError::Encoding(format!("bad DATA key: {e}")))?;
        if sub != DATA {
            return Err(JobsError::Encoding("not a DATA key".into()));
        }
        bytes_to_string(id, "job id")
    }

    /// The PENDING key of a job queued at `stime`.
    pub fn pending(&self, ty: &str, stime: i64, id: &str) -> Vec<u8> {
        self.pack(&(PENDING, b(ty), stime, b(id)))
    }

    /// Pending keys of a type with `STime <= max_sched_time`.
    pub fn pending_range(&self, ty: &str, max_sched_time: i64) -> (Vec<u8>, Vec<u8>) {
        let begin = self.pack(&(PENDING, b(ty)));
        let mut end = self.pack(&(PENDING, b(ty), max_sched_time));
        end.push(0xFF);
        (begin, end)
    }

    /// `(STime, JobId)` of a PENDING key.
    pub fn decode_pending_key(&self, key: &[u8]) -> JobsResult<(i64, String)> {
        let (sub, _ty, stime, id): (i64, Bytes, i64, Bytes) = tuple::unpack(self.strip(key)?)
            .map_err(|e| JobsError::Encoding(format!("bad PENDING key: {e}")))?;
        if sub != PENDING {
            return Err(JobsError::Encoding("not a PENDING key".into()));
        }
        Ok((stime, bytes_to_string(id, "job id")?))
    }

    /// The type's pending-watch counter key.
    pub fn watches_pending(&self, ty: &str) -> Vec<u8> {
        self.pack(&(WATCHES_PENDING, b(ty)))
    }

    /// The type's activity-watch key.
    pub fn watches_activity(&self, ty: &str) -> Vec<u8> {
        self.pack(&(WATCHES_ACTIVITY, b(ty)))
    }

    /// The versionstamped-value operand that bumps the activity watch.
    pub fn watches_activity_value(&self) -> Vec<u8> {
        tuple::pack_with_versionstamp(&(Versionstamp::incomplete(WATCH_USER_VERSION),))
    }

    /// Decodes the activity watch value `(Versionstamp)`.
    pub fn decode_watches_activity(&self, value: &[u8]) -> JobsResult<Versionstamp> {
        let (vs,): (Versionstamp,) = tuple::unpack(value)
            .map_err(|e| JobsError::Encoding(format!("bad activity watch value: {e}")))?;
        Ok(vs)
    }

    /// The key holding the type's activity timeout.
    pub fn activity_timeout(&self, ty: &str) -> Vec<u8> {
        self.pack(&(ACTIVITY_TIMEOUT, b(ty)))
    }

    /// Every ACTIVITY_TIMEOUT key (one per known type).
    pub fn activity_timeout_range(&self) -> (Vec<u8>, Vec<u8>) {
        Self::prefix_range(self.pack(&(ACTIVITY_TIMEOUT,)))
    }

    /// The type of an ACTIVITY_TIMEOUT key.
    pub fn decode_activity_timeout_key(&self, key: &[u8]) -> JobsResult<String> {
        let (sub, ty): (i64, Bytes) = tuple::unpack(self.strip(key)?)
            .map_err(|e| JobsError::Encoding(format!("bad ACTIVITY_TIMEOUT key: {e}")))?;
        if sub != ACTIVITY_TIMEOUT {
            return Err(JobsError::Encoding("not an ACTIVITY_TIMEOUT key".into()));
        }
        bytes_to_string(ty, "job type")
    }

    /// Encodes a type timeout value (seconds, as a one-element tuple).
    pub fn encode_timeout(secs: i64) -> Vec<u8> {
        tuple::pack(&(secs,))
    }

    /// Decodes a value written by [`Keys::encode_timeout`].
    pub fn decode_timeout(value: &[u8]) -> JobsResult<i64> {
        let (secs,): (i64,) = tuple::unpack(value)
            .map_err(|e| JobsError::Encoding(format!("bad type timeout value: {e}")))?;
        Ok(secs)
    }

    /// A complete ACTIVITY key.
    pub fn activity(&self, ty: &str, vs: &Versionstamp) -> Vec<u8> {
        self.pack(&(ACTIVITY, b(ty), vs.clone()))
    }

    /// A versionstamped-key operand for a new ACTIVITY key with the given user version.
    pub fn activity_incomplete(&self, ty: &str, user_version: u16) -> Vec<u8> {
        self.pack_vs(&(ACTIVITY, b(ty), Versionstamp::incomplete(user_version)))
    }

    /// Every ACTIVITY key of a type (its running jobs).
    pub fn activity_range(&self, ty: &str) -> (Vec<u8>, Vec<u8>) {
        Self::prefix_range(self.pack(&(ACTIVITY, b(ty))))
    }

    /// ACTIVITY keys with a versionstamp `<= vs`.
    pub fn activity_range_upto(&self, ty: &str, vs: &Versionstamp) -> (Vec<u8>, Vec<u8>) {
        let mut end = self.activity(ty, vs);
        end.push(0x00);
        (self.pack(&(ACTIVITY, b(ty))), end)
    }

    /// ACTIVITY keys with a versionstamp `>= vs`.
    pub fn activity_range_from(&self, ty: &str, vs: &Versionstamp) -> (Vec<u8>, Vec<u8>) {
        (self.activity(ty, vs), self.activity_range(ty).1)
    }

    /// The versionstamp of an ACTIVITY key.
    pub fn decode_activity_key(&self, key: &[u8]) -> JobsResult<Versionstamp> {
        let (sub, _ty, vs): (i64, Bytes, Versionstamp) = tuple::unpack(self.strip(key)?)
            .map_err(|e| JobsError::Encoding(format!("bad ACTIVITY key: {e}")))?;
        if sub != ACTIVITY {
            return Err(JobsError::Encoding("not an ACTIVITY key".into()));
        }
        Ok(vs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_couch_jobs_bytes() {
        let k = Keys::new(b"P");
        // 0x15 0x33 = integer 51; 0x15 0x01 = DATA; 0x01 .. 0x00 = byte strings.
        assert_eq!(
            k.data("t", "j"),
            vec![b'P', 0x15, 51, 0x15, 1, 0x01, b't', 0x00, 0x01, b'j', 0x00]
        );
        assert_eq!(k.decode_data_key(&k.data("t", "j1")).unwrap(), "j1");
        let p = k.pending("t", 42, "j");
        assert_eq!(k.decode_pending_key(&p).unwrap(), (42, "j".to_string()));
        let (b0, e0) = k.pending_range("t", 42);
        assert!(b0 < p && p < e0);
        let (_, e1) = k.pending_range("t", 41);
        assert!(p > e1);
    }

    #[test]
    fn activity_keys_order_and_ranges() {
        let k = Keys::new(b"");
        let v1 = Versionstamp::complete([0, 0, 0, 0, 0, 0, 0, 1, 0, 0], 3);
        let v2 = Versionstamp::complete([0, 0, 0, 0, 0, 0, 0, 2, 0, 0], 0);
        let watch = Versionstamp::complete([0, 0, 0, 0, 0, 0, 0, 1, 0, 0], WATCH_USER_VERSION);
        let a1 = k.activity("t", &v1);
        let a2 = k.activity("t", &v2);
        assert!(a1 < a2);
        let (b, e) = k.activity_range_upto("t", &watch);
        assert!(b <= a1 && a1 < e && a2 >= e);
        assert_eq!(k.decode_activity_key(&a2).unwrap(), v2);
        let (b, e) = k.activity_range("t");
        assert!(b < a1 && a2 < e);
        assert!(k.activity_range("u").0 >= e || k.activity_range("u").1 <= b);
    }

    #[test]
    fn corrupt_keys_are_errors() {
        let k = Keys::new(b"P");
        assert!(matches!(
            k.decode_data_key(b"P\x15\x33\xff\xff"),
            Err(JobsError::Encoding(_))
        ));
        assert!(k.decode_pending_key(b"Q").is_err());
        assert!(k.decode_activity_key(&k.data("t", "j")).is_err());
        assert!(Keys::decode_timeout(b"\x02x\x00").is_err());
        assert_eq!(Keys::decode_timeout(&Keys::encode_timeout(61)).unwrap(), 61);
    }

    #[test]
    fn user_versions_skip_the_watch_version() {
        for _ in 0..70_000 {
            assert_ne!(next_user_version(), WATCH_USER_VERSION);
        }
    }
}
