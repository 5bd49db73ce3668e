//! The storage seam: a tiny ordered key-value interface with atomic batches.
//!
//! Production uses RocksDB ([`RocksKv`]) with `sync = true` on every batch
//! that makes Raft state durable; unit tests and the state machine's golden
//! scripts use [`MemKv`]. Everything a member persists (Raft log, hard state,
//! snapshot, the node tree, sessions, fences, users, the cluster record, the
//! applied index) goes through one `Kv`, so a single synced batch makes a
//! whole `Ready` durable at once. RocksDB runs with one default column
//! family, the WAL on and `keep_log_file_num(4)`.
//!
//! The memtable is 16 MiB ([`WRITE_BUFFER_BYTES`], RocksDB's default is
//! 64): each flush ends with RocksDB deleting the WAL file the memtable
//! covered, and the WAL cannot be recycled under `AbsoluteConsistency`
//! (below). Deleting a 62 MB WAL stalled the synced writes of all three
//! members of a local cluster for 60-80 ms every ~15 s at 11k writes/s
//! (ext4 with `discard` frees the blocks at once; the members hold the
//! same data, so they flush together); a 16 MiB one did not stall past
//! 25 ms (docs/perf/fsync.md).
//!
//! A full memtable is flushed right after the write that filled it
//! ([`RocksKv::write`], for batches of 1 MiB or more): RocksDB itself starts
//! the flush only when the next write arrives, so a member that applied a
//! big batch (a catch-up of a million nodes) and was then killed left
//! 152 MB in the WAL, and its next start spent 6 s replaying it
//! (docs/scaling.md).
//!
//! Integrity ([`RocksKv`]): every value is stored as `0xB7`, its CRC-32
//! (little-endian) and the value; every read checks it. RocksDB adds its own
//! block checksums (checked on every read) and runs with paranoid checks
//! and `AbsoluteConsistency` WAL recovery, so a damaged WAL fails the open
//! instead of silently dropping its tail (acknowledged entries and votes).
//! Any mismatch is a [`KvError`] that says `corrupt`: the member refuses to
//! start (exit code 3, main.rs) and must be replaced from its peers. A store
//! that will not open for another reason (another process holds its lock,
//! no permission) is not called corrupt: exit 1, fix it and start again
//! (docs/operations.md). Values written before checksums existed (no `0xB7`
//! first byte, which no protobuf message or big-endian index starts with)
//! are read as they are.
//!
//! Key space (first byte is the table):
//! - `e` + index (u64 BE): Raft log entry (protobuf 2, raft-rs `Entry`)
//! - `h`: hard state, `c`: conf state, `t`: truncated (index, term),
//!   `p`: latest Raft snapshot's record (raft-rs `Snapshot`: its metadata;
//!   its state inline only in a record written before `d` existed),
//!   `d`: that snapshot's state bytes (raft_store.rs)
//! - `a`: applied index (u64 BE), written with the state it produced
//! - `n` + path: `NodeRecord` (data, stat, sequential counter, ACL),
//!   `s` + id (u64 BE): `SessionRecord` (timeout, secret, cached replies,
//!   `acked_below`), `f` + name: `FenceRecord`, `u` + name: `UserRecord`,
//!   `i`: the `ClusterRecord` (state/mod.rs)
//!
//! Not stored, rebuilt on load (`StateMachine::load`): each node's child
//! list and `num_children`, each session's ephemeral paths; `data_length`
//! is computed when a stat is returned.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

/// One write in a batch.
#[derive(Debug, Clone)]
pub enum BatchOp {
    Put(Vec<u8>, Vec<u8>),
    /// A put whose value is shared with what the caller keeps in memory
    /// (the Raft snapshot's state, raft_store.rs): staging it copies
    /// nothing on the driver; the syncer copies it into the write.
    PutShared(Vec<u8>, bytes::Bytes),
    Delete(Vec<u8>),
    /// Deletes keys in `[from, to)`.
    DeleteRange(Vec<u8>, Vec<u8>),
}

/// An atomic group of writes.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub ops: Vec<BatchOp>,
}

