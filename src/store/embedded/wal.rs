//! The commit log: what makes a batch durable between redb checkpoints.
//!
//! Owned by the committer thread. A durable redb commit copies every B-tree page a batch
//! dirtied (16 transactions on 16 key ranges dirty ~16 leaves plus their branch paths), so its
//! fsync costs several times that of a single transaction. The committer therefore applies most
//! batches to redb without durability and makes them durable by appending one compact record
//! of their effects here, with one `fdatasync`; every so often it checkpoints (one durable
//! redb commit, which persists all earlier non-durable ones) and [`Wal::reset`]s the log.
//! FoundationDB's commit path has the same shape: the transaction log makes a commit durable,
//! storage servers apply it later.
//!
//! Record: `len u32 LE ‖ crc32 u32 LE ‖ payload`, payload = `version u64 BE ‖ effects`, each
//! effect a tag byte and length-prefixed byte strings. [`Wal::open`] returns the records up to
//! the first torn or corrupt one (a crash mid-append) and cuts the file there.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::store::StoreError;

/// The physical effect of a committed mutation, as replayed onto redb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    DeleteRange(Vec<u8>, Vec<u8>),
}

/// One logged batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub version: u64,
    pub effects: Vec<Effect>,
}

pub(crate) struct Wal {
    file: File,
    path: PathBuf,
    /// Bytes appended since the last reset.
    pub bytes: u64,
    buffer: Vec<u8>,
}

fn io_err(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Engine(format!("commit log {}: {e}", path.display()))
}

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_DELETE_RANGE: u8 = 3;
/// Far above any record the write limits allow; a bigger length is corruption.
const MAX_RECORD: usize = 1 << 30;

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads a payload; `None` if it is malformed.
fn decode(payload: &[u8]) -> Option<Record> {
    let mut rest = payload;
    let mut take = |n: usize| -> Option<&[u8]> {
        if rest.len() < n {
            return None;
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    };
    let version = u64::from_be_bytes(take(8)?.try_into().ok()?);
    let mut effects = Vec::new();
    while let Some(tag) = take(1) {
        let mut bytes = || -> Option<Vec<u8>> {
            let len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            Some(take(len)?.to_vec())
        };
        effects.push(match tag[0] {
            TAG_PUT => Effect::Put(bytes()?, bytes()?),
            TAG_DELETE => Effect::Delete(bytes()?),
            TAG_DELETE_RANGE => Effect::DeleteRange(bytes()?, bytes()?),
            _ => return None,
        });
    }
    Some(Record { version, effects })
}

impl Wal {
    /// The log that belongs to the store file at `store_path`.
    pub(crate) fn path_for(store_path: &Path) -> PathBuf {
        let mut name = store_path.as_os_str().to_owned();
        name.push(".wal");
        PathBuf::from(name)
    }

    /// Opens (or creates) the log and returns its intact records, in order. Records after the
    /// first damaged one, or whose version does not increase, are dropped from the file.
    pub(crate) fn open(path: PathBuf) -> Result<(Self, Vec<Record>), StoreError> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(|e| io_err(&path, e))?;
        let mut records: Vec<Record> = Vec::new();
        let mut good = 0usize;
        while let Some(header) = data.get(good..good + 8) {
            let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            let Some(payload) = data.get(good + 8..good + 8 + len) else {
                break;
            };
            if len > MAX_RECORD || crc32fast::hash(payload) != crc {
                break;
            }
            let Some(record) = decode(payload) else { break };
            if records.last().is_some_and(|r| r.version >= record.version) {
                break;
            }
            records.push(record);
            good += 8 + len;
        }
        if good < data.len() {
            tracing::warn!(
                path = %path.display(),
                dropped = data.len() - good,
                "embedded store: cutting a torn commit log tail"
            );
            file.set_len(good as u64).map_err(|e| io_err(&path, e))?;
            file.sync_all().map_err(|e| io_err(&path, e))?;
        }
        let wal = Self {
            file,
            path,
            bytes: good as u64,
            buffer: Vec::new(),
        };
        Ok((wal, records))
    }

    /// Appends one batch and waits until it is on disk.
    pub(crate) fn append(&mut self, version: u64, effects: &[Effect]) -> Result<(), StoreError> {
        let mut payload = std::mem::take(&mut self.buffer);
        payload.clear();
        payload.extend_from_slice(&version.to_be_bytes());
        for effect in effects {
            match effect {
                Effect::Put(k, v) => {
                    payload.push(TAG_PUT);
                    put_bytes(&mut payload, k);
                    put_bytes(&mut payload, v);
                }
                Effect::Delete(k) => {
                    payload.push(TAG_DELETE);
                    put_bytes(&mut payload, k);
                }
                Effect::DeleteRange(b, e) => {
                    payload.push(TAG_DELETE_RANGE);
                    put_bytes(&mut payload, b);
                    put_bytes(&mut payload, e);
                }
            }
        }
        if payload.len() > MAX_RECORD {
            return Err(StoreError::TooLarge(format!(
                "commit log record of {} bytes",
                payload.len()
            )));
        }
        let mut record = Vec::with_capacity(payload.len() + 8);
        record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        record.extend_from_slice(&payload);
        self.buffer = payload;
        self.file
            .write_all(&record)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_err(&self.path, e))?;
        self.bytes += record.len() as u64;
        Ok(())
    }

    /// Empties the log once a durable redb commit holds everything in it.
    pub(crate) fn reset(&mut self) -> Result<(), StoreError> {
        if self.bytes == 0 {
            return Ok(());
        }
        self.file
            .set_len(0)
            .and_then(|()| self.file.sync_all())
            .map_err(|e| io_err(&self.path, e))?;
        self.bytes = 0;
        Ok(())
    }
}

