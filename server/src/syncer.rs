//! The storage writer: one thread that takes every batch the driver queued
//! since its last write, writes them as one RocksDB batch, synced if any of
//! them must be (a group commit across Readies), and reports back.
//!
//! Invariants:
//! - All writes go through it, so they reach the WAL in the order the
//!   driver made them, and a crash loses only a suffix.
//! - A Ready's `after` messages (votes, append acks) are handed back only
//!   once its batch is on disk; the driver sends them then.
//! - A failed write stops the thread; the driver then stops the member
//!   (it cannot know what reached the disk).
//!
//! Why the unsynced writes (a Ready without new entries, term, vote or
//! snapshot: commit index and applied state only; see driver/ready.rs) are
//! safe:
//! - Raft needs log entries and the hard state (term, vote) on disk before
//!   anyone is told about them. Those are always in a synced write, and the
//!   messages that tell go out only after it is done.
//! - The commit index and the applied state can be rebuilt from the log.
//!   The state and its applied index are in the same atomic batch, so after
//!   a crash they agree; raft-rs starts at the stored applied index and the
//!   entries after it are applied again.
//! - RocksDB writes every batch to one write-ahead log, in order, and
//!   recovers a prefix of it. An unsynced batch is durable as soon as any
//!   later synced batch is; if it is lost, every batch after it is lost
//!   too. A surviving state is never newer than the surviving log, commit
//!   index or configuration.
//!
//! A `kill -9` of the process loses nothing written: unsynced writes are
//! already in the operating system's page cache. The argument above is
//! for power loss.
//!
//! A synced write that takes [`SLOW_SYNC`] or more is logged (warn), with
//! its time, so a latency spike can be matched to the disk (and to
//! RocksDB's own LOG: memtable flushes, compactions).
//!
//! Snapshots off the driver: a job marked `snapshot` (its batch holds a
//! state checkpoint, driver/ready.rs) is written on its own, not merged
//! with the jobs after it; then the syncer hands the store to the
//! snapshot thread, which takes a read view of it ([`Kv::with_view`]: a
//! RocksDB snapshot) and says so before the syncer writes anything else.
//! The view is therefore exactly the checkpoint, however long the thread
//! then takes to encode it (~1-2 s at a million nodes); it sends the bytes
//! to the driver as `Input::SnapshotBuilt`. Meanwhile the syncer writes on
//! and the driver ticks, applies and answers.
//!
//! A backup (`baton snapshot save`, backup.rs) is built the same way: a job
//! marked `backup` holds a checkpoint of the state as applied when the
//! backup was asked for, and the thread encodes that view as the backup
//! (`StateMachine::backup_from_store`: no session secrets or replies) with
//! its SHA-256, sent as `Input::BackupBuilt`. The driver asks for at most
//! one of the two at a time, so the syncer never waits for the thread to
//! finish a build before it can take the next view.
//!
//! The driver sees only the [`Persist`] trait: the simulator implements it
//! with a queue it drains on its own schedule (a crash drops what was not
//! yet "written").

use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raft::prelude::Message;
use tracing::warn;

use crate::kv::{Batch, Kv};
use crate::message::{Input, InputTx};

/// One Ready's writes.
pub struct SyncJob {
    /// The Ready's number (0: nothing raft-rs waits for).
    pub number: u64,
    pub batch: Batch,
    pub sync: bool,
    /// Messages to send once the batch is on disk.
    pub after: Vec<Message>,
    /// Build a snapshot of the store as this write leaves it (module doc).
    pub snapshot: bool,
    /// Build a backup of the store as this write leaves it (module doc).
    pub backup: bool,
}

impl SyncJob {
    /// A write that nothing waits for and that asks for no build.
    pub fn plain(batch: Batch) -> SyncJob {
        SyncJob { number: 0, batch, sync: false, after: Vec::new(), snapshot: false, backup: false }
    }
}

/// A snapshot built from the store (module doc), or why not.
pub type Built = Result<BuiltSnapshot, String>;

/// The state checkpointed at `index`, encoded, and how long that took.
pub struct BuiltSnapshot {
    pub index: u64,
    pub data: Vec<u8>,
    pub took: Duration,
}

/// Builds a snapshot from `view` (the simulator calls it too).
pub fn build_snapshot(view: &dyn crate::kv::KvView) -> Built {
    let t = std::time::Instant::now();
    let (index, data) = crate::state::StateMachine::snapshot_from_store(view).map_err(|e| e.to_string())?;
    Ok(BuiltSnapshot { index, data, took: t.elapsed() })
}

