//! The Raft driver: owns the raft-rs `RawNode`, the state machine, the
//! client connections' pending requests, and the pieces that decide what to
//! answer: [`Reads`] (ReadIndex), [`Watches`], [`Sessions`] (liveness and
//! expiry).
//!
//! It does no I/O and reads no clock: every call takes `now`, randomness
//! comes from a seeded generator, peers are reached through a [`PeerSink`]
//! and the disk through a [`Persist`]. The runtime (`node.rs`) calls it from
//! one thread with the wall clock, sockets and a syncer thread; the
//! simulator (`sim.rs`) calls it with a manual clock, a seeded network and a
//! queue for a disk, and replays a run exactly from its seed.
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
//! value on every start. A pending write fails with `LEADER_CHANGED`
//! (ambiguous) when the leader changes, and with `TIMEOUT` (ambiguous) after
//! `request_timeout`; clients retry with the same sequence number and
//! exactly-once makes that safe.
//!
//! Election timeouts: raft-rs draws them from `thread_rng`, which cannot be
//! seeded. The driver configures raft-rs with a fixed timeout and randomizes
//! where each countdown starts itself (`randomize_election`), so a simulated
//! run replays exactly.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use baton_proto::{
    client_write, command, request, response, AttachReq, ChildrenResp, ClientWrite, Command, Empty, ErrorCode,
    ExistsResp, ExpireSessions, GetResp, NewSession, Request, Response, ServerFrame, StatusResp, WatchEvent, WatchKind,
    WatchSpec,
};
use prost::Message as _;
use raft::prelude::*;
use raft::StateRole;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{debug, error, info, warn};

use crate::config::Config;
use crate::kv::{Batch, Kv};
use crate::message::{ConnId, Input, PeerOut, PeerSink};
use crate::raft_store::RaftStore;
use crate::reads::{Deferred, Reads};
use crate::sessions::{Action, Sessions, Timing, Voters};
use crate::state::{error_response, StateMachine};
use crate::syncer::{Persist, SyncJob, Synced};
use crate::watches::{missed_event, Fired, Watches};

/// The state machine as the driver and the listeners share it.
pub type SharedState = Arc<RwLock<StateMachine>>;

struct Conn {
    tx: UnboundedSender<ServerFrame>,
    session: Option<u64>,
}