impl Batch {
    pub fn put(&mut self, k: impl Into<Vec<u8>>, v: impl Into<Vec<u8>>) {
        self.ops.push(BatchOp::Put(k.into(), v.into()));
    }
    pub fn put_shared(&mut self, k: impl Into<Vec<u8>>, v: bytes::Bytes) {
        self.ops.push(BatchOp::PutShared(k.into(), v));
    }
    pub fn delete(&mut self, k: impl Into<Vec<u8>>) {
        self.ops.push(BatchOp::Delete(k.into()));
    }
    pub fn delete_range(&mut self, from: impl Into<Vec<u8>>, to: impl Into<Vec<u8>>) {
        self.ops.push(BatchOp::DeleteRange(from.into(), to.into()));
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Key-value pairs, in key order.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// What [`Kv::for_each_prefix`] calls with each key and value.
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), KvError> + 'a;

#[derive(Debug, thiserror::Error)]
#[error("storage: {0}")]
pub struct KvError(pub String);

/// An ordered key-value store with atomic, optionally synced, batches.
pub trait Kv: Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError>;
    /// Calls `f` with each pair whose key starts with `prefix`, in key
    /// order, without copying them (a load of a million nodes streams).
    fn for_each_prefix(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), KvError>;
    /// All pairs whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, KvError> {
        let mut out = Vec::new();
        self.for_each_prefix(prefix, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(())
        })?;
        Ok(out)
    }
    /// Applies `batch` atomically; with `sync`, returns only once it is on disk.
    fn write(&self, batch: Batch, sync: bool) -> Result<(), KvError>;
    /// Bytes on disk (SST files and the live WAL's memtables), 0 if unknown.
    fn size_bytes(&self) -> u64 {
        0
    }
    /// Calls `f` with a read view of the store as it is now: writes made
    /// after this call began are not in it, however long `f` reads (a
    /// RocksDB snapshot). Snapshots are built from one, off the driver
    /// (driver/ready.rs).
    fn with_view(&self, f: &mut dyn FnMut(&dyn KvView));
}

/// A fixed read view of a store ([`Kv::with_view`]).
pub trait KvView {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError>;
    /// As [`Kv::for_each_prefix`].
    fn for_each_prefix(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), KvError>;
}

/// RocksDB, one default column family, WAL on.
pub struct RocksKv {
    db: rocksdb::DB,
    /// Fault `lenient-storage`: no checksums checked or written.
    lenient: bool,
}

impl RocksKv {
    pub fn open(dir: &Path) -> Result<Self, KvError> {
        Self::open_with(dir, false)
    }

    /// `lenient`: the deliberate bug `lenient-storage` (faults.rs).
    pub fn open_with(dir: &Path, lenient: bool) -> Result<Self, KvError> {
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_keep_log_file_num(4);
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        if !lenient {
            opts.set_paranoid_checks(true);
            opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::AbsoluteConsistency);
        }
        let db = rocksdb::DB::open(&opts, dir).map_err(open_err)?;
        Ok(RocksKv { db, lenient })
    }
}

/// RocksDB's memtable size, and so the size of each WAL file it deletes
/// after a flush (module doc).
pub const WRITE_BUFFER_BYTES: usize = 16 << 20;

/// First byte of a checksummed value.
const SEALED: u8 = 0xB7;

/// `value` with its checksum in front.
fn seal(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 5);
    out.push(SEALED);
    out.extend_from_slice(&crc32fast::hash(value).to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// The value behind a checksum, checked (legacy values pass as they are).
fn open_sealed(key: &[u8], stored: Vec<u8>) -> Result<Vec<u8>, KvError> {
    if stored.first() != Some(&SEALED) {
        return Ok(stored);
    }
    check_sealed(key, &stored).map(<[u8]>::to_vec)
}

/// [`open_sealed`] without a copy.
fn check_sealed<'a>(key: &[u8], stored: &'a [u8]) -> Result<&'a [u8], KvError> {
    if stored.first() != Some(&SEALED) {
        return Ok(stored);
    }
    let bad = || KvError(format!("corrupt value under key {:?}: checksum mismatch", String::from_utf8_lossy(key)));
    let crc: [u8; 4] = stored.get(1..5).and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
    let value = &stored[5..];
    if crc32fast::hash(value) != u32::from_le_bytes(crc) {
        return Err(bad());
    }
    Ok(value)
}

