//! The Raft driver: owns the raft-rs `RawNode`, the state machine, the
//! client connections' pending requests, and the pieces that decide what to
//! answer: [`Reads`] (ReadIndex), [`Watches`], [`Sessions`] (liveness and
//! expiry).
//!
//! It does no I/O and reads no clock: every call takes `now`, randomness
//! comes from a seeded generator, peers are reached through a [`PeerSink`]
//! and the disk through a [`Persist`]. The runtime (`node.rs`) calls it from
//! one thread with the wall clock, sockets and a syncer thread; the
//! simulator (`server/tests/sim/mod.rs`) calls it with a manual clock, a seeded network and a
//! queue for a disk, and replays a run exactly from its seed.
//!
//! Layout: this file holds the driver's state, its inputs, time (ticks,
//! expiry) and the end of a turn; `route.rs` what each client request
//! becomes (a pure function: the rules), `requests.rs` how the driver
//! carries that out; `ready.rs` the Ready handling, from persisting to
//! applying entries; `members.rs` membership changes. The parts
//! (sessions.rs, reads.rs, `pending.rs`, `duties.rs`) return effects
//! (effect.rs) and `execute.rs` carries them out: the one place that
//! replies, sends and proposes. The listeners' local reads are view.rs.
//!
//! One loop turn, as the runtime drives it:
//! 1. [`Driver::handle`] every queued input: step peer messages, propose
//!    writes, queue linearizable reads, count touches and keepalives;
//! 2. [`Driver::on_persisted`] for every write the syncer finished (sends
//!    the messages that waited for it, `on_persist_ready`);
//! 3. [`Driver::tick`] when a tick is due (raft-rs tick, timeouts, expiry);
//! 4. [`Driver::end_turn`]: one ReadIndex for the turn's reads; the `Ready`
//!    in the order raft-rs documents (send messages, install a snapshot,
//!    apply committed entries, stage new entries and the hard state, queue
//!    the batch to the syncer, `advance_append_async`); reads now applied;
//!    session rounds and touch forwards.
//!
//! Replies are matched to requests by `(origin member, request id)` carried
//! in the entry, never by queue position; request ids start at a random
//! value on every start (pending.rs). A pending write fails with `LEADER_CHANGED`
//! (ambiguous) when the leader changes, and with `TIMEOUT` (ambiguous) after
//! `request_timeout`; clients retry with the same sequence number and
//! exactly-once makes that safe.
//!
//! raft-rs is configured with `check_quorum`, `pre_vote`,
//! `ReadOnlyOption::Safe` (ReadIndex confirms leadership with a heartbeat
//! round), `max_size_per_msg` 1 MiB, `max_inflight_msgs` 32 (at most
//! 32 MiB of appends in flight to one follower: with 256, a member started
//! behind a million-node fill was sent 256 MiB at once, the leader's I/O
//! thread fell behind on the other follower's answers and the leader
//! stepped down in 3 of 3 runs; with 32 in 0 of 3, docs/scaling.md) and
//! `batch_append`: the appends to one follower that a turn's proposals
//! make are merged into one message before the Ready takes them (issue
//! 26: 8.4 peer messages per write became 1.2, docs/perf/per-op.md).
//! `max_committed_size_per_ready` is 1 MiB ([`MAX_APPLY_BYTES_PER_READY`]):
//! a member catching up on a million creates applied them all in one
//! Ready, which stalled its ticks for 6 s and made one 152 MB state batch;
//! in pieces the ticks go on between them and the batches are small
//! enough for RocksDB to flush as it goes. At 4 MiB a follower applying a
//! million-node fill (multis of 100 creates) still had 6-10 turns of
//! 200-330 ms and one of 544-665 ms per run, longer than the 500 ms election
//! timeout; at 1 MiB none over 450 ms, with the fill's time within the
//! runs' spread (docs/scaling.md, 2026-12-06). One Ready still applies at
//! least one entry, up to a 4 MiB client frame.
//!
//! Election timeouts: raft-rs draws them from `thread_rng`, which cannot be
//! seeded. The driver configures raft-rs with a fixed timeout of
//! `2 * election_ticks - 1` and starts each non-leader countdown part-way,
//! at a seeded draw in `[0, election_ticks)` (`randomize_election`): the
//! same `[n, 2n)` spread, and a simulated run replays exactly.
//!
//! Fast failure detection (`leader_gone`): when the leader's connection to
//! this follower closes (a killed process's sockets close at once), the
//! follower leaves the leader's lease and campaigns after `1 + 2 * rank`
//! ticks, `rank` its place among the other voters in id order (one tick
//! for the first, three for the next: never the same tick, so no split
//! vote), instead of a whole randomized election timeout (a leader kill
//! -9 costs ~20-60 ms without a grant instead of ~800 ms:
//! docs/comparison.md). Only
//! liveness depends on it: a live leader's next heartbeat resets the timer
//! first, and the other followers refuse (pre-)votes while they hear from
//! it. A leader that hangs without dying closes nothing and is found by the
//! normal timeout.
//!
//! # What a client sees when something fails
//! | Event | What the member does | What the client gets |
//! |---|---|---|
//! | raft-rs refuses a proposal (no leader known) | `propose` answers at once | `NO_LEADER` (definite) |
//! | The leader, the term or this member's role changes (the Ready's soft state) | `on_soft_state` fails every pending write of this member and asks the new leader for every outstanding ReadIndex, and asks again when the term's first commit is seen (`reads_after_term_commit`) | `LEADER_CHANGED` (ambiguous: the entry may still commit) |
//! | A pending write waits longer than `--request-timeout-ms` | `tick` fails it | `TIMEOUT` (ambiguous) |
//! | A read or attach waits longer than that for its ReadIndex or its applied index | `tick` or `serve_ready_reads` fails it | `TIMEOUT` (nothing changed) |
//! | A keepalive's round or forward is not acknowledged in time, or the leader changes | the session layer gives it up (sessions.rs) | `NO_LEADER`; the client does not count it as proof |
//! | SIGTERM or SIGINT | `shutdown`: every pending write answered, the syncer stopped after its queued writes (node.rs) | `TIMEOUT` (ambiguous) for pending writes, then the connection closes |
//! | The driver has stopped | the listener answers and closes the connection | `SHUTTING_DOWN` |
//! | A storage error (a Ready's staging or the syncer's write) | the error leaves `Node::run`; the process exits 1 (3 when the error says `corrupt`: kv.rs, main.rs) | the connection closes |
//! | An entry whose `Command` does not decode | skipped on every member (`apply_command`), logged | no reply; a pending write times out |
//! | A membership change raft-rs refuses on apply | nothing changes on any member (driver/members.rs) | `BAD_REQUEST` |
//! | A peer is down | its sender drops what was queued, reports `Unreachable` (and failed snapshots) and redials with backoff (transport.rs) | nothing; Raft resends |
//!
//! The first four rows are scripts on the simulator
//! (server/tests/failures.rs: the event happens to a request in flight, and
//! each asserts the code and whether it is ambiguous).
//!
//! Clients retry ambiguous failures with the same `seq`; exactly-once
//! (state/mod.rs) makes the retry safe. After a restart, a member re-applies
//! the committed entries after its stored applied index; their replies go
//! nowhere (the old connections are gone).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use baton_proto::{
    command, request, response, AttachReq, ChildrenResp, Command, Empty, ErrorCode, ExpireSessions, NewSession,
    Request, Response, ServerFrame, StatusResp, WatchEvent, WatchKind, WatchSpec,
};
use prost::Message as _;
use raft::prelude::*;
use raft::StateRole;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::{debug, error, info, warn};