/// A request waiting for its entry to be applied.
struct PendingWrite {
    conn: ConnId,
    client_id: u64,
    since: Instant,
    /// Bind the connection to the new session (CreateSession).
    bind_session: bool,
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
    /// Writes go through it (in order), never straight to the store.
    persist: Box<dyn Persist>,
    peers: Box<dyn PeerSink>,
    rng: StdRng,
    wall: WallClock,
    conns: BTreeMap<ConnId, Conn>,
    watches: Watches,
    pending: BTreeMap<u64, PendingWrite>,
    next_request_id: u64,
    reads: Reads,
    sessions: Sessions,
    /// As of the last `Ready`'s soft state.
    leader: u64,
    term: u64,
    role: StateRole,
    /// Last time a message from the current leader arrived (followers).
    leader_contact: Instant,
    last_tick: Option<Instant>,
    /// Recorded expiries (simulator only).
    observed: Option<Vec<AppliedExpiry>>,
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
        let voters: Vec<u64> = cfg.peers.keys().copied().collect();
        let store = RaftStore::load(kv, &voters)?;
        let mut sm = StateMachine::load(kv)?;
        if sm.applied() + 1 < store.first() {
            // The state is older than the log's start (a crash between
            // installing a snapshot and writing the state): restore it.
            let snap = store.snapshot(0, 0).map_err(|e| anyhow::anyhow!("snapshot missing: {e}"))?;
            sm.restore(&snap.data)?;
        }
        let applied = sm.applied();
        sm.set_faults(cfg.faults);
        if cfg.faults.any() {
            warn!(faults = ?cfg.faults, "DELIBERATE BUGS ARE ON: this member is for harness tests only");
        }
        let rcfg = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            // Fixed at the top of the range; `randomize_election` starts
            // each countdown part-way, from the seeded generator.
            min_election_tick: 2 * cfg.election_ticks - 1,
            max_election_tick: 2 * cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            applied,
            max_size_per_msg: 1024 * 1024,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            read_only_option: raft::ReadOnlyOption::Safe,
            ..Default::default()
        };
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
        };
        let mut d = Driver {
            raw,
            sm: Arc::new(RwLock::new(sm)),
            persist,
            peers,
            wall,
            conns: BTreeMap::new(),
            watches: Watches::default(),
            pending: BTreeMap::new(),
            // Random starts: an entry proposed before a restart may commit
            // after it and must not match a new request; a ReadIndex answer
            // to a request from before a restart must not serve a new read.
            next_request_id: rng.gen::<u64>() >> 1,
            reads: Reads::new(cfg.id, if cfg.faults.read_ctx_restarts() { 1 } else { rng.gen::<u64>() >> 1 }),
            sessions: Sessions::new(cfg.id, timing, now),
            rng,
            leader: 0,
            term: 0,
            role: StateRole::Follower,
            leader_contact: now,
            last_tick: None,
            observed: None,
            cfg,
        };
        d.randomize_election();
        Ok(d)
    }

    /// The state machine, for the listeners' local reads.
    pub fn shared_state(&self) -> SharedState {
        self.sm.clone()
    }

    fn sm(&self) -> RwLockReadGuard<'_, StateMachine> {
        self.sm.read().unwrap_or_else(|p| p.into_inner())
    }

    fn sm_mut(&self) -> RwLockWriteGuard<'_, StateMachine> {
        self.sm.write().unwrap_or_else(|p| p.into_inner())
    }

    // ------------------------------------------------------------ for tests

    /// Records every applied expiry from now on (simulator).
    pub fn observe_expiries(&mut self) {
        self.observed = Some(Vec::new());
    }

    pub fn take_expiries(&mut self) -> Vec<AppliedExpiry> {
        self.observed.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn id(&self) -> u64 {
        self.cfg.id
    }

    /// raft-rs's live role and term.
    pub fn raft_role(&self) -> (StateRole, u64) {
        (self.raw.raft.state, self.raw.raft.term)
    }

    pub fn applied(&self) -> u64 {
        self.sm().applied()
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
                self.conns.insert(conn, Conn { tx, session: None });
            }
            Input::ConnClosed { conn } => {
                self.conns.remove(&conn);
                self.watches.remove_conn(conn);
                self.reads.remove_conn(conn);
                self.sessions.remove_conn(conn);
            }
            Input::Client { conn, req } => self.on_request(conn, req, now),
            Input::Peer(m) => {
                if m.to != self.cfg.id {
                    return;
                }
                if m.from == self.leader {
                    self.leader_contact = now;
                }
                if let Err(e) = self.raw.step(*m) {
                    debug!("step: {e}");
                }
            }
            Input::Touch { from, ids, batch } => {
                let sm = Arc::clone(&self.sm);
                let sm = sm.read().unwrap_or_else(|p| p.into_inner());
                self.sessions.on_touch(from, batch, ids, &sm, now);
            }
            Input::TouchAck { from, batch, expired, expiring } => {
                let from_leader = from == self.raw.raft.leader_id && from != self.cfg.id;
                let acts = {
                    let sm = Arc::clone(&self.sm);
                    let sm = sm.read().unwrap_or_else(|p| p.into_inner());
                    self.sessions.on_touch_ack(from_leader, batch, &expired, &expiring, &sm)
                };
                self.act(acts);
            }
            Input::Sync { from, term, round, ids, want_report } => {
                let (t, l) = (self.raw.raft.term, self.raw.raft.leader_id);
                if let Some(a) = self.sessions.on_sync(from, term, round, &ids, want_report, t, l, now) {
                    self.act(vec![a]);
                }
            }
            Input::SyncAck { from, term, round, report } => {
                let voters = self.voters();
                let acts = {
                    let sm = Arc::clone(&self.sm);
                    let sm = sm.read().unwrap_or_else(|p| p.into_inner());
                    self.sessions.on_sync_ack(from, term, round, report, &voters, &sm, now)
                };
                self.act(acts);
            }
            Input::Unreachable(to) => self.raw.report_unreachable(to),
            Input::PeerGone(from) => self.leader_gone(from),
            Input::SnapshotSent { to, ok } => {
                let status = if ok { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
                self.raw.report_snapshot(to, status);
            }
            Input::Shutdown | Input::Persisted => {}
        }
        self.randomize_election();
    }

    /// raft-rs draws election timeouts from `thread_rng`, which cannot be
    /// seeded. It is configured with a fixed timeout of `2 * base - 1`
    /// ticks instead, and whenever a non-leader's countdown restarts (term
    /// or role change, a message from the leader), it starts part-way, at
    /// a seeded draw in `[0, base)`: the election fires after `[base,
    /// 2 * base)` ticks, as raft-rs's own randomization would, and a
    /// simulated run replays exactly. Leaders are left alone (their
    /// check-quorum counts the same ticks).
    fn randomize_election(&mut self) {
        let base = self.cfg.election_ticks;
        let r = &mut self.raw.raft;
        if r.state != StateRole::Leader && r.election_elapsed == 0 {
            r.election_elapsed = self.rng.gen_range(0..base);
        }
    }

    /// Fast failure detection: when the leader's connection to us closes
    /// (a killed process's sockets close at once), leave the leader's lease
    /// and hold an election within 1-3 ticks instead of a full randomized
    /// election timeout. Only liveness depends on this: if the leader is
    /// alive, its next heartbeat (every `heartbeat_ticks`) resets the timer
    /// before anything happens, and the other followers still refuse
    /// (pre-)votes while they hear from it.
    fn leader_gone(&mut self, from: u64) {
        let base = self.cfg.election_ticks;
        let extra = self.rng.gen_range(1..=3usize);
        let r = &mut self.raw.raft;
        if r.state != raft::StateRole::Follower || r.leader_id != from {
            return;
        }
        let fire_at = r.randomized_election_timeout();
        r.election_elapsed = r.election_elapsed.max(fire_at.saturating_sub(extra)).max(base);
        info!(leader = from, ticks = extra, "leader's connection closed: election soon");
    }

    fn act(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Reply { conn, id, code: ErrorCode::Ok, .. } => self.reply_ok(conn, id),
                Action::Reply { conn, id, code, msg } => self.reply_err(conn, id, code, msg),
                Action::Send { to, out } => self.peers.send(to, out),
            }
        }
    }

    fn voters(&self) -> Voters {
        let cs = self.raw.store().conf_state();
        Voters { incoming: cs.voters.clone(), outgoing: cs.voters_outgoing.clone() }
    }

    fn reply(&self, conn: ConnId, resp: Response) {
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.tx.send(ServerFrame { frame: Some(baton_proto::server_frame::Frame::Response(resp)) });
        }
    }

    /// An empty success at the current applied index.
    fn reply_ok(&self, conn: ConnId, id: u64) {
        let r = Response {
            id,
            zxid: self.sm().applied(),
            body: Some(response::Body::Empty(Empty {})),
            ..Default::default()
        };
        self.reply(conn, r);
    }

    fn reply_err(&self, conn: ConnId, id: u64, code: ErrorCode, msg: impl Into<String>) {
        let mut r = error_response(self.sm().applied(), code, msg);
        r.id = id;
        self.reply(conn, r);
    }

    fn on_request(&mut self, conn: ConnId, req: Request, now: Instant) {
        let Some(c) = self.conns.get(&conn) else { return };
        let session = c.session;
        if let Some(sid) = session {
            let sm = Arc::clone(&self.sm);
            let sm = sm.read().unwrap_or_else(|p| p.into_inner());
            self.sessions.touch(sid, &sm, now);
        }
        let id = req.id;
        use request::Body as B;
        match &req.body {
            None => self.reply_err(conn, id, ErrorCode::BadRequest, "empty or unknown request (newer protocol?)"),
            Some(B::Status(_)) => {
                let r = Response {
                    id,
                    zxid: self.sm().applied(),
                    body: Some(response::Body::Status(self.status())),
                    ..Default::default()
                };
                self.reply(conn, r);
            }
            Some(B::CreateSession(cs)) => {
                let timeout = self.cfg.negotiate_timeout(cs.timeout_ms);
                let secret: [u8; 16] = self.rng.gen();
                let cmd = Command {
                    body: Some(command::Body::NewSession(NewSession {
                        timeout_ms: timeout,
                        secret: secret.to_vec().into(),
                    })),
                    ..Default::default()
                };
                self.propose(conn, id, cmd, true, now);
            }
            Some(B::Attach(a)) => {
                // Checked against a linearizable state (a lagging member or
                // one cut off from the leader must not resume a session whose
                // expiry committed), at or past what the client saw.
                let min_index = a.last_zxid;
                if self.cfg.faults.attach_from_local_state() {
                    // Deliberate bug: no leader check, no ReadIndex.
                    self.reads.wait(min_index, Deferred { conn, req, since: now, min_index });
                    return;
                }
                if !self.leader_alive(now) {
                    return self.reply_err(conn, id, ErrorCode::NoLeader, "this member has no contact with a leader");
                }
                self.reads.push(Deferred { conn, req, since: now, min_index });
            }
            Some(B::Keepalive(_)) => self.on_keepalive(conn, id, session, now),
            Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)) => {
                if let Some(Err((code, msg))) = r.watch.as_ref().map(check_spec) {
                    return self.reply_err(conn, id, code, msg);
                }
                if r.stale || self.cfg.faults.stale_reads() {
                    self.serve(conn, &req, now);
                } else {
                    self.reads.push(Deferred { conn, req, since: now, min_index: 0 });
                }
            }
            Some(B::AddWatch(w)) => {
                let Some(spec) = w.watch.clone() else {
                    return self.reply_err(conn, id, ErrorCode::BadRequest, "add_watch without a watch");
                };
                if let Err((code, msg)) = check_spec(&spec) {
                    return self.reply_err(conn, id, code, msg);
                }
                let sm = Arc::clone(&self.sm);
                self.watches.add(conn, &spec, &sm.read().unwrap_or_else(|p| p.into_inner()));
                self.reply_ok(conn, id);
            }
            Some(B::RemoveWatch(rw)) => {
                self.watches.remove(conn, rw.watch_id);
                self.reply_ok(conn, id);
            }
            Some(B::CloseSession(_))
            | Some(B::Create(_))
            | Some(B::Set(_))
            | Some(B::Delete(_))
            | Some(B::Multi(_)) => {
                let Some(sid) = session else {
                    return self.reply_err(
                        conn,
                        id,
                        ErrorCode::BadRequest,
                        "writes need a session: create or attach one first",
                    );
                };
                if !self.sm().session_exists(sid) {
                    return self.reply_err(conn, id, ErrorCode::SessionExpired, format!("session {sid:#x} expired"));
                }
                if let Some(msg) = precheck_write(&req) {
                    return self.reply_err(conn, id, msg.0, msg.1);
                }
                let op = match req.body {
                    Some(B::CloseSession(c)) => client_write::Op::CloseSession(c),
                    Some(B::Create(c)) => client_write::Op::Create(c),
                    Some(B::Set(s)) => client_write::Op::Set(s),
                    Some(B::Delete(d)) => client_write::Op::Delete(d),
                    Some(B::Multi(m)) => client_write::Op::Multi(m),
                    _ => return,
                };
                let cmd = Command {
                    body: Some(command::Body::Write(ClientWrite {
                        session_id: sid,
                        seq: req.seq,
                        acked_below: req.acked_below,
                        op: Some(op),
                    })),
                    ..Default::default()
                };
                self.propose(conn, id, cmd, false, now);
            }
        }
    }

    /// A keepalive is answered OK only once a quorum has recorded the touch
    /// in the current leader's term (`sessions.rs`, the rule).
    fn on_keepalive(&mut self, conn: ConnId, id: u64, session: Option<u64>, now: Instant) {
        let Some(sid) = session else {
            return self.reply_err(conn, id, ErrorCode::BadRequest, "no session attached to this connection");
        };
        let exists = self.sm().session_exists(sid);
        if self.cfg.faults.contact_from_local_answers() {
            // Deliberate bug: vouch from local state alone.
            return match exists {
                true => self.reply_ok(conn, id),
                false => self.reply_err(conn, id, ErrorCode::SessionExpired, format!("session {sid:#x} expired")),
            };
        }
        if !self.leader_alive(now) {
            // A member cut off from the leader cannot vouch for the session:
            // the majority side may be expiring it right now.
            return self.reply_err(conn, id, ErrorCode::NoLeader, "this member has no contact with a leader");
        }
        if !exists {
            return self.reply_err(conn, id, ErrorCode::SessionExpired, format!("session {sid:#x} expired"));
        }
        if self.sessions.is_expiring(sid) {
            return self.reply_err(conn, id, ErrorCode::Busy, "this session's expiry is proposed; retry");
        }
        let sm = Arc::clone(&self.sm);
        let sm = sm.read().unwrap_or_else(|p| p.into_inner());
        self.sessions.keepalive(conn, id, sid, &sm, now);
    }

    fn propose(&mut self, conn: ConnId, client_id: u64, mut cmd: Command, bind_session: bool, now: Instant) {
        let rid = self.next_request_id;
        self.next_request_id += 1;
        cmd.origin = self.cfg.id;
        cmd.request_id = rid;
        cmd.time_ms = self.wall.at(now);
        match self.raw.propose(vec![], cmd.encode_to_vec()) {
            Ok(()) => {
                self.pending.insert(rid, PendingWrite { conn, client_id, since: now, bind_session });
            }
            Err(e) => self.reply_err(
                conn,
                client_id,
                ErrorCode::NoLeader,
                format!("proposal refused ({e}); no leader known, retry"),
            ),
        }
    }

    /// Answers a read (or attach) from local state.
    fn serve(&mut self, conn: ConnId, req: &Request, now: Instant) {
        use request::Body as B;
        let id = req.id;
        let (zxid, result) = {
            let sm = self.sm();
            let zxid = sm.applied();
            let result: Result<response::Body, (ErrorCode, String)> = match &req.body {
                Some(B::Get(_)) | Some(B::Exists(_)) => local_read(&sm, &req.body),
                Some(B::Children(r)) => sm.children(&r.path).map(|(mut children, stat)| {
                    if self.cfg.faults.grant_without_predecessor() {
                        let me = self.conns.get(&conn).and_then(|c| c.session).unwrap_or(0);
                        children.retain(|k| {
                            let owner =
                                sm.stat_of(&format!("{}/{k}", r.path.trim_end_matches('/'))).map(|s| s.ephemeral_owner);
                            owner.is_none_or(|o| o == 0 || o == me)
                        });
                    }
                    response::Body::Children(ChildrenResp { children, stat: Some(stat) })
                }),
                Some(B::Attach(_)) => Ok(response::Body::Empty(Empty {})),
                _ => Err((ErrorCode::BadRequest, "not a read".into())),
            };
            (zxid, result)
        };
        let result = match (&req.body, result) {
            (Some(B::Attach(a)), Ok(body)) => self.attach(conn, a, now).map(|_| body),
            (Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)), Ok(body)) => {
                if let Some(spec) = &r.watch {
                    let sm = Arc::clone(&self.sm);
                    self.watches.add(conn, spec, &sm.read().unwrap_or_else(|p| p.into_inner()));
                }
                Ok(body)
            }
            (_, r) => r,
        };
        let resp = match result {
            Ok(body) => Response { id, zxid, body: Some(body), ..Default::default() },
            Err((code, msg)) => {
                let mut r = error_response(zxid, code, msg);
                r.id = id;
                r
            }
        };
        self.reply(conn, resp);
    }

    fn attach(&mut self, conn: ConnId, a: &AttachReq, now: Instant) -> Result<(), (ErrorCode, String)> {
        self.sm().check_session(a.session_id, &a.secret)?;
        if self.sessions.is_expiring(a.session_id) {
            return Err((ErrorCode::Busy, "this session's expiry is proposed; retry".into()));
        }
        for spec in &a.watches {
            check_spec(spec)?;
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.session = Some(a.session_id);
        }
        let sm = Arc::clone(&self.sm);
        let sm = sm.read().unwrap_or_else(|p| p.into_inner());
        self.sessions.touch(a.session_id, &sm, now);
        for spec in &a.watches {
            match missed_event(&sm, spec, a.last_zxid) {
                Some(ev) => {
                    self.send_event(
                        &Fired { conn, watch_id: spec.watch_id, ty: ev, path: spec.path.clone() },
                        sm.applied(),
                    );
                    if spec.persistent {
                        self.watches.add(conn, spec, &sm);
                    }
                }
                None => self.watches.add(conn, spec, &sm),
            }
        }
        Ok(())
    }

    fn send_event(&self, f: &Fired, zxid: u64) {
        if let Some(c) = self.conns.get(&f.conn) {
            let ev = WatchEvent { watch_id: f.watch_id, r#type: f.ty as i32, path: f.path.clone(), zxid };
            let _ = c.tx.send(ServerFrame { frame: Some(baton_proto::server_frame::Frame::Event(ev)) });
        }
    }

    // ------------------------------------------------------------ time

    /// True on a leader, or on a follower that heard from its leader within
    /// an election timeout.
    fn leader_alive(&self, now: Instant) -> bool {
        match self.raw.raft.state {
            StateRole::Leader => true,
            _ => self.raw.raft.leader_id != 0 && now.duration_since(self.leader_contact) < self.cfg.election_timeout(),
        }
    }

    /// One tick: raft-rs's tick, request and read timeouts, session rounds,
    /// and expiry. `drained`: this turn took every queued input.
    pub fn tick(&mut self, now: Instant, drained: bool) {
        self.raw.tick();
        self.randomize_election();
        // A gap between ticks much longer than a tick: this member was
        // paused. Its deadlines are stale; restart them (sessions.rs, rule 3).
        let gap = self.last_tick.is_some_and(|t| now.duration_since(t) > self.cfg.election_timeout() / 2);
        self.last_tick = Some(now);
        let stale_role = self.cfg.faults.expire_from_stale_role();
        if gap && !stale_role {
            let sm = Arc::clone(&self.sm);
            self.sessions.restart_deadlines(&sm.read().unwrap_or_else(|p| p.into_inner()), now);
            info!("tick gap (this member was paused?): session deadlines restart");
        }
        // Pending writes that waited too long: ambiguous.
        let timeout = self.cfg.request_timeout();
        let late: Vec<u64> =
            self.pending.iter().filter(|(_, p)| now.duration_since(p.since) > timeout).map(|(k, _)| *k).collect();
        for rid in late {
            if let Some(p) = self.pending.remove(&rid) {
                self.reply_err(
                    p.conn,
                    p.client_id,
                    ErrorCode::Timeout,
                    "no commit within the request timeout; the write may or may not happen",
                );
            }
        }
        for d in self.reads.retry(now, timeout) {
            self.reply_err(
                d.conn,
                d.req.id,
                ErrorCode::Timeout,
                "no ReadIndex within the request timeout (no leader?)",
            );
        }
        let voters = self.voters();
        let acts = {
            let sm = Arc::clone(&self.sm);
            let sm = sm.read().unwrap_or_else(|p| p.into_inner());
            self.sessions.tick(&voters, &sm, now)
        };
        self.act(acts);
        // Expiry (sessions.rs, rule 3).
        let may_expire = if stale_role {
            self.role == StateRole::Leader
        } else {
            self.raw.raft.state == StateRole::Leader && self.sessions.caught_up(self.sm().applied()) && drained && !gap
        };
        if may_expire {
            let due = self.sessions.due(now, timeout);
            if !due.is_empty() {
                self.propose_expiry(due, now, stale_role);
            }
        }
    }

    fn propose_expiry(&mut self, due: Vec<u64>, now: Instant, may_forward: bool) {
        // Never forwarded: a member that is not leader in raft-rs's live
        // state proposes nothing (raft-rs would hand it to the new leader).
        if self.raw.raft.state != StateRole::Leader && !may_forward {
            return;
        }
        info!(sessions = ?due, "expiring sessions");
        let cmd = Command {
            origin: self.cfg.id,
            time_ms: self.wall.at(now),
            body: Some(command::Body::Expire(ExpireSessions { session_ids: due })),
            ..Default::default()
        };
        if let Err(e) = self.raw.propose(vec![], cmd.encode_to_vec()) {
            debug!("expiry not proposed: {e}");
        }
    }

    // ------------------------------------------------------------ ready

    /// The end of a loop turn: the turn's ReadIndex, the `Ready`, reads now
    /// servable, session rounds and forwards.
    pub fn end_turn(&mut self, now: Instant) -> anyhow::Result<()> {
        if let Some(ctx) = self.reads.issue(now) {
            self.raw.read_index(ctx);
        }
        if self.raw.has_ready() {
            self.handle_ready(now)?;
        }
        self.serve_ready_reads(now);
        let voters = self.voters();
        let leader = self.raw.raft.leader_id;
        let acts = {
            let sm = Arc::clone(&self.sm);
            let sm = sm.read().unwrap_or_else(|p| p.into_inner());
            let mut acts = self.sessions.flush(leader, &voters, &sm, now);
            if self.cfg.faults.keepalive_without_quorum() {
                acts.extend(self.sessions.complete_all_now(&sm));
            }
            acts
        };
        self.act(acts);
        self.randomize_election();
        Ok(())
    }

    fn serve_ready_reads(&mut self, now: Instant) {
        let applied = self.sm().applied();
        let (ready, late) = self.reads.take_ready(applied, now, self.cfg.request_timeout());
        for d in ready {
            self.serve(d.conn, &d.req, now);
        }
        for (idx, d) in late {
            self.reply_err(
                d.conn,
                d.req.id,
                ErrorCode::Timeout,
                format!("this member has applied {applied}, the read needs {idx}"),
            );
        }
    }

    fn handle_ready(&mut self, now: Instant) -> anyhow::Result<()> {
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
        self.apply_entries(rd.take_committed_entries(), now)?;
        if !rd.entries().is_empty() {
            self.raw.mut_store().append(rd.entries(), &mut batch)?;
            if self.cfg.faults.ack_before_commit() {
                self.ack_early(rd.entries());
            }
        }
        if let Some(hs) = rd.hs() {
            self.raw.mut_store().set_hard_state(hs.clone(), &mut batch)?;
        }
        self.sm_mut().flush(&mut batch);
        self.maybe_compact(&mut batch)?;
        let number = rd.number();
        // On a follower raft-rs files every message as "after persisting".
        // Forwarded proposals and ReadIndex requests carry nothing this
        // member persisted: send them now rather than behind an fsync.
        let (at_once, after): (Vec<Message>, Vec<Message>) = rd
            .take_persisted_messages()
            .into_iter()
            .partition(|m| matches!(m.get_msg_type(), MessageType::MsgPropose | MessageType::MsgReadIndex));
        self.send_messages(at_once);
        // The store already holds the new entries in memory (raft-rs reads
        // them from there); the syncer makes them durable in order, and
        // `on_persisted` sends `after` and reports the number once it has.
        self.raw.advance_append_async(rd);
        self.persist.submit(SyncJob { number, batch, sync: must_sync, after });
        self.advance_applied();
        Ok(())
    }

    /// Tells raft-rs what is applied, as far as it allows (a snapshot
    /// installed but not yet persisted is reported once it is).
    fn advance_applied(&mut self) {
        let log = &self.raw.raft.raft_log;
        let cap = log.committed.min(log.persisted);
        let applied = self.sm().applied().min(cap);
        if applied > self.raw.raft.raft_log.applied {
            self.raw.advance_apply_to(applied);
        }
    }

    /// A write the syncer finished: send what waited for it.
    pub fn on_persisted(&mut self, done: Synced) {
        self.send_messages(done.after);
        if done.number > 0 {
            self.raw.on_persist_ready(done.number);
        }
        self.advance_applied();
    }

    fn on_soft_state(&mut self, leader: u64, role: StateRole, now: Instant) {
        let term = self.raw.raft.term;
        let was_leader = self.role == StateRole::Leader;
        let is_leader = role == StateRole::Leader;
        if leader != self.leader || term != self.term || was_leader != is_leader {
            if leader != self.leader {
                info!(leader, term, ?role, "leader changed");
            }
            // Forwarded proposals may be lost with the old leader.
            let pending: Vec<(u64, PendingWrite)> = std::mem::take(&mut self.pending).into_iter().collect();
            for (_, p) in pending {
                self.reply_err(
                    p.conn,
                    p.client_id,
                    ErrorCode::LeaderChanged,
                    "leader changed; the write may or may not happen (retry with the same seq)",
                );
            }
            // ReadIndex requests go to the new leader.
            self.reads.requeue();
            let mut acts = self.sessions.leader_changed();
            if is_leader {
                // raft-rs appended this term's first (empty) entry on
                // becoming leader: applying up to here means every earlier
                // expiry is known.
                let term_start = self.raw.raft.raft_log.last_index();
                info!(term, term_start, "became leader");
                acts.extend(self.sessions.become_leader(term, term_start, now));
            }
            self.act(acts);
        }
        if leader != self.leader {
            self.leader_contact = now;
        }
        self.leader = leader;
        self.term = term;
        self.role = role;
    }

    fn send_messages(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            let to = m.to;
            self.peers.send(to, PeerOut::Raft(Box::new(m)));
        }
    }

    fn install_snapshot(&mut self, snap: Snapshot, batch: &mut Batch) -> anyhow::Result<()> {
        let index = snap.get_metadata().index;
        info!(index, bytes = snap.data.len(), "installing snapshot");
        self.sm_mut().restore(&snap.data)?;
        self.raw.mut_store().apply_snapshot(snap, batch)?;
        // Watches registered before may have missed changes in between.
        let fired = {
            let sm = Arc::clone(&self.sm);
            let sm = sm.read().unwrap_or_else(|p| p.into_inner());
            self.watches.after_snapshot(&sm)
        };
        for f in fired {
            self.send_event(&f, index);
        }
        Ok(())
    }

    fn apply_entries(&mut self, entries: Vec<Entry>, now: Instant) -> anyhow::Result<()> {
        for e in entries {
            if e.index <= self.sm().applied() {
                continue;
            }
            match e.entry_type {
                EntryType::EntryNormal if e.data.is_empty() => self.sm_mut().skip(e.index),
                EntryType::EntryNormal => self.apply_command(e.index, &e.data, now),
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    let cs = if e.entry_type == EntryType::EntryConfChange {
                        let mut cc = ConfChange::default();
                        protobuf::Message::merge_from_bytes(&mut cc, &e.data)?;
                        self.raw.apply_conf_change(&cc)?
                    } else {
                        let mut cc = ConfChangeV2::default();
                        protobuf::Message::merge_from_bytes(&mut cc, &e.data)?;
                        self.raw.apply_conf_change(&cc)?
                    };
                    let mut b = Batch::default();
                    self.raw.mut_store().set_conf_state(cs, &mut b)?;
                    self.persist.submit(SyncJob { number: 0, batch: b, sync: false, after: Vec::new() });
                    self.sm_mut().skip(e.index);
                }
            }
        }
        Ok(())
    }

    fn apply_command(&mut self, index: u64, data: &[u8], now: Instant) {
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
        let shared = Arc::clone(&self.sm);
        let mut sm = shared.write().unwrap_or_else(|p| p.into_inner());
        let applied = sm.apply(index, &cmd);
        for ch in &applied.changes {
            for f in self.watches.fire(ch) {
                self.send_event(&f, index);
            }
        }
        for sid in &applied.ended_sessions {
            self.sessions.ended(*sid);
        }
        if let Some(command::Body::NewSession(ns)) = &cmd.body {
            self.sessions.created(index, ns.timeout_ms, now);
        }
        if let (Some(log), Some(command::Body::Expire(_))) = (self.observed.as_mut(), &cmd.body) {
            log.push(AppliedExpiry { index, sessions: applied.ended_sessions.clone() });
        }
        if cmd.origin == self.cfg.id {
            if let Some(p) = self.pending.remove(&cmd.request_id) {
                if let Some(mut resp) = applied.reply {
                    resp.id = p.client_id;
                    if p.bind_session && resp.error == 0 {
                        if let (Some(c), Some(response::Body::CreateSession(cs))) =
                            (self.conns.get_mut(&p.conn), &resp.body)
                        {
                            c.session = Some(cs.session_id);
                        }
                    }
                    self.reply(p.conn, resp);
                }
            }
        }
    }

    /// Fault `ack-before-commit`: answers this member's proposals as soon
    /// as they are in its log, from a speculative copy of the state.
    fn ack_early(&mut self, entries: &[Entry]) {
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
            if let (Some(p), Some(mut resp)) = (self.pending.remove(&cmd.request_id), applied.reply) {
                resp.id = p.client_id;
                self.reply(p.conn, resp);
            }
        }
    }

    fn maybe_compact(&mut self, batch: &mut Batch) -> anyhow::Result<()> {
        let applied = self.sm().applied();
        let first = self.raw.store().first();
        if applied < first || applied - first + 1 < self.cfg.snapshot_entries {
            return Ok(());
        }
        // Keep a tail of the log so a briefly lagging follower catches up
        // from entries instead of a whole snapshot.
        let keep = self.cfg.snapshot_entries / 4;
        let data = self.sm().snapshot();
        debug!(applied, first, bytes = data.len(), "compacting log");
        self.raw.mut_store().compact(applied, data, applied.saturating_sub(keep), batch)?;
        Ok(())
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
        }
    }

    /// Fails every pending write (ambiguous) and stops the syncer after
    /// the queued writes.
    pub fn shutdown(&mut self) {
        info!("shutting down");
        let msg = "member shutting down; the write may or may not happen";
        for (_, p) in std::mem::take(&mut self.pending) {
            self.reply_err(p.conn, p.client_id, ErrorCode::Timeout, msg);
        }
        warn!(conns = self.conns.len(), "{msg}");
        self.persist.stop();
    }
}

