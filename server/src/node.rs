//! The Raft driver: one OS thread owns the raft-rs `RawNode`, the state
//! machine, the watch table and every pending request.
//!
//! The fsyncs (0.2-3 ms here) run on a second thread, the [`Syncer`]
//! (raft-rs's async-ready mode): the driver queues each `Ready`'s batch and
//! goes on stepping, committing, applying and answering; the syncer writes
//! everything queued since its last write as one batch, synced if any part
//! must be (group commit), and reports back, and only then do the messages
//! that must follow the write go out. Neither thread is a tokio worker.
//!
//! One turn of the loop:
//! 1. wait for input or the next tick; take everything queued;
//! 2. step peer messages, propose writes, batch linearizable reads into one
//!    ReadIndex request; take the syncer's reports (send the persisted
//!    messages, `on_persist_ready`);
//! 3. handle the `Ready` in the order raft-rs documents: send messages,
//!    install a snapshot, apply committed entries (raft-rs hands out only
//!    entries persisted here), stage new entries and the hard state, queue
//!    the batch to the syncer, `advance_append_async`;
//! 4. answer reads whose ReadIndex is now applied.
//!
//! Replies are matched to requests by `(origin member, request id)` carried
//! in the entry, never by queue position. A pending write fails with
//! `LEADER_CHANGED` (ambiguous) when the leader changes, and with `TIMEOUT`
//! (ambiguous) after `request_timeout`; clients retry with the same sequence
//! number and exactly-once makes that safe.
//!
//! Sessions: the leader keeps every session's deadline on a monotonic clock
//! (followers forward the ids they heard from as `SessionTouch`); a session
//! past its deadline is expired by proposing an `ExpireSessions` entry. A
//! member that becomes leader starts every deadline afresh.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_proto::{
    client_write, command, request, response, AttachReq, ChildrenResp, ClientWrite, Command, Empty, ErrorCode,
    EventType, ExistsResp, ExpireSessions, GetResp, NewSession, ReadReq, Request, Response, ServerFrame, StatusResp,
    WatchEvent, WatchKind, WatchSpec,
};
use prost::Message as _;
use raft::prelude::*;
use raft::StateRole;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{debug, error, info, warn};

use crate::config::Config;
use crate::kv::{Batch, Kv};
use crate::raft_store::RaftStore;
use crate::state::{error_response, Change, StateMachine};
use crate::transport::PeerOut;

/// A client connection, as the driver knows it.
pub type ConnId = u64;

/// Everything the driver reacts to. The channel is unbounded: client input
/// is bounded per connection by the listener (`MAX_INFLIGHT` requests), and
/// peer input by raft-rs's own flow control (`max_inflight_msgs`).
pub enum Input {
    ConnOpened {
        conn: ConnId,
        tx: UnboundedSender<ServerFrame>,
    },
    ConnClosed {
        conn: ConnId,
    },
    Client {
        conn: ConnId,
        req: Request,
    },
    Peer(Box<Message>),
    Touch {
        from: u64,
        ids: Vec<u64>,
        batch: u64,
    },
    TouchAck {
        from: u64,
        batch: u64,
    },
    /// The transport could not deliver to this peer.
    Unreachable(u64),
    /// The connection this peer dialled to us closed (EOF or error): the
    /// peer process may have died.
    PeerGone(u64),
    /// The syncer finished a write (a wake-up; the details come through
    /// its own channel).
    Persisted,
    SnapshotSent {
        to: u64,
        ok: bool,
    },
    Shutdown,
}

/// Outgoing peer traffic: the driver hands messages to the transport.
pub trait PeerSink: Send + 'static {
    fn send(&self, to: u64, msg: PeerOut);
}

struct Conn {
    tx: UnboundedSender<ServerFrame>,
    session: Option<u64>,
}

#[derive(Clone)]
struct Watch {
    conn: ConnId,
    id: u64,
    kind: WatchKind,
    persistent: bool,
    /// Applied index when registered, and whether the node existed then
    /// (to tell what a snapshot install skipped over).
    since: u64,
    existed: bool,
}

/// A request waiting for its entry to be applied.
struct PendingWrite {
    conn: ConnId,
    client_id: u64,
    since: Instant,
    /// Bind the connection to the new session (CreateSession).
    bind_session: bool,
}

