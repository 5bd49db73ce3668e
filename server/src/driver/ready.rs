//! The Ready handling, in the order raft-rs documents for async readies;
//! and what follows a finished write (`on_persisted`).
//!
//! | Step | Code |
//! |---|---|
//! | 1. Soft state changed: note leader, role and term; fail pending writes on a change | `on_soft_state` |
//! | 2. Send `messages` (a leader's appends and heartbeats, sent *before* it persists: its fsync and the followers' overlap, Raft thesis 10.2.1) | `send_messages` |
//! | 3. Install the snapshot, if any (state restored in memory, store staged) | `install_snapshot` |
//! | 4. Hand ReadIndex results to the reads waiting for them | `Reads::on_read_states` |
//! | 5. Apply committed entries; replies and watch events are queued here | `apply_entries` |
//! | 6. Stage new log entries (the in-memory store has them at once) | `RaftStore::append` |
//! | 7. Stage the hard state if the term or vote changed (a new commit index waits for step 8) | `RaftStore::note_hard_state` |
//! | 8. When due, stage the state machine's changed keys with the applied index and the commit index; when a compaction is due, mark the write for a snapshot (below) | `StateMachine::flush`, `RaftStore::stage_commit`, `state_flush_due`, `compaction_due` |
//! | 9. Send forwarded proposals, ReadIndex requests and heartbeat answers at once (below); `advance_append_async`; queue the batch, its `sync` flag and the other persisted messages to the syncer, or finish at once a Ready with nothing to write (below) | `Persist::submit`, `on_persisted` |
//! | 10. Tell raft-rs what is applied, at most `min(committed, persisted)` | `advance_applied` |
//!
//! When the syncer reports the batch written, `on_persisted` sends the
//! messages that waited for it (on a follower, all but the three kinds
//! below: append and vote responses among them),
//! calls `on_persist_ready` and advances the applied index; the next Ready
//! carries what became committed. Committed entries come only out of a
//! Ready (the async mode has no `LightReady`).
//!
//! Rules:
//! - A Ready with nothing to write (an empty batch: no entries, no term or
//!   vote, no snapshot, no state flush due) is finished in the same turn,
//!   without the syncer, when every earlier Ready's write has been
//!   reported (`Io::queued == Io::written`): its persisted messages (a
//!   follower's answer to an append that only moved the commit index, a
//!   rejection hint) speak of a log that is then wholly on disk, and
//!   `on_persist_ready` for it only retires its record. Otherwise it goes
//!   to the syncer behind the writes before it, as every Ready did before
//!   (the order of `on_persist_ready` numbers must hold). That is most
//!   Readies of an unbatched commit (the leader's that commits, each
//!   follower's that learns the commit): each was a hand-off to the syncer
//!   thread and back for nothing (issue 26; docs/perf/per-op.md).
//! - The batch is synced when the Ready has new entries, a changed term or
//!   vote (`must_sync`) or a snapshot: Raft needs those on disk before
//!   anyone hears of them, and the messages that announce them wait for the
//!   syncer. A Ready with only commits and messages costs no fsync. The
//!   applied state, the applied index and a configuration change applied in
//!   this Ready ride in the same batch (one atomic write), synced or not:
//!   they can be rebuilt from the log (syncer.rs says why an unsynced write
//!   is safe).
//! - The state is written in coalesced batches. The log entries are the
//!   record; the state's keys on disk are a checkpoint of it that saves
//!   replaying the whole log at start. A Ready stages the changed keys
//!   (`StateMachine::flush`) only when [`STATE_FLUSH_EVERY`] has passed
//!   since the last time, when [`STATE_FLUSH_KEYS`] keys are waiting, and
//!   always when it applied a configuration change or installed a snapshot
//!   (`must_flush`: raft-rs's `ConfState` is stored as it is applied, and
//!   the state beside it must not be older) or makes a snapshot. A key
//!   written many times in between (a session record on every write, a
//!   client's own key) reaches RocksDB once: the memtable inserts were the
//!   largest cost of a write (docs/perf/). The state and the applied index
//!   on disk stay together (one batch), so after a restart raft-rs hands
//!   out the entries after the stored applied index again, as it does
//!   after a lost unsynced write (syncer.rs); they are still in the log:
//!   compaction keeps every entry after the last checkpoint because a
//!   snapshot is made only together with one.
//! - On a follower raft-rs files *every* message as persisted (to be sent
//!   after the write). Forwarded proposals (`MsgPropose`), ReadIndex
//!   requests (`MsgReadIndex`) and answers to heartbeats
//!   (`MsgHeartbeatResponse`) carry nothing this member persisted, so they
//!   are sent at once, not behind the fsync. A heartbeat's answer says
//!   only "I am at your term and saw no higher one": the leader counts it
//!   for liveness (`check_quorum`) and to confirm a ReadIndex, neither of
//!   which rests on this member's disk (votes and entries do, and their
//!   answers still wait). Held behind a long write (a 143 MB snapshot
//!   stored, ~600 ms), they let a leader that had one live follower step
//!   down for want of a quorum (docs/scaling.md, "Snapshots during a
//!   1M-node fill").
//! - Replies and events are queued while applying, before the Ready's write
//!   is on disk. That is safe: raft-rs hands out an entry for apply only
//!   once it is committed *and* persisted in this member's own log, and the
//!   state it produces can be rebuilt from the log.
//! - The reply to a write goes to the member that proposed it, matched by
//!   `(origin, request_id)` in the entry; every other member applies the
//!   entry and answers nobody.
//!
//! Snapshots off the driver: when a Ready finds a compaction due
//! (`compaction_due`), it stages a state checkpoint (the state's keys and
//! the applied index A) and marks its write `snapshot`; the syncer writes
//! it on its own and has the snapshot thread take a RocksDB view right
//! after (syncer.rs), and that thread encodes the checkpoint's records as
//! the snapshot at A (`StateMachine::snapshot_from_store`: the same bytes
//! the state at A makes). Its answer (`Input::SnapshotBuilt`) stores the
//! snapshot and truncates the log up to `A - snapshot_entries / 4`, in a
//! write of its own; it is dropped if the store moved past A meanwhile (a
//! snapshot installed) or the configuration changed since it was asked
//! for (the snapshot would carry the wrong one: the next Ready asks again).
//! One is built at a time. The driver goes on ticking, applying and
//! answering while it is built: at a million nodes that took ~2 s of the
//! driver, with no heartbeat sent. The log still holds every entry
//! after the last checkpoint (A is one), so the rule above holds. The
//! snapshot a new member needs (`snapshot_now`: the stored one's
//! configuration does not hold it) is built the same way from a checkpoint
//! staged at the end of a turn, and stored without dropping log entries.
//! A backup is built the same way, from a checkpoint staged when it is
//! asked for (driver/requests.rs `take_backup`); a member builds one thing
//! at a time, so no compaction starts while a backup is built.
//!
//! Installing a snapshot (a follower too far behind): `StateMachine::restore`
//! replaces the whole state (all of it staged for the write),
//! `RaftStore::apply_snapshot` replaces the log, and every watch of this
//! member is checked for what it missed (watches.rs). raft-rs gives no
//! committed entries in a Ready that has a snapshot, and the applied index
//! reported to raft-rs stays at most the persisted one until the syncer
//! confirms the write.