/// [`check_sealed`] under the fault `lenient-storage`: the checksum skipped.
fn skip_seal(stored: &[u8]) -> &[u8] {
    match stored.first() {
        Some(&SEALED) => &stored[5.min(stored.len())..],
        _ => stored,
    }
}

/// Why the store would not open. Only damage says `corrupt` (exit 3: the
/// operator replaces the member); a store another process holds open, or
/// one this user may not read, says what it is (exit 1: fix and restart),
/// never that the data is damaged.
fn open_err(e: rocksdb::Error) -> KvError {
    let text = e.to_string();
    match e.kind() {
        rocksdb::ErrorKind::Corruption => KvError(format!("corrupt store: {text}")),
        _ if text.contains("LOCK") => {
            KvError(format!("the data dir is in use (is another batond running on it?): {text}"))
        }
        _ => KvError(format!("cannot open the store: {text}")),
    }
}

fn rocks_err(e: rocksdb::Error) -> KvError {
    // RocksDB says "Corruption: ..." for a bad block checksum.
    KvError(e.to_string().replace("Corruption", "corrupt store"))
}

impl Kv for RocksKv {
    fn size_bytes(&self) -> u64 {
        let prop = |p: &str| self.db.property_int_value(p).ok().flatten().unwrap_or(0);
        prop("rocksdb.total-sst-files-size") + prop("rocksdb.cur-size-all-mem-tables")
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let v = self.db.get(key).map_err(rocks_err)?;
        if self.lenient {
            return Ok(v.map(|v| skip_seal(&v).to_vec()));
        }
        v.map(|v| open_sealed(key, v)).transpose()
    }

    fn for_each_prefix(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), KvError> {
        walk(self.db.raw_iterator(), prefix, self.lenient, f)
    }

    fn with_view(&self, f: &mut dyn FnMut(&dyn KvView)) {
        f(&RocksView { snap: self.db.snapshot(), lenient: self.lenient })
    }

    fn write(&self, batch: Batch, sync: bool) -> Result<(), KvError> {
        let mut wb = rocksdb::WriteBatch::default();
        for op in batch.ops {
            match op {
                BatchOp::Put(k, v) => wb.put(k, seal(&v)),
                BatchOp::PutShared(k, v) => wb.put(k, seal(&v)),
                BatchOp::Delete(k) => wb.delete(k),
                BatchOp::DeleteRange(a, b) => wb.delete_range(a, b),
            }
        }
        let big = wb.size_in_bytes() >= BIG_WRITE_BYTES;
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(wb, &wo).map_err(rocks_err)?;
        if big {
            self.flush_if_full();
            crate::memory::release();
        }
        Ok(())
    }
}

/// Every pair under `prefix` from `it`, checked, to `f`.
fn walk(mut it: rocksdb::DBRawIterator<'_>, prefix: &[u8], lenient: bool, f: &mut Visit<'_>) -> Result<(), KvError> {
    it.seek(prefix);
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        if !k.starts_with(prefix) {
            break;
        }
        let v = match lenient {
            true => skip_seal(v),
            false => check_sealed(k, v)?,
        };
        f(k, v)?;
        it.next();
    }
    it.status().map_err(rocks_err)
}

/// A RocksDB snapshot: the store as it was when it was taken.
struct RocksView<'a> {
    snap: rocksdb::Snapshot<'a>,
    lenient: bool,
}

impl KvView for RocksView<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let v = self.snap.get(key).map_err(rocks_err)?;
        match self.lenient {
            true => Ok(v.map(|v| skip_seal(&v).to_vec())),
            false => v.map(|v| open_sealed(key, v)).transpose(),
        }
    }

    fn for_each_prefix(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), KvError> {
        walk(self.snap.raw_iterator(), prefix, self.lenient, f)
    }
}