/// A read (or attach) waiting for its ReadIndex or for `applied` to catch up.
struct Deferred {
    conn: ConnId,
    req: Request,
    since: Instant,
}

struct ReadBatch {
    issued: Instant,
    reads: Vec<Deferred>,
}

/// How long an unanswered ReadIndex waits before it is asked again (raft-rs
/// drops it silently while the leader has not committed in its term).
const READ_INDEX_RETRY: Duration = Duration::from_millis(300);
/// Touch forwards a keepalive may wait for its acknowledgement before it is
/// dropped unanswered.
const KEEPALIVE_ACK_BATCHES: u64 = 20;
/// How many queued inputs one loop turn takes at most before handling a Ready.
const MAX_INPUTS_PER_TURN: usize = 8192;

pub struct Driver {
    cfg: Config,
    raw: RawNode<RaftStore>,
    /// Shared with the client listeners, which answer local (stale) reads
    /// without a watch straight from it; only this thread writes it.
    sm: SharedState,
    /// Writes go through `syncer` (in order), never straight to `kv`.
    syncer: Syncer,
    peers: Box<dyn PeerSink>,
    conns: HashMap<ConnId, Conn>,
    /// path -> watches on it.
    watches: HashMap<String, Vec<Watch>>,
    pending: HashMap<u64, PendingWrite>,
    next_request_id: u64,
    read_batches: BTreeMap<u64, ReadBatch>,
    next_read_ctx: u64,
    reads_to_batch: Vec<Deferred>,
    /// Reads whose index is known, waiting for `applied >= index`.
    waiting: Vec<(u64, Deferred)>,
    leader: u64,
    term: u64,
    role: StateRole,
    /// Leader only: session deadlines (monotonic).
    deadlines: HashMap<u64, Instant>,
    /// Leader only: sessions whose expiry was proposed, with when.
    expiring: HashMap<u64, Instant>,
    /// Follower: sessions heard from since the last forward to the leader.
    touched: HashSet<u64>,
    next_touch_forward: Instant,
    /// Last time a message from the current leader arrived (followers).
    leader_contact: Instant,
    /// Follower: number of the next touch forward to the leader.
    touch_batch: u64,
    /// Follower: keepalives waiting for the leader to acknowledge the
    /// forward (by batch number) that carries their session.
    keepalives: Vec<(u64, ConnId, u64)>,
}