/// A backup built from the store, or why not.
pub type BuiltBackup = Result<(BuiltSnapshot, Vec<u8>), String>;

/// Builds a backup from `view` and its SHA-256 (the simulator calls it
/// too).
pub fn build_backup(view: &dyn crate::kv::KvView) -> BuiltBackup {
    let t = std::time::Instant::now();
    let (index, data) = crate::state::StateMachine::backup_from_store(view).map_err(|e| e.to_string())?;
    let sha = crate::backup::sha256(&data);
    Ok((BuiltSnapshot { index, data, took: t.elapsed() }, sha))
}

/// A finished write: the highest Ready number in it, and the messages that
/// waited for it.
pub struct Synced {
    pub number: u64,
    pub after: Vec<Message>,
}

/// Where the driver queues its writes.
pub trait Persist: Send {
    fn submit(&mut self, job: SyncJob);
    /// Finishes the queued writes and stops (shutdown).
    fn stop(&mut self);
    /// Bytes the store takes on disk (status, metrics); 0 if unknown.
    fn db_bytes(&self) -> u64 {
        0
    }
}

/// A synced write this slow is logged (module doc).
pub const SLOW_SYNC: Duration = Duration::from_millis(50);

/// The syncer thread's submit side (owned by the driver).
pub struct Syncer {
    jobs: Option<Sender<SyncJob>>,
    kv: Arc<dyn Kv>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The syncer thread's report side (owned by the runtime loop).
pub struct SyncReports {
    done: Receiver<anyhow::Result<Synced>>,
}

impl Syncer {
    /// Starts the thread; `wake` is told `Input::Persisted` after each write.
    pub fn start(kv: Arc<dyn Kv>, wake: InputTx) -> (Syncer, SyncReports) {
        let keep = kv.clone();
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<SyncJob>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let builder = SnapshotThread::start(kv.clone(), wake.clone());
        let wake = Arc::new(Mutex::new(wake));
        let thread = std::thread::Builder::new()
            .name("baton-syncer".into())
            .spawn(move || {
                while let Ok(first) = jobs_rx.recv() {
                    // Merge what is queued, up to and with a build's job.
                    let (mut snapshot, mut backup) = (first.snapshot, first.backup);
                    let mut jobs = vec![first];
                    while !snapshot && !backup {
                        let Ok(j) = jobs_rx.try_recv() else { break };
                        (snapshot, backup) = (j.snapshot, j.backup);
                        jobs.push(j);
                    }
                    let mut batch = Batch::default();
                    let mut sync = false;
                    let mut number = 0;
                    let mut after = Vec::new();
                    for j in jobs {
                        batch.ops.extend(j.batch.ops);
                        sync |= j.sync;
                        number = number.max(j.number);
                        after.extend(j.after);
                    }
                    let t = std::time::Instant::now();
                    let ops = batch.ops.len();
                    let r = if batch.is_empty() { Ok(()) } else { kv.write(batch, sync) };
                    if sync && r.is_ok() {
                        let took = t.elapsed();
                        crate::metrics::fsync(took);
                        if took >= SLOW_SYNC {
                            warn!(
                                ms = took.as_millis() as u64,
                                ops, "a synced write took long (disk or RocksDB stall)"
                            );
                        }
                    }
                    let failed = r.is_err();
                    if (snapshot || backup) && !failed {
                        builder.view_now(snapshot, backup);
                    }
                    let out = r.map(|_| Synced { number, after }).map_err(anyhow::Error::from);
                    if done_tx.send(out).is_err() {
                        return;
                    }
                    let _ = wake.lock().unwrap_or_else(|p| p.into_inner()).send(Input::Persisted);
                    if failed {
                        return;
                    }
                }
            })
            .ok();
        (Syncer { jobs: Some(jobs_tx), kv: keep, thread }, SyncReports { done: done_rx })
    }
}

/// The thread that builds snapshots from the store (module doc).
struct SnapshotThread {
    /// A view to take now, and what to build from it (a snapshot, a
    /// backup); the thread answers once it holds the view.
    asks: Option<Sender<(Sender<()>, bool, bool)>>,
    /// To tell the driver when there is no thread to ask.
    wake: InputTx,
}

impl SnapshotThread {
    fn start(kv: Arc<dyn Kv>, wake: InputTx) -> SnapshotThread {
        let (asks_tx, asks_rx) = std::sync::mpsc::channel::<(Sender<()>, bool, bool)>();
        let to_driver = wake.clone();
        let spawned = std::thread::Builder::new().name("baton-snapshot".into()).spawn(move || {
            while let Ok((held, snapshot, backup)) = asks_rx.recv() {
                let mut built = Err("no view was taken".to_string());
                let mut backed = Err("no view was taken".to_string());
                kv.with_view(&mut |view| {
                    let _ = held.send(());
                    if snapshot {
                        built = build_snapshot(view);
                    }
                    if backup {
                        backed = build_backup(view);
                    }
                });
                if snapshot && to_driver.send(Input::SnapshotBuilt(Box::new(built))).is_err() {
                    return;
                }
                if backup && to_driver.send(Input::BackupBuilt(Box::new(backed))).is_err() {
                    return;
                }
                crate::memory::release();
            }
        });
        match spawned {
            Ok(_) => SnapshotThread { asks: Some(asks_tx), wake },
            Err(e) => {
                warn!(error = %e, "no snapshot thread: snapshots will not be made");
                SnapshotThread { asks: None, wake }
            }
        }
    }