use crate::acl::Caller;
use crate::config::Config;
use crate::effect::Effect;
use crate::kv::{Batch, Kv};
use crate::message::{ConnId, ConnTx, Input, PeerOut, PeerSink};
use crate::raft_store::RaftStore;
use crate::reads::{Deferred, Reads};
use crate::sessions::{Sessions, Timing, Voters};
use crate::state::{error_response, StateMachine};
use crate::syncer::{Persist, SyncJob, Synced};
use crate::watches::{missed_events, Fired, Watches};

mod duties;
mod execute;
mod members;
mod pending;
mod ready;
mod requests;
pub mod route;

use crate::view::{capped, local_read, read, SharedState};
use duties::LeaderDuties;
use pending::{Pending, PendingWrite, Waits};
use route::{check_spec, Route};

struct Conn {
    tx: ConnTx,
    session: Option<u64>,
    /// The session's secret, from its create or attach: every write this
    /// connection proposes carries it (state/mod.rs checks it on apply).
    secret: bytes::Bytes,
}

/// Wall-clock time for entries (`Command::time_ms`), derived from the
/// monotonic `now` so that the driver never reads a clock itself.
#[derive(Clone, Copy)]
pub struct WallClock {
    pub mono: Instant,
    pub wall_ms: i64,
}

impl WallClock {
    pub fn system(now: Instant) -> Self {
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        WallClock { mono: now, wall_ms }
    }

    fn at(&self, now: Instant) -> i64 {
        self.wall_ms + now.saturating_duration_since(self.mono).as_millis() as i64
    }
}

/// Expiries this member applied (the simulator checks them against what
/// clients believed at that moment).
#[derive(Debug, Clone)]
pub struct AppliedExpiry {
    pub index: u64,
    pub sessions: Vec<u64>,
}