impl Driver {
    pub fn new(cfg: Config, kv: Box<dyn Kv>, peers: Box<dyn PeerSink>) -> anyhow::Result<Self> {
        let voters: Vec<u64> = cfg.peers.keys().copied().collect();
        let store = RaftStore::load(kv.as_ref(), &voters)?;
        let mut sm = StateMachine::load(kv.as_ref())?;
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
        Ok(Driver {
            raw,
            sm: Arc::new(RwLock::new(sm)),
            syncer: Syncer::start(Arc::from(kv)),
            peers,
            conns: HashMap::new(),
            watches: HashMap::new(),
            pending: HashMap::new(),
            // Random start: an entry this member proposed before a restart
            // may commit after it, and must not match a new request.
            next_request_id: rand::random::<u64>() >> 1,
            read_batches: BTreeMap::new(),
            next_read_ctx: 1,
            reads_to_batch: Vec::new(),
            waiting: Vec::new(),
            leader: 0,
            term: 0,
            role: StateRole::Follower,
            deadlines: HashMap::new(),
            expiring: HashMap::new(),
            touched: HashSet::new(),
            next_touch_forward: Instant::now(),
            leader_contact: Instant::now(),
            touch_batch: 1,
            keepalives: Vec::new(),
            cfg,
        })
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

    /// Runs until `Input::Shutdown` or the input channel closes.
    pub fn run(mut self, rx: Receiver<Input>, input: Sender<Input>) -> anyhow::Result<()> {
        *self.syncer.wake.lock().unwrap_or_else(|p| p.into_inner()) = Some(input);
        let tick = Duration::from_millis(self.cfg.tick_ms);
        let mut next_tick = Instant::now() + tick;
        loop {
            // 1. Wait for input or the next tick, then take what is queued.
            let wait = next_tick.saturating_duration_since(Instant::now());
            let mut inputs = Vec::new();
            match rx.recv_timeout(wait) {
                Ok(i) => inputs.push(i),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            while inputs.len() < MAX_INPUTS_PER_TURN {
                match rx.try_recv() {
                    Ok(i) => inputs.push(i),
                    Err(_) => break,
                }
            }
            // 2. Step, propose, batch reads; take what the syncer persisted.
            for input in inputs {
                if matches!(input, Input::Shutdown) {
                    info!("shutting down");
                    self.fail_all(ErrorCode::Timeout, "member shutting down; the write may or may not happen");
                    self.syncer.stop();
                    return Ok(());
                }
                self.on_input(input);
            }
            self.take_persisted()?;
            self.issue_read_batch();
            if Instant::now() >= next_tick {
                self.raw.tick();
                self.on_tick();
                next_tick += tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + tick;
                }
            }
            // 3. Ready.
            if self.raw.has_ready() {
                self.handle_ready()?;
            }
            // 4. Reads that can now be served.
            self.serve_waiting();
        }
    }

    // ------------------------------------------------------------ inputs

    fn on_input(&mut self, input: Input) {
        match input {
            Input::ConnOpened { conn, tx } => {
                self.conns.insert(conn, Conn { tx, session: None });
            }
            Input::ConnClosed { conn } => {
                self.conns.remove(&conn);
                for list in self.watches.values_mut() {
                    list.retain(|w| w.conn != conn);
                }
                self.watches.retain(|_, l| !l.is_empty());
            }
            Input::Client { conn, req } => self.on_request(conn, req),
            Input::Peer(m) => {
                if m.to != self.cfg.id {
                    return;
                }
                if m.from == self.leader {
                    self.leader_contact = Instant::now();
                }
                if let Err(e) = self.raw.step(*m) {
                    debug!("step: {e}");
                }
            }
            Input::Touch { from, ids, batch } => {
                for id in ids {
                    self.touch(id);
                }
                // Only a leader refreshes deadlines; only then is it an ack.
                if self.role == StateRole::Leader {
                    self.peers.send(from, PeerOut::TouchAck(batch));
                }
            }
            Input::TouchAck { from, batch } => {
                if from == self.leader {
                    self.answer_keepalives(batch);
                }
            }
            Input::Unreachable(to) => self.raw.report_unreachable(to),
            Input::PeerGone(from) => self.leader_gone(from),
            Input::SnapshotSent { to, ok } => {
                let status = if ok { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
                self.raw.report_snapshot(to, status);
            }
            Input::Shutdown | Input::Persisted => {}
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
        let r = &mut self.raw.raft;
        if r.state != raft::StateRole::Follower || r.leader_id != from {
            return;
        }
        let base = self.cfg.election_ticks;
        let extra = 1 + (rand::random::<u64>() % 3) as usize;
        r.set_randomized_election_timeout(base + extra);
        r.election_elapsed = r.election_elapsed.max(base);
        info!(leader = from, ticks = extra, "leader's connection closed: election soon");
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

    fn on_request(&mut self, conn: ConnId, req: Request) {
        let Some(c) = self.conns.get(&conn) else { return };
        let session = c.session;
        if let Some(sid) = session {
            self.touch(sid);
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
                let secret: [u8; 16] = rand::random();
                let cmd = Command {
                    body: Some(command::Body::NewSession(NewSession {
                        timeout_ms: timeout,
                        secret: secret.to_vec().into(),
                    })),
                    ..Default::default()
                };
                self.propose(conn, id, cmd, true);
            }
            Some(B::Attach(_)) => {
                let min = match &req.body {
                    Some(B::Attach(a)) => a.last_zxid,
                    _ => 0,
                };
                self.waiting.push((min, Deferred { conn, req, since: Instant::now() }));
            }
            Some(B::Keepalive(_)) => match session {
                // A member cut off from the leader cannot vouch for the
                // session: the majority side may be expiring it right now.
                Some(_) if !self.leader_alive() => {
                    self.reply_err(conn, id, ErrorCode::NoLeader, "this member has no contact with a leader")
                }
                Some(sid) if self.sm().session_exists(sid) && self.role == StateRole::Leader => self.reply_ok(conn, id),
                // A follower answers once the leader has acknowledged the
                // touch forward that carries this session: a member whose
                // messages do not reach the leader (a one-way partition, a
                // broken link) must not keep a client believing its session
                // is alive while the leader expires it.
                Some(sid) if self.sm().session_exists(sid) => {
                    self.touched.insert(sid);
                    self.keepalives.push((self.touch_batch, conn, id));
                }
                Some(sid) => self.reply_err(conn, id, ErrorCode::SessionExpired, format!("session {sid:#x} expired")),
                None => self.reply_err(conn, id, ErrorCode::BadRequest, "no session attached to this connection"),
            },
            Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)) => {
                if let Some(Err((code, msg))) = r.watch.as_ref().map(check_spec) {
                    return self.reply_err(conn, id, code, msg);
                }
                if r.stale || self.cfg.faults.stale_reads() {
                    self.serve(conn, &req);
                } else {
                    self.reads_to_batch.push(Deferred { conn, req, since: Instant::now() });
                }
            }
            Some(B::AddWatch(w)) => {
                let Some(spec) = w.watch.clone() else {
                    return self.reply_err(conn, id, ErrorCode::BadRequest, "add_watch without a watch");
                };
                if let Err((code, msg)) = check_spec(&spec) {
                    return self.reply_err(conn, id, code, msg);
                }
                self.add_watch(conn, &spec);
                self.reply_ok(conn, id);
            }
            Some(B::RemoveWatch(rw)) => {
                for list in self.watches.values_mut() {
                    list.retain(|w| !(w.conn == conn && w.id == rw.watch_id));
                }
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
                self.propose(conn, id, cmd, false);
            }
        }
    }

    fn propose(&mut self, conn: ConnId, client_id: u64, mut cmd: Command, bind_session: bool) {
        let rid = self.next_request_id;
        self.next_request_id += 1;
        cmd.origin = self.cfg.id;
        cmd.request_id = rid;
        cmd.time_ms = now_ms();
        match self.raw.propose(vec![], cmd.encode_to_vec()) {
            Ok(()) => {
                self.pending.insert(rid, PendingWrite { conn, client_id, since: Instant::now(), bind_session });
            }
            Err(e) => self.reply_err(
                conn,
                client_id,
                ErrorCode::NoLeader,
                format!("proposal refused ({e}); no leader known, retry"),
            ),
        }
    }

    fn issue_read_batch(&mut self) {
        if self.reads_to_batch.is_empty() {
            return;
        }
        let reads = std::mem::take(&mut self.reads_to_batch);
        let ctx = self.next_read_ctx;
        self.next_read_ctx += 1;
        // The leader keeps pending ReadIndex requests by context and ignores
        // a duplicate: every member's contexts must differ, so the member id
        // goes first.
        let mut rctx = self.cfg.id.to_be_bytes().to_vec();
        rctx.extend_from_slice(&ctx.to_be_bytes());
        self.raw.read_index(rctx);
        self.read_batches.insert(ctx, ReadBatch { issued: Instant::now(), reads });
    }

    fn on_read_states(&mut self, states: Vec<ReadState>) {
        for rs in states {
            let Some(ctx) = rs.request_ctx.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok()) else { continue };
            if rs.request_ctx[..8] != self.cfg.id.to_be_bytes() {
                continue;
            }
            if let Some(batch) = self.read_batches.remove(&u64::from_be_bytes(ctx)) {
                for d in batch.reads {
                    self.waiting.push((rs.index, d));
                }
            }
        }
    }

