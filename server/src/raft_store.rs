//! Durable Raft storage: raft-rs's [`Storage`] over a [`Kv`].
//!
//! The log lives in memory as well as on disk: raft-rs reads entries on every
//! append it sends, and the log is bounded by compaction (see
//! `Config::snapshot_entries`), so the in-memory copy stays small. Disk writes
//! are *staged* into a [`Batch`] by the caller (the Raft driver) and become
//! durable when it writes that batch with `sync = true`; the in-memory view
//! changes at once, which is what raft-rs expects (it only sends
//! `persisted_messages` after the driver has synced).
//!
//! Invariants:
//! - `entries` is contiguous; `entries[0].index == truncated.0 + 1` when non-empty.
//! - `term(truncated.0)` is answered from `truncated.1` (raft-rs needs the
//!   term of the entry just before the first one).
//! - the stored snapshot's index is `>= truncated.0`, so a follower that needs
//!   a compacted entry can always be sent the snapshot.
//!
//! # Snapshots and compaction
//! - Taking one: after every Ready the driver checks whether
//!   `applied - first + 1 >= --snapshot-entries` (default 20,000:
//!   `compaction_due` in driver/ready.rs). If so, the state at the applied
//!   index A is checkpointed and encoded from the store on the snapshot
//!   thread (driver/ready.rs, "Snapshots off the driver"); with its answer
//!   [`RaftStore::compact`] stores it as the raft-rs snapshot at A and
//!   truncates the log up to `A - snapshot_entries / 4`: the last quarter
//!   stays, so a follower that lags a little catches up from entries.
//! - Sending one: raft-rs on the leader emits a `MsgSnapshot` holding the
//!   stored snapshot; the transport sends it as one peer frame (up to
//!   1 GiB) and reports the outcome to raft-rs (`Input::SnapshotSent`); one
//!   dropped while the peer was unreachable is a failure.
//! - `snapshot()` answers `SnapshotTemporarilyUnavailable` when the stored
//!   snapshot is older than raft-rs asks for, and when its configuration
//!   does not hold the member it is for (one added since): then the driver
//!   has a new one built at its applied index, from a checkpoint by the
//!   snapshot thread as a compaction's is, and stores it without dropping
//!   entries (`snapshot_now`); raft-rs asks again until it is there.
//! - Installing one: [`RaftStore::apply_snapshot`] deletes the whole log,
//!   sets the truncation point to the snapshot's index and term, raises the
//!   hard state's term and commit to at least the snapshot's, and stores its
//!   `ConfState` and the snapshot (the state machine's side: driver/ready.rs).
//! - Where a snapshot is stored: its metadata (index, term, configuration)
//!   under `KEY_SNAPSHOT`, its state bytes under `KEY_SNAPSHOT_DATA`, in
//!   one batch. The bytes are shared with the copy kept in memory for
//!   raft-rs, so storing a snapshot copies nothing on the driver (encoding
//!   the state into one record took the driver 25-850 ms at a million
//!   nodes, and a leader's followers stopped hearing from it: elections).
//!   A record that holds its state inline (written before the split) is
//!   read as it is.
//! - At start, a state older than the first log entry (`applied + 1 <
//!   first`) is restored from the stored snapshot (`Driver::new`). With the
//!   state and the log in one atomic batch this should not happen: a
//!   defensive check.

use protobuf::Message as _;
use raft::prelude::*;
use raft::{GetEntriesContext, RaftState, StorageError};

use crate::kv::{Batch, Kv, KvError};

pub(crate) const KEY_HARD_STATE: &[u8] = b"h";
pub(crate) const KEY_CONF_STATE: &[u8] = b"c";
pub(crate) const KEY_TRUNCATED: &[u8] = b"t";
pub(crate) const KEY_SNAPSHOT: &[u8] = b"p";
/// The stored snapshot's state bytes, apart from its record (module doc).
pub(crate) const KEY_SNAPSHOT_DATA: &[u8] = b"d";
pub(crate) const PREFIX_ENTRY: u8 = b'e';