/// Checks a watch registration: a valid path and a known kind.
fn check_spec(spec: &WatchSpec) -> Result<(), (ErrorCode, String)> {
    baton_proto::validate_path(&spec.path).map_err(|m| (ErrorCode::InvalidPath, m))?;
    WatchKind::try_from(spec.kind)
        .map(|_| ())
        .map_err(|_| (ErrorCode::BadRequest, format!("unknown watch kind {} (newer protocol?)", spec.kind)))
}

/// Checks a write before it is proposed (the state machine checks again).
fn precheck_write(req: &Request) -> Option<(ErrorCode, String)> {
    use request::Body as B;
    let mut paths: Vec<&str> = Vec::new();
    let mut data = 0usize;
    match &req.body {
        Some(B::Create(c)) => {
            paths.push(&c.path);
            data = c.data.len();
        }
        Some(B::Set(s)) => {
            paths.push(&s.path);
            data = s.data.len();
        }
        Some(B::Delete(d)) => paths.push(&d.path),
        Some(B::Multi(m)) => {
            for o in &m.ops {
                match &o.op {
                    Some(baton_proto::op::Op::Create(c)) => {
                        paths.push(&c.path);
                        data = data.max(c.data.len());
                    }
                    Some(baton_proto::op::Op::Set(s)) => {
                        paths.push(&s.path);
                        data = data.max(s.data.len());
                    }
                    Some(baton_proto::op::Op::Delete(d)) => paths.push(&d.path),
                    Some(baton_proto::op::Op::Check(c)) => paths.push(&c.path),
                    Some(baton_proto::op::Op::CheckFence(_)) => {}
                    None => return Some((ErrorCode::BadRequest, "empty op in multi".into())),
                }
            }
        }
        _ => {}
    }
    if req.seq == 0 {
        return Some((ErrorCode::BadRequest, "write without a sequence number".into()));
    }
    if data > baton_proto::MAX_DATA {
        return Some((ErrorCode::TooLarge, format!("data is {data} bytes, over {}", baton_proto::MAX_DATA)));
    }
    for p in paths {
        if let Err(m) = baton_proto::validate_path(p) {
            return Some((ErrorCode::InvalidPath, m));
        }
    }
    None
}