/// A batch this large may have filled the memtable by itself (module doc).
const BIG_WRITE_BYTES: usize = 1 << 20;

impl RocksKv {
    /// Starts a flush of the memtable if it is full, without waiting for it.
    /// RocksDB flushes a full memtable only when the next write arrives; a
    /// member that wrote a big batch and then went quiet (or was killed)
    /// would leave it all in the WAL, to be replayed at the next start.
    fn flush_if_full(&self) {
        let active = self.db.property_int_value("rocksdb.cur-size-active-mem-table").ok().flatten().unwrap_or(0);
        if active < WRITE_BUFFER_BYTES as u64 {
            return;
        }
        let mut fo = rocksdb::FlushOptions::default();
        fo.set_wait(false);
        if let Err(e) = self.db.flush_opt(&fo) {
            tracing::warn!(error = %e, "could not start a flush of a full memtable");
        }
    }

    /// Bytes in SST files: what flushes have written (a test's window).
    #[cfg(test)]
    fn sst_bytes(&self) -> u64 {
        self.db.property_int_value("rocksdb.total-sst-files-size").ok().flatten().unwrap_or(0)
    }
}

/// In-memory engine for tests: same semantics, no durability.
#[derive(Default)]
pub struct MemKv {
    map: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemKv {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        // A panic while holding this lock can only come from a test; recover.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Kv for MemKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.lock().get(key).cloned())
    }

    fn for_each_prefix(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), KvError> {
        mem_walk(&self.lock(), prefix, f)
    }

    fn with_view(&self, f: &mut dyn FnMut(&dyn KvView)) {
        let copy = MemView(self.lock().clone());
        f(&copy)
    }

    fn write(&self, batch: Batch, _sync: bool) -> Result<(), KvError> {
        let mut map = self.lock();
        for op in batch.ops {
            match op {
                BatchOp::Put(k, v) => {
                    map.insert(k, v);
                }
                BatchOp::PutShared(k, v) => {
                    map.insert(k, v.to_vec());
                }
                BatchOp::Delete(k) => {
                    map.remove(&k);
                }
                BatchOp::DeleteRange(a, b) => {
                    let keys: Vec<_> = map.range(a..b).map(|(k, _)| k.clone()).collect();
                    for k in keys {
                        map.remove(&k);
                    }
                }
            }
        }
        Ok(())
    }
}

fn mem_walk(map: &BTreeMap<Vec<u8>, Vec<u8>>, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), KvError> {
    for (k, v) in map.range(prefix.to_vec()..).take_while(|(k, _)| k.starts_with(prefix)) {
        f(k, v)?;
    }
    Ok(())
}

/// [`MemKv`]'s view: a copy of the map.
struct MemView(BTreeMap<Vec<u8>, Vec<u8>>);

impl KvView for MemView {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.0.get(key).cloned())
    }

    fn for_each_prefix(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), KvError> {
        mem_walk(&self.0, prefix, f)
    }
}

/// The end of a prefix range: `prefix` with its last byte incremented.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; prefix.len() + 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(kv: &dyn Kv) {
        let mut b = Batch::default();
        b.put(b"na".to_vec(), b"1".to_vec());
        b.put(b"nb".to_vec(), b"2".to_vec());
        b.put(b"sa".to_vec(), b"3".to_vec());
        kv.write(b, true).unwrap();
        assert_eq!(kv.scan_prefix(b"n").unwrap().len(), 2);
        let mut b = Batch::default();
        b.delete_range(b"n".to_vec(), prefix_end(b"n"));
        kv.write(b, true).unwrap();
        assert!(kv.scan_prefix(b"n").unwrap().is_empty());
        assert_eq!(kv.get(b"sa").unwrap(), Some(b"3".to_vec()));
    }

    #[test]
    fn mem_and_rocks_agree() {
        exercise(&MemKv::default());
        let dir = tempfile::tempdir().unwrap();
        exercise(&RocksKv::open(dir.path()).unwrap());
    }

    /// The options RocksDB wrote out are the ones the module doc states.
    #[test]
    fn rocksdb_runs_with_the_stated_options() {
        let dir = tempfile::tempdir().unwrap();
        let kv = RocksKv::open(dir.path()).unwrap();
        exercise(&kv);
        let options: String = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("OPTIONS-"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect();
        let has = |line: &str| options.lines().any(|l| l.trim() == line);
        assert!(has("wal_recovery_mode=kAbsoluteConsistency"), "{options}");
        assert!(has("paranoid_checks=true"), "{options}");
        assert!(has("keep_log_file_num=4"), "{options}");
        assert!(has(&format!("write_buffer_size={WRITE_BUFFER_BYTES}")), "{options}");
    }
}