use super::*;
use crate::membership;

/// At most this long between two writes of the state's changed keys.
pub const STATE_FLUSH_EVERY: Duration = Duration::from_millis(1000);
/// Or as soon as this many keys are waiting.
pub const STATE_FLUSH_KEYS: usize = 10_000;

impl Driver {
    pub(super) fn handle_ready(&mut self, now: Instant) -> anyhow::Result<()> {
        let mut rd = self.raw.ready();
        let mut batch = Batch::default();
        // New entries, a snapshot or a changed term/vote must be on disk
        // before anyone hears that we have them; a Ready with only commits
        // and messages needs no fsync.
        let must_sync = rd.must_sync() || !rd.snapshot().is_empty();

        if let Some(ss) = rd.ss() {
            self.on_soft_state(ss.leader_id, ss.raft_state, now);
        }
        // Messages the leader may send before persisting (thesis 10.2.1).
        self.send_messages(rd.take_messages());
        if !rd.snapshot().is_empty() {
            self.install_snapshot(rd.snapshot().clone(), &mut batch)?;
        }
        self.reads.on_read_states(&rd.take_read_states());
        // Committed entries come only once they are persisted here too.
        let committed = rd.take_committed_entries();
        crate::metrics::ready(rd.entries().len(), committed.len());
        let conf_changed = self.apply_entries(committed, now, &mut batch)?;
        if !rd.entries().is_empty() {
            self.raw.mut_store().append(rd.entries(), &mut batch)?;
            if self.cfg.faults.ack_before_commit() {
                self.ack_early(rd.entries());
            }
        }
        if let Some(hs) = rd.hs() {
            self.raw.mut_store().note_hard_state(hs.clone(), &mut batch)?;
        }
        // A snapshot is built off this thread from the checkpoint staged
        // here (module doc, "Snapshots off the driver").
        let compacting = self.snapshot_building.is_none() && self.backup_building.is_none() && self.compaction_due();
        if conf_changed || compacting || self.state_flush_due(now) {
            self.sm_mut().flush(&mut batch);
            self.raw.mut_store().stage_commit(&mut batch)?;
            self.clock.state_flushed = now;
        }
        if compacting {
            self.snapshot_building = Some(self.raw.store().conf_state().clone());
        }
        let number = rd.number();
        // On a follower raft-rs files every message as "after persisting".
        // Forwarded proposals, ReadIndex requests and heartbeat answers
        // carry nothing this member persisted: send them now rather than
        // behind an fsync (module doc).
        let (at_once, after): (Vec<Message>, Vec<Message>) = rd.take_persisted_messages().into_iter().partition(|m| {
            matches!(
                m.get_msg_type(),
                MessageType::MsgPropose | MessageType::MsgReadIndex | MessageType::MsgHeartbeatResponse
            )
        });
        self.send_messages(at_once);
        // The store already holds the new entries in memory (raft-rs reads
        // them from there); the syncer makes them durable in order, and
        // `on_persisted` sends `after` and reports the number once it has.
        self.raw.advance_append_async(rd);
        if batch.is_empty() && !must_sync && !compacting && self.io.queued == self.io.written {
            // Nothing to write, and every earlier Ready is on disk: what
            // its messages say is durable already (module doc, "A Ready
            // with nothing to write").
            self.on_persisted(Synced { number, after });
            return Ok(());
        }
        let job = SyncJob { number, batch, sync: must_sync, after, snapshot: compacting, backup: false };
        self.io.queued = self.io.queued.max(number);
        self.io.persist.submit(job);
        self.advance_applied();
        Ok(())
    }