pub struct Driver {
    cfg: Config,
    raw: RawNode<RaftStore>,
    /// Shared with the client listeners, which answer local (stale) reads
    /// without a watch straight from it; only this driver writes it.
    sm: SharedState,
    io: Io,
    rng: StdRng,
    conns: BTreeMap<ConnId, Conn>,
    watches: Watches,
    /// Writes waiting for their entry (pending.rs).
    pending: Pending,
    reads: Reads,
    sessions: Sessions,
    soft: Soft,
    clock: Clock,
    /// What only a leader does (duties.rs); new on every leader change.
    duties: LeaderDuties,
    followed: Followed,
    membership: Membership,
    observers: Observers,
    /// The backup this member took last (backup.rs), until its last chunk
    /// is fetched or the next one is taken.
    backup: Option<crate::backup::Taken>,
    /// A checkpoint asked the snapshot thread for a snapshot and its answer
    /// has not come: the configuration it was asked at (ready.rs,
    /// "Snapshots off the driver").
    snapshot_building: Option<ConfState>,
    /// The snapshot being built is for a member added since the stored one
    /// (`snapshot_now`): stored without dropping any log entry.
    snapshot_keeps_log: bool,
    /// A backup asked the snapshot thread for its bytes and they have not
    /// come: who asked (connection, request id).
    backup_building: Option<(ConnId, u64)>,
}

/// The driver's way out: the disk and the other members.
struct Io {
    /// Writes go through it (in order), never straight to the store.
    persist: Box<dyn Persist>,
    peers: Box<dyn PeerSink>,
    /// The highest Ready number queued to `persist`, and the highest it
    /// reported written: equal when no Ready's write is on its way
    /// (driver/ready.rs, "A Ready with nothing to write").
    queued: u64,
    written: u64,
}

/// Leader, term and role as of the last `Ready`'s soft state, and this
/// member's election countdown.
struct Soft {
    leader: u64,
    term: u64,
    role: StateRole,
    /// Last time a message from the current leader arrived (followers).
    leader_contact: Instant,
    /// The current election countdown already got its random start.
    election_drawn: bool,
    /// The last term in which this member saw a commit of that term's
    /// entries: from then on its leader answers ReadIndex (reads.rs).
    read_term: u64,
}

/// Time as the driver has been told it.
struct Clock {
    wall: WallClock,
    /// When this member started (status's uptime).
    started: Instant,
    last_tick: Option<Instant>,
    ticks: u64,
    /// When the state machine's changed keys were last staged (ready.rs).
    state_flushed: Instant,
    /// When a peer message that waited long in the input queue was last
    /// logged (at most one a second).
    queue_logged: Option<Instant>,
}

/// The cluster-wide settings this member follows (settings.rs).
struct Followed {
    /// Kept here so that ACL checks made while the state is locked for an
    /// apply (event filtering) never lock it again: refreshed after every
    /// apply that may change them and every tick.
    current: baton_proto::ClusterSettings,
    /// The recorded settings last compared with this member's flags (a
    /// difference is logged once per change).
    noted: Option<baton_proto::ClusterSettings>,
}

/// This member's view of the configuration (membership.rs, cluster.rs).
struct Membership {
    /// The members' peer addresses as last given to the transport.
    addrs: BTreeMap<u64, String>,
    /// When this member last reported its own addresses.
    reported: Option<Instant>,
    /// This member applied a configuration without itself: it stops
    /// (node.rs ends its loop; cluster.rs rule 2).
    removed: bool,
}

/// Who watches the driver from outside.
struct Observers {
    /// Where the status is published for `/health` and `/ready`, with the
    /// metrics (http.rs, metrics.rs); None: neither (the simulator).
    board: Option<crate::http::Board>,
    /// Recorded expiries (simulator only).
    expiries: Option<Vec<AppliedExpiry>>,
}

/// The log and the state from `kv`; a fresh data dir founds a new
/// cluster (`--peers`) or waits for the leader's snapshot (`--join`):
/// membership.rs, rule 1.
fn load(cfg: &Config, kv: &dyn Kv) -> anyhow::Result<(RaftStore, StateMachine)> {
    if cfg.founding && RaftStore::is_fresh(kv)? {
        let voters: Vec<u64> = cfg.peers.keys().copied().collect();
        let mut empty = StateMachine::new();
        empty.skip(1);
        RaftStore::found(kv, &voters, empty.snapshot())?;
        info!(?voters, "founded a new cluster");
    }
    let started = std::time::Instant::now();
    let store = RaftStore::load(kv, &[])?;
    let log_ms = started.elapsed().as_millis() as u64;
    let mut sm = StateMachine::load(kv)?;
    let state_ms = started.elapsed().as_millis() as u64 - log_ms;
    info!(
        entries = store.last() + 1 - store.first(),
        log_ms,
        nodes = sm.node_count(),
        state_ms,
        "loaded the log and the state"
    );
    if sm.applied() + 1 < store.first() {
        // The state is older than the log's start (a crash between
        // installing a snapshot and writing the state): restore it.
        let snap = store.stored_snapshot();
        if snap.get_metadata().index + 1 < store.first() {
            anyhow::bail!("the stored snapshot (index {}) is older than the log", snap.get_metadata().index);
        }
        sm.restore(&snap.data)?;
    }
    Ok((store, sm))
}