type Reply = mpsc::SyncSender<Result<(), StoreError>>;

enum Job {
    Append(u64, Vec<Effect>, Reply),
    Reset(Reply),
}

/// The log on its own thread, so that a batch's `fdatasync` runs while the committer applies
/// the same batch to redb.
pub(crate) struct LogWriter {
    jobs: mpsc::Sender<Job>,
    /// Bytes in the log (as of the last finished append or reset).
    pub bytes: u64,
}

/// An append in flight: [`Pending::wait`] returns once it is on disk.
pub(crate) struct Pending {
    done: mpsc::Receiver<Result<(), StoreError>>,
    bytes: u64,
}

impl Pending {
    pub(crate) fn wait(self, log: &mut LogWriter) -> Result<(), StoreError> {
        let result = self
            .done
            .recv()
            .map_err(|_| StoreError::Engine("commit log thread gone".into()))?;
        if result.is_ok() {
            log.bytes = self.bytes;
        }
        result
    }
}

impl LogWriter {
    pub(crate) fn start(mut wal: Wal) -> Result<Self, StoreError> {
        let bytes = wal.bytes;
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("store-log".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    match job {
                        Job::Append(version, effects, reply) => {
                            let _ = reply.send(wal.append(version, &effects));
                        }
                        Job::Reset(reply) => {
                            let _ = reply.send(wal.reset());
                        }
                    }
                }
            })
            .map_err(|e| StoreError::Engine(format!("commit log thread: {e}")))?;
        Ok(Self { jobs, bytes })
    }

    /// Starts appending a batch; `effects` are encoded and synced on the log thread.
    pub(crate) fn append(&mut self, version: u64, effects: Vec<Effect>) -> Pending {
        let size: u64 = effects.iter().map(Effect::encoded_len).sum::<u64>() + 16;
        let (reply, done) = mpsc::sync_channel(1);
        if let Err(mpsc::SendError(Job::Append(_, _, reply))) =
            self.jobs.send(Job::Append(version, effects, reply))
        {
            let _ = reply.send(Err(StoreError::Engine("commit log thread gone".into())));
        }
        Pending {
            done,
            bytes: self.bytes + size,
        }
    }

    pub(crate) fn reset(&mut self) -> Result<(), StoreError> {
        let (reply, done) = mpsc::sync_channel(1);
        self.jobs
            .send(Job::Reset(reply))
            .map_err(|_| StoreError::Engine("commit log thread gone".into()))?;
        done.recv()
            .map_err(|_| StoreError::Engine("commit log thread gone".into()))??;
        self.bytes = 0;
        Ok(())
    }
}

impl Effect {
    fn encoded_len(&self) -> u64 {
        let len = match self {
            Effect::Put(a, b) | Effect::DeleteRange(a, b) => 9 + a.len() + b.len(),
            Effect::Delete(a) => 5 + a.len(),
        };
        len as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effects(n: u8) -> Vec<Effect> {
        vec![
            Effect::Put(vec![n], vec![n; 3]),
            Effect::Delete(vec![n, 1]),
            Effect::DeleteRange(vec![0], vec![n]),
        ]
    }

    #[test]
    fn records_round_trip_and_torn_tails_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb.wal");
        let (mut wal, records) = Wal::open(path.clone()).unwrap();
        assert!(records.is_empty());
        for v in 1..=3u8 {
            wal.append(u64::from(v), &effects(v)).unwrap();
        }
        drop(wal);
        // A torn append: half a record at the end.
        let full = std::fs::read(&path).unwrap();
        let one = full.len() / 3;
        let mut torn = full.clone();
        torn.extend_from_slice(&full[..one / 2]);
        std::fs::write(&path, &torn).unwrap();
        let (_, records) = Wal::open(path.clone()).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(records[2].version, 3);
        assert_eq!(records[2].effects, effects(3));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), full.len() as u64);
        // A flipped byte in the second record drops it and everything after it.
        let mut bad = full.clone();
        bad[one + 10] ^= 0xFF;
        std::fs::write(&path, &bad).unwrap();
        let (_, records) = Wal::open(path.clone()).unwrap();
        assert_eq!(records.len(), 1);
        // After a reset the log is empty and appends start over.
        std::fs::write(&path, &full).unwrap();
        let (mut wal, records) = Wal::open(path.clone()).unwrap();
        assert_eq!(records.len(), 3);
        wal.reset().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        wal.append(9, &effects(9)).unwrap();
        drop(wal);
        let (_, records) = Wal::open(path).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].version, 9);
    }
}