#[cfg(test)]
mod views {
    use super::*;

    fn put(kv: &dyn Kv, k: &str, v: &str) {
        let mut b = Batch::default();
        b.put(k.as_bytes().to_vec(), v.as_bytes().to_vec());
        kv.write(b, false).expect("write");
    }

    /// A view keeps what the store held when it was taken, while writes
    /// go on.
    fn a_view_does_not_see_later_writes(kv: &dyn Kv) {
        put(kv, "na", "1");
        kv.with_view(&mut |view| {
            put(kv, "na", "2");
            put(kv, "nb", "3");
            assert_eq!(view.get(b"na").expect("get"), Some(b"1".to_vec()));
            let mut seen = Vec::new();
            view.for_each_prefix(b"n", &mut |k, v| {
                seen.push((k.to_vec(), v.to_vec()));
                Ok(())
            })
            .expect("walk");
            assert_eq!(seen, vec![(b"na".to_vec(), b"1".to_vec())]);
        });
        assert_eq!(kv.get(b"na").expect("get"), Some(b"2".to_vec()));
    }

    #[test]
    fn views_are_fixed_in_rocks_and_in_memory() {
        a_view_does_not_see_later_writes(&MemKv::default());
        let dir = tempfile::tempdir().expect("tempdir");
        a_view_does_not_see_later_writes(&RocksKv::open(dir.path()).expect("open"));
    }
}

#[cfg(test)]
mod flush {
    use super::*;

    /// One batch bigger than the memtable, then nothing: it reaches an SST
    /// file without another write to trigger the flush.
    #[test]
    fn a_write_that_fills_the_memtable_is_flushed_without_another() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kv = RocksKv::open(dir.path()).expect("open");
        let mut b = Batch::default();
        for i in 0..(WRITE_BUFFER_BYTES / 4096 + 256) {
            b.put(format!("n{i:08}").into_bytes(), vec![i as u8; 4096]);
        }
        kv.write(b, true).expect("write");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while kv.sst_bytes() == 0 {
            assert!(std::time::Instant::now() < deadline, "the full memtable was never flushed");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(kv.scan_prefix(b"n").expect("scan").len(), WRITE_BUFFER_BYTES / 4096 + 256);
    }
}

#[cfg(test)]
mod integrity {
    use super::*;

    #[test]
    fn a_flipped_byte_is_reported_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kv = RocksKv::open(dir.path()).expect("open");
        let mut b = Batch::default();
        b.put(b"e1".to_vec(), b"entry one".to_vec());
        kv.write(b, true).expect("write");
        assert_eq!(kv.get(b"e1").expect("get").as_deref(), Some(&b"entry one"[..]));
        // Damage the stored bytes under the checksum (as a bad disk would).
        let mut raw = kv.db.get(b"e1").expect("raw").expect("present");
        raw[7] ^= 0x40;
        kv.db.put(b"e1", raw).expect("raw put");
        let err = kv.get(b"e1").expect_err("corruption detected");
        assert!(err.0.contains("corrupt"), "{}", err.0);
        assert!(kv.scan_prefix(b"e").is_err());
        // A value from before checksums reads as it is.
        kv.db.put(b"e2", b"\x08\x01legacy").expect("raw put");
        assert_eq!(kv.get(b"e2").expect("legacy").as_deref(), Some(&b"\x08\x01legacy"[..]));
    }
}