pub fn entry_key(index: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(PREFIX_ENTRY);
    k.extend_from_slice(&index.to_be_bytes());
    k
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> KvError {
    KvError(format!("corrupt {what}: {e}"))
}

/// raft-rs storage backed by memory plus a durable [`Kv`].
pub struct RaftStore {
    hard_state: HardState,
    /// The in-memory hard state's commit index is newer than the stored one.
    commit_unstaged: bool,
    conf_state: ConfState,
    /// Index and term of the last entry removed by compaction or snapshot.
    truncated: (u64, u64),
    entries: Vec<Entry>,
    snapshot: Snapshot,
    /// raft-rs asked for a snapshot to send to a member that the stored
    /// one's configuration does not hold (a member added since): the driver
    /// makes a new one at its applied index.
    snapshot_wanted: std::cell::Cell<bool>,
}

impl RaftStore {
    /// Loads the Raft state from `kv`. A fresh store starts with `voters` as
    /// its configuration (every member of a new cluster is given the same).
    pub fn load(kv: &dyn Kv, voters: &[u64]) -> Result<Self, KvError> {
        let hard_state = match kv.get(KEY_HARD_STATE)? {
            Some(b) => HardState::parse_from_bytes(&b).map_err(|e| corrupt("hard state", e))?,
            None => HardState::default(),
        };
        let conf_state = match kv.get(KEY_CONF_STATE)? {
            Some(b) => ConfState::parse_from_bytes(&b).map_err(|e| corrupt("conf state", e))?,
            None => ConfState::from((voters.to_vec(), Vec::<u64>::new())),
        };
        let truncated = match kv.get(KEY_TRUNCATED)? {
            Some(b) if b.len() == 16 => (
                u64::from_be_bytes(b[..8].try_into().map_err(|e| corrupt("truncated", e))?),
                u64::from_be_bytes(b[8..].try_into().map_err(|e| corrupt("truncated", e))?),
            ),
            Some(_) => return Err(KvError("corrupt truncated marker".into())),
            None => (0, 0),
        };
        let mut snapshot = match kv.get(KEY_SNAPSHOT)? {
            Some(b) => Snapshot::parse_from_bytes(&b).map_err(|e| corrupt("snapshot", e))?,
            None => Snapshot::default(),
        };
        // A record written before the state moved to its own key holds it.
        if snapshot.data.is_empty() {
            if let Some(data) = kv.get(KEY_SNAPSHOT_DATA)? {
                snapshot.data = data.into();
            }
        }
        let mut entries = Vec::new();
        for (k, v) in kv.scan_prefix(&[PREFIX_ENTRY])? {
            let e = Entry::parse_from_bytes(&v).map_err(|e| corrupt("entry", e))?;
            if k != entry_key(e.index) {
                return Err(KvError(format!("entry {} stored under a wrong key", e.index)));
            }
            if e.index <= truncated.0 {
                continue; // left behind by a crash between truncation steps
            }
            if let Some(prev) = entries.last() {
                let prev: &Entry = prev;
                if prev.index + 1 != e.index {
                    return Err(KvError(format!("gap in log after {}", prev.index)));
                }
            } else if e.index != truncated.0 + 1 {
                return Err(KvError(format!("log starts at {} but truncated at {}", e.index, truncated.0)));
            }
            entries.push(e);
        }
        Ok(RaftStore {
            hard_state,
            commit_unstaged: false,
            conf_state,
            truncated,
            entries,
            snapshot,
            snapshot_wanted: Default::default(),
        })
    }

    /// True when `kv` holds no Raft state at all (a new data dir).
    pub fn is_fresh(kv: &dyn Kv) -> Result<bool, KvError> {
        Ok(kv.get(KEY_HARD_STATE)?.is_none()
            && kv.get(KEY_CONF_STATE)?.is_none()
            && kv.get(KEY_SNAPSHOT)?.is_none()
            && kv.scan_prefix(&[PREFIX_ENTRY])?.is_empty())
    }

    /// Starts a new cluster in a fresh `kv` (membership.rs, rule 1): a
    /// snapshot at index 1, term 1, whose configuration is `voters` and
    /// whose state is `state` (an empty state machine at index 1). The log
    /// starts at 2, so a member that joins later is sent a snapshot.
    pub fn found(kv: &dyn Kv, voters: &[u64], state: Vec<u8>) -> Result<(), KvError> {
        Self::found_at(kv, voters, 1, 1, state)
    }

    /// [`RaftStore::found`] at `index` and `term` (a restored backup).
    pub fn found_at(kv: &dyn Kv, voters: &[u64], index: u64, term: u64, state: Vec<u8>) -> Result<(), KvError> {
        let mut store = RaftStore::load(kv, voters)?;
        let mut snap = Snapshot { data: state.into(), ..Default::default() };
        snap.mut_metadata().index = index;
        snap.mut_metadata().term = term;
        snap.mut_metadata().set_conf_state(ConfState::from((voters.to_vec(), Vec::<u64>::new())));
        let mut batch = Batch::default();
        store.apply_snapshot(snap, &mut batch)?;
        kv.write(batch, true)
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// The configuration as last applied (voters, learners).
    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    pub fn first(&self) -> u64 {
        self.truncated.0 + 1
    }

    pub fn last(&self) -> u64 {
        self.entries.last().map(|e| e.index).unwrap_or(self.truncated.0)
    }

    /// Appends entries (overwriting any conflicting suffix) and stages them.
    pub fn append(&mut self, ents: &[Entry], batch: &mut Batch) -> Result<(), KvError> {
        let Some(first) = ents.first() else {
            return Ok(());
        };
        if first.index <= self.truncated.0 {
            return Err(KvError(format!(
                "append at {} overwrites compacted log (truncated at {})",
                first.index, self.truncated.0
            )));
        }
        if first.index > self.last() + 1 {
            return Err(KvError(format!("append at {} leaves a gap after {}", first.index, self.last())));
        }
        let old_last = self.last();
        let keep = (first.index - self.first()) as usize;
        self.entries.truncate(keep);
        for e in ents {
            batch.put(entry_key(e.index), e.write_to_bytes().map_err(|e| corrupt("entry", e))?);
        }
        let new_last = ents[ents.len() - 1].index;
        if old_last > new_last {
            batch.delete_range(entry_key(new_last + 1), entry_key(old_last + 1));
        }
        self.entries.extend_from_slice(ents);
        Ok(())
    }

    pub fn set_hard_state(&mut self, hs: HardState, batch: &mut Batch) -> Result<(), KvError> {
        self.commit_unstaged = false;
        batch.put(KEY_HARD_STATE, hs.write_to_bytes().map_err(|e| corrupt("hs", e))?);
        self.hard_state = hs;
        Ok(())
    }

    /// A Ready's hard state: staged when the term or vote changed (Raft
    /// needs those on disk before anyone hears of them); a change of the
    /// commit index alone is kept in memory and staged with the next
    /// checkpoint of the state ([`stage_commit`](Self::stage_commit)). A
    /// stored commit index that lags is safe (raft-rs learns it again from
    /// the leader); one below the stored applied index is not, hence the
    /// checkpoint rule.
    pub fn note_hard_state(&mut self, hs: HardState, batch: &mut Batch) -> Result<(), KvError> {
        if hs.term != self.hard_state.term || hs.vote != self.hard_state.vote {
            self.commit_unstaged = false;
            return self.set_hard_state(hs, batch);
        }
        self.commit_unstaged |= hs.commit != self.hard_state.commit;
        self.hard_state = hs;
        Ok(())
    }

    /// Stages the hard state if its commit index changed since it was last
    /// staged (with a checkpoint of the state: driver/ready.rs).
    pub fn stage_commit(&mut self, batch: &mut Batch) -> Result<(), KvError> {
        if std::mem::take(&mut self.commit_unstaged) {
            let hs = self.hard_state.clone();
            return self.set_hard_state(hs, batch);
        }
        Ok(())
    }

    pub fn set_commit(&mut self, commit: u64, batch: &mut Batch) -> Result<(), KvError> {
        let mut hs = self.hard_state.clone();
        hs.commit = commit;
        self.set_hard_state(hs, batch)
    }

    pub fn set_conf_state(&mut self, cs: ConfState, batch: &mut Batch) -> Result<(), KvError> {
        batch.put(KEY_CONF_STATE, cs.write_to_bytes().map_err(|e| corrupt("cs", e))?);
        self.conf_state = cs;
        Ok(())
    }

    fn stage_truncate(&mut self, index: u64, term: u64, batch: &mut Batch) {
        let mut v = index.to_be_bytes().to_vec();
        v.extend_from_slice(&term.to_be_bytes());
        batch.put(KEY_TRUNCATED, v);
        batch.delete_range(entry_key(0), entry_key(index + 1));
        self.entries.retain(|e| e.index > index);
        self.truncated = (index, term);
    }

    /// Stores `snap` (module doc, "Where a snapshot is stored"): its
    /// metadata as the record, its state under its own key, shared with
    /// the copy kept here.
    fn stage_snapshot(&mut self, snap: Snapshot, batch: &mut Batch) -> Result<(), KvError> {
        let mut record = Snapshot::default();
        record.set_metadata(snap.get_metadata().clone());
        batch.put(KEY_SNAPSHOT, record.write_to_bytes().map_err(|e| corrupt("snapshot", e))?);
        batch.put_shared(KEY_SNAPSHOT_DATA, snap.data.clone());
        self.snapshot = snap;
        Ok(())
    }

    /// Installs a snapshot received from the leader: the log is replaced.
    pub fn apply_snapshot(&mut self, snap: Snapshot, batch: &mut Batch) -> Result<(), KvError> {
        let meta = snap.get_metadata().clone();
        let last = self.last();
        if last > 0 {
            batch.delete_range(entry_key(0), entry_key(last + 1));
        }
        self.entries.clear();
        self.stage_truncate(meta.index, meta.term, batch);
        let mut hs = self.hard_state.clone();
        hs.term = hs.term.max(meta.term);
        hs.commit = hs.commit.max(meta.index);
        self.set_hard_state(hs, batch)?;
        self.set_conf_state(meta.get_conf_state().clone(), batch)?;
        self.stage_snapshot(snap, batch)
    }

    /// Records a snapshot of the state machine at `index` (already applied)
    /// and drops log entries up to `compact_to` (`<= index`).
    pub fn compact(&mut self, index: u64, data: Vec<u8>, compact_to: u64, batch: &mut Batch) -> Result<(), KvError> {
        let term = self.term_of(index)?;
        let mut snap = Snapshot { data: data.into(), ..Default::default() };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.conf_state.clone());
        self.stage_snapshot(snap, batch)?;
        let compact_to = compact_to.min(index);
        if compact_to > self.truncated.0 {
            let t = self.term_of(compact_to)?;
            self.stage_truncate(compact_to, t, batch);
        }
        Ok(())
    }

    /// The snapshot last made or installed.
    pub fn stored_snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// True (once) when raft-rs wanted a newer snapshot than the stored one.
    pub fn take_snapshot_wanted(&self) -> bool {
        self.snapshot_wanted.replace(false)
    }

    fn term_of(&self, idx: u64) -> Result<u64, KvError> {
        raft::Storage::term(self, idx).map_err(|e| KvError(format!("term of {idx}: {e}")))
    }
}

impl raft::Storage for RaftStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.truncated.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = (low - self.first()) as usize;
        let hi = (high - self.first()) as usize;
        let mut ents = self.entries[lo..hi].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.truncated.0 {
            return Ok(self.truncated.1);
        }
        let snap = self.snapshot.get_metadata();
        if idx == snap.index && snap.index > 0 {
            return Ok(snap.term);
        }
        if idx < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entries[(idx - self.first()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let cs = self.snapshot.get_metadata().get_conf_state();
        let holds = cs.voters.iter().chain(&cs.learners).chain(&cs.voters_outgoing).any(|&m| m == to);
        if !holds {
            self.snapshot_wanted.set(true);
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        if self.snapshot.get_metadata().index < request_index.max(1) {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MemKv;
    use raft::Storage;

    fn ent(index: u64, term: u64) -> Entry {
        Entry { index, term, ..Default::default() }
    }

    #[test]
    fn append_compact_reload() {
        let kv = MemKv::default();
        let mut s = RaftStore::load(&kv, &[1, 2, 3]).unwrap();
        let mut b = Batch::default();
        s.append(&(1..=10).map(|i| ent(i, 1)).collect::<Vec<_>>(), &mut b).unwrap();
        // Overwrite a conflicting suffix.
        s.append(&[ent(8, 2), ent(9, 2)], &mut b).unwrap();
        kv.write(b, true).unwrap();
        assert_eq!(s.last(), 9);
        assert_eq!(s.term(9).unwrap(), 2);

        let mut b = Batch::default();
        s.compact(8, b"state".to_vec(), 5, &mut b).unwrap();
        kv.write(b, true).unwrap();
        assert_eq!(s.first(), 6);
        assert_eq!(s.term(5).unwrap(), 1);
        assert!(matches!(
            s.entries(3, 6, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert_eq!(s.snapshot(0, 2).unwrap().get_metadata().index, 8);

        let r = RaftStore::load(&kv, &[1, 2, 3]).unwrap();
        assert_eq!((r.first(), r.last()), (6, 9));
        assert_eq!(r.term(8).unwrap(), 2);
        assert_eq!(&r.snapshot(0, 2).unwrap().data[..], b"state");
        assert_eq!(r.initial_state().unwrap().conf_state.voters, vec![1, 2, 3]);
    }

    #[test]
    fn a_stored_snapshot_shares_its_state_and_copies_nothing() {
        let kv = MemKv::default();
        let mut s = RaftStore::load(&kv, &[1, 2, 3]).unwrap();
        let mut b = Batch::default();
        s.append(&(1..=4).map(|i| ent(i, 1)).collect::<Vec<_>>(), &mut b).unwrap();
        kv.write(b, true).unwrap();
        let state = vec![7u8; 1 << 20];
        let mut b = Batch::default();
        s.compact(4, state, 2, &mut b).unwrap();
        let kept = s.stored_snapshot().data.clone();
        let mut record = None;
        let mut shared = None;
        for op in &b.ops {
            match op {
                crate::kv::BatchOp::Put(k, v) if k == KEY_SNAPSHOT => record = Some(v.len()),
                crate::kv::BatchOp::PutShared(k, v) if k == KEY_SNAPSHOT_DATA => shared = Some(v.clone()),
                _ => {}
            }
        }
        let record = record.expect("the snapshot's record is staged");
        assert!(record < 100, "the record holds the state ({record} bytes): the driver encoded a copy");
        let shared = shared.expect("the state is staged under its own key");
        assert_eq!(shared.as_ptr(), kept.as_ptr(), "the staged state is a copy, not the kept bytes");
        kv.write(b, true).unwrap();
        let r = RaftStore::load(&kv, &[1, 2, 3]).unwrap();
        assert_eq!(r.stored_snapshot().data.len(), 1 << 20);
        assert_eq!(r.stored_snapshot().get_metadata().index, 4);
    }

    #[test]
    fn a_record_with_its_state_inline_still_loads() {
        let kv = MemKv::default();
        let mut snap = Snapshot { data: b"old state".to_vec().into(), ..Default::default() };
        snap.mut_metadata().index = 9;
        snap.mut_metadata().term = 2;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        let mut b = Batch::default();
        b.put(KEY_SNAPSHOT, snap.write_to_bytes().unwrap());
        kv.write(b, true).unwrap();
        let r = RaftStore::load(&kv, &[1, 2, 3]).unwrap();
        assert_eq!(&r.stored_snapshot().data[..], b"old state");
        assert_eq!(r.stored_snapshot().get_metadata().index, 9);
    }

    #[test]
    fn install_snapshot_replaces_log() {
        let kv = MemKv::default();
        let mut s = RaftStore::load(&kv, &[1, 2, 3]).unwrap();
        let mut b = Batch::default();
        s.append(&[ent(1, 1), ent(2, 1)], &mut b).unwrap();
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 50;
        snap.mut_metadata().term = 3;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        s.apply_snapshot(snap, &mut b).unwrap();
        kv.write(b, true).unwrap();
        let r = RaftStore::load(&kv, &[1, 2, 3]).unwrap();
        assert_eq!((r.first(), r.last()), (51, 50));
        assert_eq!(r.term(50).unwrap(), 3);
        assert_eq!(r.hard_state().commit, 50);
    }
}