    /// Has the thread take its view of the store now, and waits until it
    /// has (no write may come between).
    fn view_now(&self, snapshot: bool, backup: bool) {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        match &self.asks {
            Some(asks) if asks.send((held_tx, snapshot, backup)).is_ok() => {
                let _ = held_rx.recv();
            }
            _ => {
                if snapshot {
                    let _ = self.wake.send(Input::SnapshotBuilt(Box::new(Err("no snapshot thread".into()))));
                }
                if backup {
                    let _ = self.wake.send(Input::BackupBuilt(Box::new(Err("no snapshot thread".into()))));
                }
            }
        }
    }
}

impl Persist for Syncer {
    fn submit(&mut self, job: SyncJob) {
        if job.batch.is_empty() && job.after.is_empty() && job.number == 0 {
            return;
        }
        if let Some(j) = &self.jobs {
            let _ = j.send(job);
        }
    }

    fn db_bytes(&self) -> u64 {
        self.kv.size_bytes()
    }

    fn stop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl SyncReports {
    /// A finished write, if any (an error stops the member).
    pub fn poll(&mut self) -> anyhow::Result<Option<Synced>> {
        match self.done.try_recv() {
            Ok(r) => r.map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => anyhow::bail!("storage writer stopped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateMachine;
    use std::time::Instant;

    /// The state checkpointed at `index`, as a Ready's job would carry it.
    fn job(sm: &mut StateMachine, index: u64, snapshot: bool) -> SyncJob {
        sm.skip(index);
        let mut batch = Batch::default();
        sm.flush(&mut batch);
        SyncJob { number: index, batch, sync: false, after: Vec::new(), snapshot, backup: false }
    }

    /// A snapshot job's write is not merged with the one queued after it,
    /// and the view is taken before that one is written: the snapshot is
    /// the state at its own checkpoint.
    #[test]
    fn a_snapshot_is_built_from_the_store_as_its_own_write_left_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kv: Arc<dyn Kv> = Arc::new(crate::kv::RocksKv::open(dir.path()).expect("open"));
        let (wake_tx, mut wake_rx) = tokio::sync::mpsc::unbounded_channel();
        let (mut syncer, _reports) = Syncer::start(kv, wake_tx);
        let mut sm = StateMachine::new();
        for round in 0..20u64 {
            let first = job(&mut sm, 2 * round + 1, true);
            let expected = sm.snapshot();
            let second = job(&mut sm, 2 * round + 2, false);
            syncer.submit(first);
            syncer.submit(second);
            let deadline = Instant::now() + Duration::from_secs(10);
            let built = loop {
                match wake_rx.try_recv() {
                    Ok(Input::SnapshotBuilt(b)) => break b.expect("built"),
                    Ok(_) => continue,
                    Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                    Err(e) => panic!("round {round}: no snapshot came: {e}"),
                }
            };
            assert_eq!(built.index, 2 * round + 1, "round {round}");
            assert!(built.data == expected, "round {round}: the snapshot is not the checkpoint's state");
        }
        syncer.stop();
    }
}