    /// Tells raft-rs what is applied, as far as it allows (a snapshot
    /// installed but not yet persisted is reported once it is).
    pub(super) fn advance_applied(&mut self) {
        let log = &self.raw.raft.raft_log;
        let cap = log.committed.min(log.persisted);
        let applied = self.sm().applied().min(cap);
        if applied > self.raw.raft.raft_log.applied {
            self.raw.advance_apply_to(applied);
        }
    }

    /// A write the syncer finished: send what waited for it.
    pub fn on_persisted(&mut self, done: Synced) {
        self.io.written = self.io.written.max(done.number);
        self.send_messages(done.after);
        if done.number > 0 {
            self.raw.on_persist_ready(done.number);
        }
        self.advance_applied();
    }

    pub(super) fn on_soft_state(&mut self, leader: u64, role: StateRole, now: Instant) {
        let term = self.raw.raft.term;
        let was_leader = self.soft.role == StateRole::Leader;
        let is_leader = role == StateRole::Leader;
        if leader != self.soft.leader || term != self.soft.term || was_leader != is_leader {
            if leader != self.soft.leader {
                info!(leader, term, ?role, "leader changed");
                crate::metrics::leader_changed();
            }
            // Forwarded proposals may be lost with the old leader.
            let mut acts = self.pending.leader_changed();
            // ReadIndex requests go to the new leader.
            self.reads.requeue();
            self.duties = LeaderDuties::default();
            acts.extend(self.sessions.leader_changed());
            if is_leader {
                // raft-rs appended this term's first (empty) entry on
                // becoming leader: applying up to here means every earlier
                // expiry is known.
                let term_start = self.raw.raft.raft_log.last_index();
                info!(term, term_start, "became leader");
                acts.extend(self.sessions.become_leader(term, term_start, now));
            }
            self.execute(acts, now);
        }
        if leader != self.soft.leader {
            self.soft.leader_contact = now;
        }
        self.soft.leader = leader;
        self.soft.term = term;
        self.soft.role = role;
    }