/// The most committed entry bytes one Ready applies (module doc).
pub const MAX_APPLY_BYTES_PER_READY: u64 = 1 << 20;

/// raft-rs's configuration (the module doc says why each).
fn raft_config(cfg: &Config, applied: u64) -> raft::Config {
    raft::Config {
        id: cfg.id,
        election_tick: cfg.election_ticks,
        // Fixed at the top of the range; `randomize_election` starts each
        // countdown part-way, from the seeded generator.
        min_election_tick: 2 * cfg.election_ticks - 1,
        max_election_tick: 2 * cfg.election_ticks,
        heartbeat_tick: cfg.heartbeat_ticks,
        applied,
        max_size_per_msg: 1024 * 1024,
        max_inflight_msgs: 32,
        max_committed_size_per_ready: MAX_APPLY_BYTES_PER_READY,
        batch_append: true,
        check_quorum: true,
        pre_vote: true,
        read_only_option: raft::ReadOnlyOption::Safe,
        ..Default::default()
    }
}

/// How many inputs one runtime turn takes at most before a `Ready`; a turn
/// that took this many did not drain the queue.
pub const MAX_INPUTS_PER_TURN: usize = 8192;

impl Driver {
    /// Loads the member's state from `kv`; `seed` feeds every random choice.
    pub fn new(
        cfg: Config,
        kv: &dyn Kv,
        peers: Box<dyn PeerSink>,
        persist: Box<dyn Persist>,
        seed: u64,
        now: Instant,
        wall: WallClock,
    ) -> anyhow::Result<Self> {
        let (store, mut sm) = load(&cfg, kv)?;
        let applied = sm.applied();
        let settings = crate::settings::effective(sm.cluster().settings.as_ref(), &cfg);
        sm.set_faults(cfg.faults);
        if cfg.faults.any() {
            warn!(faults = ?cfg.faults, "DELIBERATE BUGS ARE ON: this member is for harness tests only");
        }
        let rcfg = raft_config(&cfg, applied);
        rcfg.validate()?;
        let logger = crate::logging::slog_logger(cfg.id);
        let raw = RawNode::new(&rcfg, store, &logger)?;
        info!(id = cfg.id, applied, first = raw.store().first(), last = raw.store().last(), "raft node started");
        let mut rng = StdRng::seed_from_u64(seed);
        let timing = Timing {
            tick: Duration::from_millis(cfg.tick_ms),
            election: cfg.election_timeout(),
            no_grace: cfg.faults.expire_without_grace(),
            no_rebuild: cfg.faults.no_deadline_rebuild(),
            not_yet_applied_expired: cfg.faults.not_yet_applied_expired(),
        };
        let mut d = Driver {
            raw,
            sm: Arc::new(RwLock::new(sm)),
            io: Io { persist, peers, queued: 0, written: 0 },
            conns: BTreeMap::new(),
            watches: Watches::new(cfg.faults.first_to_successor()),
            pending: Pending::new(rng.gen::<u64>() >> 1),
            // Random starts: an entry proposed before a restart may commit
            // after it and must not match a new request; a ReadIndex answer
            // to a request from before a restart must not serve a new read.
            reads: Reads::new(cfg.id, if cfg.faults.read_ctx_restarts() { 1 } else { rng.gen::<u64>() >> 1 }),
            sessions: Sessions::new(cfg.id, timing, now),
            rng,
            soft: Soft {
                leader: 0,
                term: 0,
                role: StateRole::Follower,
                leader_contact: now,
                election_drawn: false,
                read_term: 0,
            },
            clock: Clock { wall, started: now, last_tick: None, ticks: 0, state_flushed: now, queue_logged: None },
            duties: LeaderDuties::default(),
            followed: Followed { current: settings, noted: None },
            membership: Membership { addrs: BTreeMap::new(), reported: None, removed: false },
            observers: Observers { board: None, expiries: None },
            backup: None,
            snapshot_building: None,
            snapshot_keeps_log: false,
            backup_building: None,
            cfg,
        };
        d.randomize_election();
        d.members_changed();
        Ok(d)
    }

    /// Publish the status to `board` and record metrics, every tick.
    pub fn set_board(&mut self, board: crate::http::Board) {
        self.observers.board = Some(board);
    }