/// A get or exists answered from local state (no watch, no session needed).
pub fn local_read(sm: &StateMachine, body: &Option<request::Body>) -> Result<response::Body, (ErrorCode, String)> {
    use request::Body as B;
    match body {
        Some(B::Get(r)) => sm.get(&r.path).map(|(data, stat)| response::Body::Get(GetResp { data, stat: Some(stat) })),
        Some(B::Exists(r)) => sm.exists(&r.path).map(|stat| response::Body::Exists(ExistsResp { stat })),
        Some(B::Children(r)) => sm
            .children(&r.path)
            .map(|(children, stat)| response::Body::Children(ChildrenResp { children, stat: Some(stat) })),
        _ => Err((ErrorCode::BadRequest, "not a read".into())),
    }
}

/// The listener's fast path: a local read without a watch, answered from
/// the shared state without waiting for the driver thread (which may be in
/// an fsync). Linearizable reads and anything with a watch go to the driver.
pub fn fast_read(state: &SharedState, req: &Request) -> Option<Response> {
    use request::Body as B;
    let r = match &req.body {
        Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)) => r,
        _ => return None,
    };
    if !r.stale || r.watch.is_some() {
        return None;
    }
    let sm = state.read().unwrap_or_else(|p| p.into_inner());
    let zxid = sm.applied();
    Some(match local_read(&sm, &req.body) {
        Ok(body) => Response { id: req.id, zxid, body: Some(body), ..Default::default() },
        Err((code, msg)) => {
            let mut resp = error_response(zxid, code, msg);
            resp.id = req.id;
            resp
        }
    })
}