    pub(super) fn send_messages(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            let to = m.to;
            self.io.peers.send(to, PeerOut::Raft(Box::new(m)));
        }
    }

    pub(super) fn install_snapshot(&mut self, snap: Snapshot, batch: &mut Batch) -> anyhow::Result<()> {
        let index = snap.get_metadata().index;
        info!(index, bytes = snap.data.len(), "installing snapshot");
        // The clock is read for the metric only (nothing decides on it).
        let t = std::time::Instant::now();
        self.sm_mut().restore(&snap.data)?;
        crate::metrics::snapshot("installed", t.elapsed());
        self.raw.mut_store().apply_snapshot(snap, batch)?;
        // The settings the snapshot carries are followed at once, as an
        // applied settings entry's are (apply_command), not a tick later.
        let settings = crate::settings::effective(self.sm().cluster().settings.as_ref(), &self.cfg);
        self.followed.current = settings;
        // Watches registered before may have missed changes in between.
        let st = self.state();
        let sm = read(&st);
        for f in self.watches.after_snapshot(&sm) {
            if self.visible(&sm, &f) {
                self.send_event(&f, index);
            }
        }
        drop(sm);
        self.members_changed();
        crate::memory::release();
        Ok(())
    }

    /// Applies committed entries; true if one was a configuration change
    /// (its `ConfState` is staged in `batch`, so the state goes with it).
    pub(super) fn apply_entries(
        &mut self,
        entries: Vec<Entry>,
        now: Instant,
        batch: &mut Batch,
    ) -> anyhow::Result<bool> {
        let mut conf_changed = false;
        for e in entries {
            if e.index <= self.sm().applied() {
                continue;
            }
            match e.entry_type {
                EntryType::EntryNormal if e.data.is_empty() => self.sm_mut().skip(e.index),
                EntryType::EntryNormal => self.apply_command(e.index, &e.data, now),
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    self.apply_conf_entry(&e, batch)?;
                    conf_changed = true;
                }
            }
        }
        Ok(conf_changed)
    }

    /// Whether this Ready stages the state machine's changed keys (rule
    /// "the state is written in coalesced batches" above).
    fn state_flush_due(&self, now: Instant) -> bool {
        let sm = self.sm();
        sm.must_flush()
            || sm.dirty_keys() >= STATE_FLUSH_KEYS
            || now.saturating_duration_since(self.clock.state_flushed) >= STATE_FLUSH_EVERY
    }

    pub(super) fn apply_command(&mut self, index: u64, data: &[u8], now: Instant) {
        let cmd = match Command::decode(data) {
            Ok(c) => c,
            Err(e) => {
                // Every member decodes the same bytes the same way: skipping
                // is deterministic.
                error!(index, "undecodable entry skipped: {e}");
                self.sm_mut().skip(index);
                return;
            }
        };
        // The write lock is held until the events and the reply are queued:
        // a listener's local read that sees this entry is answered after
        // them on the same connection (ZooKeeper's order: the event first).
        // Nothing below may lock the state again on this thread.
        if let Some(command::Body::Member(m)) = &cmd.body {
            // membership.rs rule 6: only members of the configuration.
            if membership::ids(self.raw.store().conf_state()).contains(&m.id) {
                self.sm_mut().set_member(index, m);
            } else {
                self.sm_mut().skip(index);
            }
            self.members_changed();
            return;
        }
        let shared = self.state();
        let mut sm = shared.write().unwrap_or_else(|p| p.into_inner());
        let applied = sm.apply(index, &cmd);
        let settings_changed = match &cmd.body {
            Some(command::Body::Cluster(_)) => true,
            Some(command::Body::Write(w)) => matches!(w.op, Some(baton_proto::client_write::Op::SetSettings(_))),
            _ => false,
        };
        if settings_changed {
            // From the guard held: nothing here may lock the state again.
            self.followed.current = crate::settings::effective(sm.cluster().settings.as_ref(), &self.cfg);
        }
        crate::metrics::lock_changes(&sm, &applied.changes);
        for ch in &applied.changes {
            for f in self.watches.fire(ch, &sm) {
                if self.visible(&sm, &f) {
                    self.send_event(&f, index);
                }
            }
        }
        self.note_sessions(index, &cmd, &applied.ended_sessions, now);
        if cmd.origin == self.cfg.id {
            self.answer_own(cmd.request_id, applied.reply, index, &sm);
        }
    }

    /// The session layer's and the simulator's side of an applied entry:
    /// sessions it ended or created, expiries it applied.
    fn note_sessions(&mut self, index: u64, cmd: &Command, ended: &[u64], now: Instant) {
        for sid in ended {
            self.sessions.ended(*sid);
        }
        match &cmd.body {
            Some(command::Body::NewSession(ns)) => self.sessions.created(index, ns.timeout_ms, now),
            Some(command::Body::Expire(_)) => {
                crate::metrics::expirations(ended.len());
                if let Some(log) = self.observers.expiries.as_mut() {
                    log.push(AppliedExpiry { index, sessions: ended.to_vec() });
                }
            }
            _ => {}
        }
    }

    /// The reply to this member's own entry `rid`, if a client waits for
    /// it (a new session binds its connection). Locks nothing: it runs
    /// under the state's write lock.
    fn answer_own(&mut self, rid: u64, reply: Option<Response>, index: u64, sm: &StateMachine) {
        let (Some(p), Some(mut resp)) = (self.pending.take(rid), reply) else { return };
        resp.id = p.client_id;
        if p.first_watch != 0 && resp.error == 0 {
            if let Some(response::Body::Create(c)) = resp.body.as_mut() {
                self.set_first_watch(p.conn, p.first_watch, c, sm);
            }
        }
        if p.bind_session && resp.error == 0 {
            if let (Some(c), Some(response::Body::CreateSession(cs))) = (self.conns.get_mut(&p.conn), &resp.body) {
                c.session = Some(cs.session_id);
                c.secret = cs.secret.clone();
            }
        }
        self.deliver(Effect::Respond { conn: p.conn, resp }, index);
    }

    /// A create asked for a FIRST watch (watches.rs, "The pushed grant"):
    /// its answer names the new node's predecessor, and unless the node is
    /// first (or gone, or the connection is, or at its watch cap: the
    /// client then asks with a read) the watch is registered now, at the
    /// state that holds the node.
    fn set_first_watch(&mut self, conn: ConnId, watch_id: u64, c: &mut baton_proto::CreateResp, sm: &StateMachine) {
        if sm.stat_of(&c.path).is_none() || !self.conns.contains_key(&conn) {
            return;
        }
        if self.cfg.faults.grant_without_predecessor() {
            // Deliberate bug: every new queue node is told it is first.
            c.first = true;
            return;
        }
        let Some(pred) = crate::watches::predecessor(sm, &c.path) else {
            c.first = true;
            return;
        };
        c.predecessor = pred;
        if self.watch_room(conn, 1).is_err() {
            return;
        }
        let spec = WatchSpec {
            watch_id,
            path: c.path.clone(),
            kind: WatchKind::First as i32,
            persistent: false,
            existed: true,
        };
        // Not due: the node exists and has a predecessor.
        self.watches.add_first_not_due(conn, &spec, sm);
        c.first_watch_set = true;
    }

    /// Fault `ack-before-commit`: answers this member's proposals as soon
    /// as they are in its log, from a speculative copy of the state.
    pub(super) fn ack_early(&mut self, entries: &[Entry]) {
        let mut spec = self.sm().clone();
        for e in entries {
            if e.entry_type != EntryType::EntryNormal || e.data.is_empty() {
                continue;
            }
            let Ok(cmd) = Command::decode(&e.data[..]) else { continue };
            let applied = spec.apply(e.index, &cmd);
            // Only client writes are acked early (sessions must exist first).
            if cmd.origin != self.cfg.id || !matches!(cmd.body, Some(command::Body::Write(_))) {
                continue;
            }
            if let (Some(p), Some(mut resp)) = (self.pending.take(cmd.request_id), applied.reply) {
                resp.id = p.client_id;
                self.reply(p.conn, resp);
            }
        }
    }

    /// A snapshot at the applied index without dropping log entries, for a
    /// member the stored snapshot's configuration does not hold (a member
    /// added since it was made: raft-rs refuses to install it there). It is
    /// built as a compaction's is, off the driver from a checkpoint staged
    /// here (module doc); while another build (a compaction's, a backup's)
    /// is under way raft-rs's next ask comes back here.
    pub(super) fn snapshot_now(&mut self) -> anyhow::Result<()> {
        let applied = self.sm().applied();
        if applied < self.raw.store().first().saturating_sub(1) {
            return Ok(());
        }
        if self.snapshot_building.is_some() || self.backup_building.is_some() {
            return Ok(());
        }
        let mut batch = Batch::default();
        self.sm_mut().flush(&mut batch);
        self.raw.mut_store().stage_commit(&mut batch)?;
        self.snapshot_building = Some(self.raw.store().conf_state().clone());
        self.snapshot_keeps_log = true;
        info!(applied, "a snapshot for a new member is being built");
        self.io.persist.submit(SyncJob { snapshot: true, ..SyncJob::plain(batch) });
        Ok(())
    }

    /// Enough entries applied since the log's start to make a snapshot.
    fn compaction_due(&self) -> bool {
        let applied = self.sm().applied();
        let first = self.raw.store().first();
        applied >= first && applied - first + 1 >= self.cfg.snapshot_entries
    }

    /// The snapshot thread's answer to a checkpoint's request: stores the
    /// snapshot and drops the log up to a tail before its index, unless
    /// the store moved past it meanwhile (a snapshot installed).
    pub(super) fn on_snapshot_built(&mut self, built: crate::syncer::Built) {
        let Some(conf) = self.snapshot_building.take() else { return };
        let keeps_log = std::mem::take(&mut self.snapshot_keeps_log);
        let b = match built {
            Ok(b) => b,
            Err(e) => return warn!(error = %e, "a snapshot could not be built; the next Ready asks again"),
        };
        crate::metrics::snapshot("made", b.took);
        let store = self.raw.store();
        let (first, stored) = (store.first(), store.stored_snapshot().get_metadata().index);
        if b.index <= stored || b.index + 1 < first || b.index > self.sm().applied() {
            return debug!(index = b.index, stored, first, "a built snapshot is not newer: dropped");
        }
        // The snapshot carries the configuration it was asked at: one
        // changed since would be stored with the wrong one.
        if *store.conf_state() != conf {
            return debug!(index = b.index, "the configuration changed while a snapshot was built: dropped");
        }
        // Keep a tail of the log so a briefly lagging follower catches up
        // from entries instead of a whole snapshot (all of it for a new
        // member's snapshot: no compaction was due).
        let compact_to = if keeps_log { 0 } else { b.index.saturating_sub(self.cfg.snapshot_entries / 4) };
        let bytes = b.data.len();
        let t = std::time::Instant::now();
        let mut batch = Batch::default();
        if let Err(e) = self.raw.mut_store().compact(b.index, b.data, compact_to, &mut batch) {
            return warn!(error = %e, "a built snapshot could not be stored");
        }
        self.io.persist.submit(SyncJob::plain(batch));
        let staged = t.elapsed();
        crate::memory::release();
        info!(
            index = b.index,
            first,
            bytes,
            ms = b.took.as_millis() as u64,
            stage_ms = staged.as_millis() as u64,
            release_ms = (t.elapsed() - staged).as_millis() as u64,
            log_kept = keeps_log,
            "snapshot built and stored"
        );
    }
}