    /// The status for `/health`, and the metrics (every tick; the state
    /// gauges, which walk the sessions, every 20 ticks).
    fn publish(&mut self, now: Instant) {
        let Some(board) = &self.observers.board else { return };
        let s = self.status();
        crate::metrics::raft(&s, self.raw.raft.raft_log.persisted, self.pending.len());
        if self.clock.ticks.is_multiple_of(20) {
            let sm = self.sm();
            let (sessions, nodes, eph) = (sm.session_count(), sm.node_count(), sm.ephemeral_count());
            drop(sm);
            crate::metrics::state(sessions, nodes, eph, self.watches.total(), self.conns.len(), s.db_bytes);
        }
        board.publish(s, now);
    }

    /// The state machine, for the listeners' local reads.
    pub fn shared_state(&self) -> SharedState {
        self.sm.clone()
    }

    fn sm(&self) -> RwLockReadGuard<'_, StateMachine> {
        read(&self.sm)
    }

    /// A handle on the state machine to read while other parts of the
    /// driver change (its guard does not borrow `self`).
    fn state(&self) -> SharedState {
        Arc::clone(&self.sm)
    }

    fn sm_mut(&self) -> RwLockWriteGuard<'_, StateMachine> {
        self.sm.write().unwrap_or_else(|p| p.into_inner())
    }

    // ------------------------------------------------------------ for tests

    /// Records every applied expiry from now on (simulator).
    pub fn observe_expiries(&mut self) {
        self.observers.expiries = Some(Vec::new());
    }

    pub fn take_expiries(&mut self) -> Vec<AppliedExpiry> {
        self.observers.expiries.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// raft-rs's live role and term.
    pub fn raft_role(&self) -> (StateRole, u64) {
        (self.raw.raft.state, self.raw.raft.term)
    }

    pub fn applied(&self) -> u64 {
        self.sm().applied()
    }

    /// The last index in raft-rs's log (persisted or not).
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    pub fn session_exists(&self, sid: u64) -> bool {
        self.sm().session_exists(sid)
    }

    /// A canonical dump of the state machine (replicas must agree).
    pub fn dump(&self) -> String {
        self.sm().dump()
    }

    // ------------------------------------------------------------ inputs

    /// Handles one input (not `Shutdown` or `Persisted`: the runtime's).
    pub fn handle(&mut self, input: Input, now: Instant) {
        match input {
            Input::ConnOpened { conn, tx } => {
                self.conns.insert(conn, Conn { tx, session: None, secret: Default::default() });
            }
            Input::ConnClosed { conn } => {
                self.conns.remove(&conn);
                self.watches.remove_conn(conn);
                self.reads.remove_conn(conn);
                self.sessions.remove_conn(conn);
            }
            Input::Client { conn, req } => self.on_request(conn, req, now),
            Input::Peer(m, read_at) => {
                if m.to != self.cfg.id {
                    return;
                }
                if let Some(at) = read_at {
                    self.note_queued(&m, now.saturating_duration_since(at), now);
                }
                if m.from == self.soft.leader {
                    self.soft.leader_contact = now;
                }
                if let Err(e) = self.raw.step(*m) {
                    debug!("step: {e}");
                }
            }
            Input::Touch { .. } | Input::TouchAck { .. } | Input::Sync { .. } | Input::SyncAck { .. } => {
                self.on_session_input(input, now)
            }
            Input::Unreachable(to) => self.raw.report_unreachable(to),
            Input::PeerGone(from) => self.leader_gone(from),
            Input::SnapshotSent { to, ok } => {
                let status = if ok { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
                self.raw.report_snapshot(to, status);
            }
            Input::SnapshotBuilt(built) => self.on_snapshot_built(*built),
            Input::BackupBuilt(built) => self.on_backup_built(*built),
            Input::Shutdown | Input::Persisted => {}
        }
        self.randomize_election();
    }

    /// The session layer's messages between members (sessions.rs).
    fn on_session_input(&mut self, input: Input, now: Instant) {
        let st = self.state();
        let acts = match input {
            Input::Touch { from, ids, batch } => {
                self.sessions.on_touch(from, batch, ids, &read(&st), now);
                return;
            }
            Input::TouchAck { from, batch, expired, expiring } => {
                let from_leader = from == self.raw.raft.leader_id && from != self.cfg.id;
                self.sessions.on_touch_ack(from_leader, batch, &expired, &expiring, &read(&st))
            }
            Input::Sync { from, term, round, ids, want_report } => {
                let (t, l) = (self.raw.raft.term, self.raw.raft.leader_id);
                self.sessions.on_sync(from, term, round, &ids, want_report, t, l, now).into_iter().collect()
            }
            Input::SyncAck { from, term, round, report } => {
                let voters = self.voters();
                self.sessions.on_sync_ack(from, term, round, report, &voters, &read(&st), now)
            }
            _ => return,
        };
        self.execute(acts, now);
    }

    /// raft-rs draws election timeouts from `thread_rng`, which cannot be
    /// seeded. It is configured with a fixed timeout of `2 * base - 1`
    /// ticks instead, and whenever a non-leader's countdown restarts (term
    /// or role change, a message from the leader), it starts part-way, at
    /// a seeded draw in `[0, base)`: the election fires after `[base,
    /// 2 * base)` ticks, as raft-rs's own randomization would, and a
    /// simulated run replays exactly. Leaders are left alone (their
    /// check-quorum counts the same ticks).
    ///
    /// One draw per restart: a draw of 0 leaves the countdown at 0, and
    /// drawing again for it would push every member towards the same start
    /// (`election_drawn` prevents that; sim t85).
    fn randomize_election(&mut self) {
        let base = self.cfg.election_ticks;
        let r = &mut self.raw.raft;
        if r.state == StateRole::Leader || r.election_elapsed != 0 {
            self.soft.election_drawn = false;
            return;
        }
        if !self.soft.election_drawn {
            r.election_elapsed = self.rng.gen_range(0..base);
            self.soft.election_drawn = true;
        }
    }

    /// Fast failure detection: when the leader's connection to us closes
    /// (a killed process's sockets close at once), leave the leader's lease
    /// and hold an election soon instead of after a full randomized
    /// election timeout: the other voters in id order, the first after one
    /// tick, the next after three, and so on (`leader_gone_ticks`). Two
    /// followers that saw the close in the same instant never campaign in
    /// the same tick, so they do not split the vote. Only liveness depends
    /// on this: if the leader is alive, its next heartbeat (every
    /// `heartbeat_ticks`) resets the timer before anything happens, and the
    /// other followers still refuse (pre-)votes while they hear from it.
    fn leader_gone(&mut self, from: u64) {
        let base = self.cfg.election_ticks;
        let extra = leader_gone_ticks(&self.raw.store().conf_state().voters, from, self.cfg.id, base);
        let r = &mut self.raw.raft;
        if r.state != raft::StateRole::Follower || r.leader_id != from {
            return;
        }
        let fire_at = r.randomized_election_timeout();
        r.election_elapsed = r.election_elapsed.max(fire_at.saturating_sub(extra)).max(base);
        info!(leader = from, ticks = extra, "leader's connection closed: election soon");
    }

    /// raft-rs drops a ReadIndex at a leader that has not yet committed an
    /// entry of its term, without a word (reads.rs). The first time this
    /// member sees such a commit in the current term (the leader when a
    /// quorum has its first entry, a follower when the leader says so),
    /// every outstanding ReadIndex is asked again at once: the one asked
    /// when the leader changed was most likely dropped, and waiting for
    /// `READ_INDEX_RETRY` kept a failover's re-attaching clients ~300 ms
    /// (issue 26's failover gap).
    fn reads_after_term_commit(&mut self) {
        let r = &self.raw.raft;
        if self.soft.read_term == r.term || r.leader_id == raft::INVALID_ID || !r.commit_to_current_term() {
            return;
        }
        self.soft.read_term = r.term;
        self.reads.requeue();
    }

    fn voters(&self) -> Voters {
        let cs = self.raw.store().conf_state();
        Voters { incoming: cs.voters.clone(), outgoing: cs.voters_outgoing.clone() }
    }

    // ------------------------------------------------------------ time

    /// A Raft message that waited `waited` between the transport reading
    /// it and this turn: over a quarter of an election timeout, logged
    /// (once a second at most). A leader's heartbeats and its followers'
    /// answers that wait this long are how a busy member loses its
    /// followers with no long turn of its own.
    fn note_queued(&mut self, m: &Message, waited: Duration, now: Instant) {
        if waited <= self.cfg.election_timeout() / 4 {
            return;
        }
        if self.clock.queue_logged.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            return;
        }
        self.clock.queue_logged = Some(now);
        warn!(from = m.from, kind = ?m.get_msg_type(), waited_ms = waited.as_millis() as u64, "a peer message waited long in the driver's queue");
    }

    /// True on a leader, or on a follower that heard from its leader within
    /// an election timeout.
    fn leader_alive(&self, now: Instant) -> bool {
        match self.raw.raft.state {
            StateRole::Leader => true,
            _ => {
                self.raw.raft.leader_id != 0
                    && now.duration_since(self.soft.leader_contact) < self.cfg.election_timeout()
            }
        }
    }

    /// One tick: raft-rs's tick, request and read timeouts, session rounds,
    /// and expiry. `drained`: this turn took every queued input.
    pub fn tick(&mut self, now: Instant, drained: bool) {
        // A countdown a message restarted since the last tick (a vote, a new
        // term, the leader's heartbeat), then one the tick itself restarted
        // (a campaign). Missing the first let two candidates whose ticks ran
        // in step time out together forever (sim t85).
        self.randomize_election();
        self.raw.tick();
        self.randomize_election();
        // A gap between ticks much longer than a tick: this member was
        // paused. Its deadlines are stale; restart them (sessions.rs, rule 3).
        let gap = self.clock.last_tick.is_some_and(|t| now.duration_since(t) > self.cfg.election_timeout() / 2);
        self.clock.last_tick = Some(now);
        let stale_role = self.cfg.faults.expire_from_stale_role();
        if gap && !stale_role {
            let st = self.state();
            self.sessions.restart_deadlines(&read(&st), now);
            info!("tick gap (this member was paused?): session deadlines restart");
        }
        // Pending writes that waited too long: ambiguous.
        let timeout = self.cfg.request_timeout();
        let late = self.pending.time_out(now, timeout);
        self.execute(late, now);
        let late = self.reads.retry(now, timeout);
        self.execute(late, now);
        let voters = self.voters();
        let acts = {
            let st = self.state();
            let sm = read(&st);
            let alive = self.leader_alive(now);
            self.sessions.tick(&voters, &sm, alive, now)
        };
        self.execute(acts, now);
        // Expiry (sessions.rs, rule 3).
        let may_expire = if stale_role {
            self.soft.role == StateRole::Leader
        } else {
            self.raw.raft.state == StateRole::Leader && self.sessions.caught_up(self.sm().applied()) && drained && !gap
        };
        if may_expire {
            let due = self.sessions.due(now, timeout);
            if !due.is_empty() {
                self.propose_expiry(due, now, stale_role);
            }
        }
        if self.raw.raft.state == StateRole::Leader && self.sessions.caught_up(self.sm().applied()) {
            self.leader_duties(now);
            self.maybe_promote();
        }
        self.note_settings();
        self.maybe_report(now);
        self.publish(now);
        self.clock.ticks += 1;
    }

    /// Logs, once per change of the recorded settings, that this member's
    /// flags say otherwise and that it follows the record (settings.rs).
    fn note_settings(&mut self) {
        let recorded = self.sm().cluster().settings.clone();
        self.followed.current = crate::settings::effective(recorded.as_ref(), &self.cfg);
        let Some(rec) = recorded else { return };
        if self.followed.noted.as_ref() == Some(&rec) {
            return;
        }
        let flags = crate::settings::from_flags(&self.cfg);
        if rec != flags {
            warn!(
                cluster_superusers = ?rec.superusers,
                cluster_open_admin = rec.open_admin,
                flag_superusers = ?flags.superusers,
                flag_open_admin = flags.open_admin,
                "this member's --superuser / --insecure-open-admin differ from the cluster's settings: following \
                 the cluster's (baton settings get)"
            );
        }
        self.followed.noted = Some(rec);
    }

    /// The leader's duties (driver/duties.rs): the cluster's id, then who
    /// joined it (cluster.rs); due container and TTL nodes.
    fn leader_duties(&mut self, now: Instant) {
        let st = self.state();
        let sm = read(&st);
        let cs = self.raw.store().conf_state();
        let members: Vec<u64> = cs.voters.iter().chain(cs.learners.iter()).copied().collect();
        let prs = self.raw.raft.prs();
        let seed = crate::settings::from_flags(&self.cfg);
        let rng = &mut self.rng;
        let record = self.duties.cluster_record(now, self.cfg.election_timeout(), || {
            crate::cluster::next_record(&sm, members, |id| prs.get(id).map_or(0, |p| p.matched), rng, &seed)
        });
        let at = self.clock.wall.at(now);
        let reap = self.duties.reap(now, || sm.due_for_reaping(at));
        drop(sm);
        self.execute(record.into_iter().chain(reap), now);
    }

    fn propose_expiry(&mut self, due: Vec<u64>, now: Instant, may_forward: bool) {
        // Never forwarded: a member that is not leader in raft-rs's live
        // state proposes nothing (raft-rs would hand it to the new leader).
        if self.raw.raft.state != StateRole::Leader && !may_forward {
            return;
        }
        info!(sessions = ?due, "expiring sessions");
        let body = command::Body::Expire(ExpireSessions { session_ids: due });
        self.execute([Effect::Propose { body, what: "expiry" }], now);
    }

    // ------------------------------------------------------------ ready

    /// The end of a loop turn: the turn's ReadIndex, the `Ready`, reads now
    /// servable, session rounds and forwards.
    pub fn end_turn(&mut self, now: Instant) -> anyhow::Result<()> {
        self.reads_after_term_commit();
        if let Some(ctx) = self.reads.issue(now) {
            self.raw.read_index(ctx);
        }
        if self.raw.has_ready() {
            self.handle_ready(now)?;
        }
        if self.raw.store().take_snapshot_wanted() {
            self.snapshot_now()?;
        }
        self.serve_ready_reads(now);
        let voters = self.voters();
        let leader = self.raw.raft.leader_id;
        let acts = {
            let st = self.state();
            let sm = read(&st);
            let mut acts = self.sessions.flush(leader, &voters, &sm, now);
            if self.cfg.faults.keepalive_without_quorum() {
                acts.extend(self.sessions.complete_all_now(&sm));
            }
            acts
        };
        self.execute(acts, now);
        self.randomize_election();
        Ok(())
    }

    fn serve_ready_reads(&mut self, now: Instant) {
        let applied = self.sm().applied();
        let (ready, late) = self.reads.take_ready(applied, now, self.cfg.request_timeout());
        for d in ready {
            self.serve(d.conn, &d.req, now);
        }
        self.execute_at(late, applied, now);
    }

    // ------------------------------------------------------------ misc

    pub fn status(&self) -> StatusResp {
        let r = &self.raw.raft;
        StatusResp {
            id: self.cfg.id,
            role: match r.state {
                StateRole::Leader => "leader",
                StateRole::Follower => "follower",
                StateRole::Candidate => "candidate",
                StateRole::PreCandidate => "pre-candidate",
            }
            .into(),
            term: r.term,
            commit_index: r.raft_log.committed,
            applied_index: self.sm().applied(),
            leader_id: r.leader_id,
            first_index: self.raw.store().first(),
            sessions: self.sm().session_count() as u64,
            nodes: self.sm().node_count() as u64,
            voters: self.raw.store().conf_state().voters.clone(),
            learners: self.raw.store().conf_state().learners.clone(),
            uptime_ms: self
                .clock
                .last_tick
                .map_or(0, |t| t.saturating_duration_since(self.clock.started).as_millis() as u64),
            db_bytes: self.io.persist.db_bytes(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            leader_contact: self.clock.last_tick.is_some_and(|t| self.leader_alive(t)),
            settings: Some(self.settings()),
            cluster_id: self.sm().cluster().cluster_id.clone(),
            joined: self.sm().cluster().joined.clone(),
        }
    }

    /// Fails every pending write (ambiguous) and stops the syncer after
    /// the queued writes.
    /// True once this member applied its own removal, or started with a
    /// stored configuration that leaves it out (it was removed before a
    /// restart).
    pub fn removed(&self) -> bool {
        self.membership.removed || {
            let cs = self.raw.store().conf_state();
            let mut all = cs.voters.iter().chain(&cs.learners).chain(&cs.voters_outgoing).chain(&cs.learners_next);
            !cs.voters.is_empty() && all.all(|&m| m != self.cfg.id)
        }
    }

    pub fn shutdown(&mut self, now: Instant) {
        info!("shutting down");
        let failed = self.pending.shutdown();
        if failed.is_empty() {
            info!(conns = self.conns.len(), "member shutting down; no write was pending");
        } else {
            warn!(
                conns = self.conns.len(),
                writes = failed.len(),
                "member shutting down; pending writes may or may not happen"
            );
        }
        self.execute(failed, now);
        self.io.persist.stop();
    }
}

/// Ticks a follower waits after its leader's connection closed before it
/// campaigns (`Driver::leader_gone`): `1 + 2 * rank`, where `rank` is its
/// place among the voters other than the gone leader in id order, and at
/// most an election timeout (`base`). The first campaigns at the next
/// tick; the others only if it has not won by then.
fn leader_gone_ticks(voters: &[u64], gone: u64, me: u64, base: usize) -> usize {
    let rank = voters.iter().filter(|v| **v != gone && **v < me).count();
    (1 + 2 * rank).min(base.max(1))
}

#[cfg(test)]
mod tests {
    use super::leader_gone_ticks;

    #[test]
    fn followers_of_a_gone_leader_campaign_in_id_order_never_in_the_same_tick() {
        // Three voters, leader 2 gone: 1 after one tick, 3 after three.
        assert_eq!(leader_gone_ticks(&[1, 2, 3], 2, 1, 10), 1);
        assert_eq!(leader_gone_ticks(&[1, 2, 3], 2, 3, 10), 3);
        // Five voters, leader 1 gone: two ticks apart.
        let t: Vec<usize> = [2, 3, 4, 5].iter().map(|m| leader_gone_ticks(&[1, 2, 3, 4, 5], 1, *m, 10)).collect();
        assert_eq!(t, [1, 3, 5, 7]);
        // Never past an election timeout.
        assert_eq!(leader_gone_ticks(&[1, 2, 3, 4, 5, 6, 7], 1, 7, 10), 10);
    }
}