    fn serve_waiting(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let applied = self.sm().applied();
        let now = Instant::now();
        let timeout = self.cfg.request_timeout();
        let mut still = Vec::new();
        for (idx, d) in std::mem::take(&mut self.waiting) {
            if idx <= applied {
                self.serve(d.conn, &d.req);
            } else if now.duration_since(d.since) > timeout {
                self.reply_err(
                    d.conn,
                    d.req.id,
                    ErrorCode::Timeout,
                    format!("this member has applied {applied}, the read needs {idx}"),
                );
            } else {
                still.push((idx, d));
            }
        }
        self.waiting = still;
    }

    /// Answers a read (or attach) from local state.
    fn serve(&mut self, conn: ConnId, req: &Request) {
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
            (Some(B::Attach(a)), Ok(body)) => self.attach(conn, a).map(|_| body),
            (Some(B::Get(r)) | Some(B::Exists(r)) | Some(B::Children(r)), Ok(body)) => {
                self.maybe_watch(conn, r, true);
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

    fn maybe_watch(&mut self, conn: ConnId, r: &ReadReq, _found: bool) {
        if let Some(spec) = &r.watch {
            self.add_watch(conn, spec);
        }
    }

    fn attach(&mut self, conn: ConnId, a: &AttachReq) -> Result<(), (ErrorCode, String)> {
        self.sm().check_session(a.session_id, &a.secret)?;
        if let Some(c) = self.conns.get_mut(&conn) {
            c.session = Some(a.session_id);
        }
        self.touch(a.session_id);
        for spec in &a.watches {
            check_spec(spec)?;
            match self.missed_event(spec, a.last_zxid) {
                Some(ev) => {
                    self.send_event(conn, spec.watch_id, ev, &spec.path, self.sm().applied());
                    if spec.persistent {
                        self.add_watch(conn, spec);
                    }
                }
                None => self.add_watch(conn, spec),
            }
        }
        Ok(())
    }

    /// What a watch registered at `since` would have seen by now, if anything.
    fn missed_event(&self, spec: &WatchSpec, since: u64) -> Option<EventType> {
        let stat = self.sm().stat_of(&spec.path);
        match (WatchKind::try_from(spec.kind).unwrap_or(WatchKind::Data), stat) {
            (WatchKind::Data, None) => Some(EventType::NodeDeleted),
            (WatchKind::Data, Some(s)) if s.mzxid > since => Some(EventType::NodeDataChanged),
            (WatchKind::Exists, Some(s)) if !spec.existed || s.czxid > since => Some(EventType::NodeCreated),
            (WatchKind::Exists, Some(s)) if s.mzxid > since => Some(EventType::NodeDataChanged),
            (WatchKind::Exists, None) if spec.existed => Some(EventType::NodeDeleted),
            (WatchKind::Children, None) => Some(EventType::NodeDeleted),
            (WatchKind::Children, Some(s)) if s.pzxid > since => Some(EventType::NodeChildrenChanged),
            _ => None,
        }
    }

    fn add_watch(&mut self, conn: ConnId, spec: &WatchSpec) {
        let existed = self.sm().stat_of(&spec.path).is_some();
        let since = self.sm().applied();
        let list = self.watches.entry(spec.path.clone()).or_default();
        list.retain(|w| !(w.conn == conn && w.id == spec.watch_id));
        list.push(Watch {
            conn,
            id: spec.watch_id,
            kind: WatchKind::try_from(spec.kind).unwrap_or(WatchKind::Data),
            persistent: spec.persistent,
            since,
            existed,
        });
    }

    fn send_event(&self, conn: ConnId, watch_id: u64, ty: EventType, path: &str, zxid: u64) {
        if let Some(c) = self.conns.get(&conn) {
            let ev = WatchEvent { watch_id, r#type: ty as i32, path: path.to_string(), zxid };
            let _ = c.tx.send(ServerFrame { frame: Some(baton_proto::server_frame::Frame::Event(ev)) });
        }
    }

    fn fire(&mut self, change: &Change, zxid: u64) {
        let (path, ty, kinds): (&str, EventType, &[WatchKind]) = match change {
            Change::Created(p) => (p, EventType::NodeCreated, &[WatchKind::Exists]),
            Change::Deleted(p) => {
                (p, EventType::NodeDeleted, &[WatchKind::Data, WatchKind::Exists, WatchKind::Children])
            }
            Change::DataChanged(p) => (p, EventType::NodeDataChanged, &[WatchKind::Data, WatchKind::Exists]),
            Change::ChildrenChanged(p) => (p, EventType::NodeChildrenChanged, &[WatchKind::Children]),
        };
        let Some(list) = self.watches.get_mut(path) else { return };
        let mut fired = Vec::new();
        list.retain(|w| {
            if kinds.contains(&w.kind) {
                fired.push(w.clone());
                w.persistent
            } else {
                true
            }
        });
        if list.is_empty() {
            self.watches.remove(path);
        }
        for w in fired {
            self.send_event(w.conn, w.id, ty, path, zxid);
        }
    }

    // ------------------------------------------------------------ sessions

    /// True on a leader, or on a follower that heard from its leader within
    /// an election timeout.
    fn leader_alive(&self) -> bool {
        match self.role {
            StateRole::Leader => true,
            _ => {
                let timeout = Duration::from_millis(self.cfg.tick_ms * self.cfg.election_ticks as u64);
                self.leader != 0 && self.leader_contact.elapsed() < timeout
            }
        }
    }

    fn touch(&mut self, sid: u64) {
        if self.role == StateRole::Leader {
            let timeout = self.sm().session_timeout(sid);
            if let Some(timeout) = timeout {
                self.deadlines.insert(sid, Instant::now() + Duration::from_millis(timeout as u64));
            }
        } else {
            self.touched.insert(sid);
        }
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
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
        // ReadIndex requests raft-rs may have dropped: ask again, or give up.
        let stale: Vec<u64> = self
            .read_batches
            .iter()
            .filter(|(_, b)| now.duration_since(b.issued) > READ_INDEX_RETRY)
            .map(|(k, _)| *k)
            .collect();
        for ctx in stale {
            if let Some(b) = self.read_batches.remove(&ctx) {
                for d in b.reads {
                    if now.duration_since(d.since) > timeout {
                        self.reply_err(
                            d.conn,
                            d.req.id,
                            ErrorCode::Timeout,
                            "no ReadIndex within the request timeout (no leader?)",
                        );
                    } else {
                        self.reads_to_batch.push(d);
                    }
                }
            }
        }
        self.issue_read_batch();

        if self.role == StateRole::Leader {
            self.expire_sessions(now);
        } else {
            // Keepalives whose forward was never acknowledged go unanswered;
            // the client's own timer then moves it elsewhere.
            let stale = self.touch_batch.saturating_sub(KEEPALIVE_ACK_BATCHES);
            self.keepalives.retain(|(b, _, _)| *b >= stale);
            let due = now >= self.next_touch_forward || !self.keepalives.is_empty();
            if due && !self.touched.is_empty() && self.leader != 0 {
                let ids: Vec<u64> = self.touched.drain().collect();
                self.peers.send(self.leader, PeerOut::Touch { ids, batch: self.touch_batch });
                self.touch_batch += 1;
                self.next_touch_forward = now + Duration::from_millis(self.cfg.tick_ms * 2);
            }
        }
    }

    /// The leader acknowledged touch forwards up to `batch`: answer the
    /// keepalives they carried.
    fn answer_keepalives(&mut self, batch: u64) {
        let (done, wait): (Vec<_>, Vec<_>) = self.keepalives.drain(..).partition(|(b, _, _)| *b <= batch);
        self.keepalives = wait;
        for (_, conn, id) in done {
            let sid = self.conns.get(&conn).and_then(|c| c.session);
            match sid {
                Some(s) if self.sm().session_exists(s) => self.reply_ok(conn, id),
                Some(s) => self.reply_err(conn, id, ErrorCode::SessionExpired, format!("session {s:#x} expired")),
                None => {}
            }
        }
    }

    fn expire_sessions(&mut self, now: Instant) {
        let live: HashMap<u64, u32> = self.sm().sessions().collect();
        self.deadlines.retain(|id, _| live.contains_key(id));
        self.expiring.retain(|id, _| live.contains_key(id));
        for (id, timeout) in &live {
            let grace = if self.cfg.faults.expire_without_grace() { 0 } else { *timeout as u64 };
            self.deadlines.entry(*id).or_insert_with(|| now + Duration::from_millis(grace));
        }
        let retry = self.cfg.request_timeout();
        let due: Vec<u64> = self
            .deadlines
            .iter()
            .filter(|(id, d)| **d <= now && self.expiring.get(id).is_none_or(|t| now.duration_since(*t) > retry))
            .map(|(id, _)| *id)
            .collect();
        if due.is_empty() {
            return;
        }
        info!(sessions = ?due, "expiring sessions");
        let cmd = Command {
            origin: self.cfg.id,
            time_ms: now_ms(),
            body: Some(command::Body::Expire(ExpireSessions { session_ids: due.clone() })),
            ..Default::default()
        };
        if self.raw.propose(vec![], cmd.encode_to_vec()).is_ok() {
            for id in due {
                self.expiring.insert(id, now);
            }
        }
    }

    // ------------------------------------------------------------ ready

    fn handle_ready(&mut self) -> anyhow::Result<()> {
        let mut rd = self.raw.ready();
        let mut batch = Batch::default();
        // New entries, a snapshot or a changed term/vote must be on disk
        // before anyone hears that we have them; a Ready with only commits
        // and messages needs no fsync.
        let must_sync = rd.must_sync() || !rd.snapshot().is_empty();

        if let Some(ss) = rd.ss() {
            self.on_soft_state(ss.leader_id, ss.raft_state);
        }
        // Messages the leader may send before persisting (thesis 10.2.1).
        self.send_messages(rd.take_messages());
        if !rd.snapshot().is_empty() {
            self.install_snapshot(rd.snapshot().clone(), &mut batch)?;
        }
        self.on_read_states(rd.take_read_states());
        // Committed entries come only once they are persisted here too.
        self.apply_entries(rd.take_committed_entries())?;
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
        let (now, after): (Vec<Message>, Vec<Message>) = rd
            .take_persisted_messages()
            .into_iter()
            .partition(|m| matches!(m.get_msg_type(), MessageType::MsgPropose | MessageType::MsgReadIndex));
        self.send_messages(now);
        // The store already holds the new entries in memory (raft-rs reads
        // them from there); the syncer makes them durable in order, and
        // `take_persisted` sends `after` and reports the number once it has.
        // Meanwhile this thread goes on: commits, applies, reads, watches
        // and forwards no longer wait behind an fsync.
        self.raw.advance_append_async(rd);
        self.syncer.submit(SyncJob { number, batch, sync: must_sync, after });
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

    /// Sends the messages of persisted Readies and tells raft-rs.
    fn take_persisted(&mut self) -> anyhow::Result<()> {
        while let Some(done) = self.syncer.poll()? {
            self.send_messages(done.after);
            if done.number > 0 {
                self.raw.on_persist_ready(done.number);
            }
        }
        self.advance_applied();
        Ok(())
    }

    fn on_soft_state(&mut self, leader: u64, role: StateRole) {
        let term = self.raw.raft.term;
        if leader != self.leader || term != self.term {
            if leader != self.leader {
                info!(leader, term, ?role, "leader changed");
            }
            // Forwarded proposals may be lost with the old leader.
            let pending: Vec<(u64, PendingWrite)> = self.pending.drain().collect();
            for (_, p) in pending {
                self.reply_err(
                    p.conn,
                    p.client_id,
                    ErrorCode::LeaderChanged,
                    "leader changed; the write may or may not happen (retry with the same seq)",
                );
            }
            // ReadIndex requests go to the new leader.
            let batches = std::mem::take(&mut self.read_batches);
            for (_, b) in batches {
                self.reads_to_batch.extend(b.reads);
            }
        }
        if role != self.role {
            self.deadlines.clear();
            self.expiring.clear();
            if role == StateRole::Leader {
                // A new leader gives every session a full, fresh timeout; the
                // next tick fills `deadlines` from the state machine.
                info!(term, "became leader");
            }
        }
        if leader != self.leader {
            self.leader_contact = Instant::now();
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
        let mut events = Vec::new();
        for (path, list) in &self.watches {
            for w in list {
                let spec = WatchSpec {
                    watch_id: w.id,
                    path: path.clone(),
                    kind: w.kind as i32,
                    persistent: w.persistent,
                    existed: w.existed,
                };
                if let Some(ev) = self.missed_event(&spec, w.since) {
                    events.push((w.clone(), path.clone(), ev));
                }
            }
        }
        for (w, path, ev) in events {
            self.send_event(w.conn, w.id, ev, &path, index);
            if !w.persistent {
                if let Some(list) = self.watches.get_mut(&path) {
                    list.retain(|x| !(x.conn == w.conn && x.id == w.id));
                }
            }
        }
        Ok(())
    }

    fn apply_entries(&mut self, entries: Vec<Entry>) -> anyhow::Result<()> {
        for e in entries {
            if e.index <= self.sm().applied() {
                continue;
            }
            match e.entry_type {
                EntryType::EntryNormal if e.data.is_empty() => self.sm_mut().skip(e.index),
                EntryType::EntryNormal => self.apply_command(e.index, &e.data),
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
                    self.syncer.submit(SyncJob { number: 0, batch: b, sync: false, after: Vec::new() });
                    self.sm_mut().skip(e.index);
                }
            }
        }
        Ok(())
    }

    fn apply_command(&mut self, index: u64, data: &[u8]) {
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
            self.fire(ch, index);
        }
        for sid in &applied.ended_sessions {
            self.deadlines.remove(sid);
            self.expiring.remove(sid);
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

    fn status(&self) -> StatusResp {
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
            voters: self.cfg.peers.keys().copied().collect(),
        }
    }

    fn fail_all(&mut self, code: ErrorCode, msg: &str) {
        let pending: Vec<(u64, PendingWrite)> = self.pending.drain().collect();
        for (_, p) in pending {
            self.reply_err(p.conn, p.client_id, code, msg);
        }
        warn!(conns = self.conns.len(), "{msg}");
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

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The state machine as the driver and the listeners share it.
pub type SharedState = Arc<RwLock<StateMachine>>;

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

/// One Ready's writes, for the syncer.
pub struct SyncJob {
    /// The Ready's number (0: nothing raft-rs waits for).
    number: u64,
    batch: Batch,
    sync: bool,
    /// Messages to send once the batch is on disk.
    after: Vec<Message>,
}

struct Synced {
    number: u64,
    after: Vec<Message>,
}

/// The storage writer: one thread that takes every batch the driver
/// queued since its last write, writes them as one RocksDB batch, synced if
/// any of them must be (a group commit across Readies), and reports back.
/// All writes go through it, so they reach the WAL in the order the driver
/// made them and a crash loses only a suffix.
struct Syncer {
    jobs: Option<Sender<SyncJob>>,
    done: Receiver<anyhow::Result<Synced>>,
    /// The driver's input channel, to wake it after a write (set by `run`).
    wake: Arc<std::sync::Mutex<Option<Sender<Input>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncer {
    fn start(kv: Arc<dyn Kv>) -> Syncer {
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<SyncJob>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let wake: Arc<std::sync::Mutex<Option<Sender<Input>>>> = Arc::new(std::sync::Mutex::new(None));
        let waker = wake.clone();
        let thread = std::thread::Builder::new()
            .name("baton-syncer".into())
            .spawn(move || {
                while let Ok(first) = jobs_rx.recv() {
                    let mut jobs = vec![first];
                    while let Ok(j) = jobs_rx.try_recv() {
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
                    let r = if batch.is_empty() { Ok(()) } else { kv.write(batch, sync) };
                    let failed = r.is_err();
                    let out = r.map(|_| Synced { number, after }).map_err(anyhow::Error::from);
                    if done_tx.send(out).is_err() {
                        return;
                    }
                    if let Some(w) = waker.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                        let _ = w.send(Input::Persisted);
                    }
                    if failed {
                        return;
                    }
                }
            })
            .ok();
        Syncer { jobs: Some(jobs_tx), done: done_rx, wake, thread }
    }

    fn submit(&mut self, job: SyncJob) {
        if job.batch.is_empty() && job.after.is_empty() && job.number == 0 {
            return;
        }
        if let Some(j) = &self.jobs {
            let _ = j.send(job);
        }
    }

    /// A finished write, if any (an error stops the member).
    fn poll(&mut self) -> anyhow::Result<Option<Synced>> {
        match self.done.try_recv() {
            Ok(r) => r.map(Some),
            Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                if self.jobs.is_some() {
                    anyhow::bail!("storage writer stopped")
                }
                Ok(None)
            }
        }
    }

    /// Finishes the queued writes and stops the thread.
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
