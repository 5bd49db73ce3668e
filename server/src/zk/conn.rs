//! One ZooKeeper connection: the handshake, then requests translated to
//! Baton's and replies translated back, in request order (mod.rs says
//! why each rule holds).
//!
//! This file holds the connection: its handshake, the request order and
//! classes, the session rule's gate and the writer. Each opcode's
//! translation, in and out, is in one file beside it:
//! - `conn/nodes.rs`: create (every kind), delete, setData, setACL;
//! - `conn/reads.rs`: exists, getData, getChildren, getACL, sync;
//! - `conn/multi.rs`: multi (and check), multiRead;
//! - `conn/watches.rs`: addWatch, setWatches, checkWatches, removeWatches;
//! - `conn/session.rs`: ping, auth, closeSession, whoAmI, getEphemerals,
//!   getAllChildrenNumber.
//!
//! [`Gateway::dispatch`] sends a request to its file, and `build` asks
//! that file for the reply.

mod multi;
mod nodes;
mod reads;
mod session;
mod watches;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_proto::jute::{
    self, err, op, xid, ConnectRequest, ConnectResponse, OpResult, ReplyHeader, Request, Response,
};
use baton_proto::tls::BoxStream;
use baton_proto::{
    op as bop, request, response, server_frame, Acl, AddWatchReq, AttachReq, CheckOp, CloseSessionReq, CreateOp,
    CreateSessionReq, DeleteOp, ErrorCode, KeepaliveReq, MultiOp, ReadReq, RemoveWatchReq, SetAclOp, SetOp, Stat,
    WatchKind, WatchSpec, WhoAmIReq,
};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::debug;

use super::stats::{self, Stats};
use super::vouch::{Answer, Vouch};
use super::{words, ZkSettings, SEQ_GAP};
use crate::config::Config;
use crate::message::{ConnTx, Input, InputTx};
use crate::shutdown::Signal;
use crate::view::{read, SharedState};
use baton_proto::ClaimSessionReq;

/// Time a client has to send its connect request (or a four-letter word).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// ZooKeeper's protocol version in connect replies.
const PROTOCOL_VERSION: i32 = 0;

type Wr = FramedWrite<tokio::io::WriteHalf<BoxStream>, tokio_util::codec::LengthDelimitedCodec>;
type Rd = FramedRead<tokio::io::ReadHalf<BoxStream>, tokio_util::codec::LengthDelimitedCodec>;

/// An accepted connection: its id, its peer, and the common name of its
/// client certificate (TLS with one).
pub(super) struct Accepted {
    pub conn: u64,
    pub peer: std::net::SocketAddr,
    pub cert_name: Option<String>,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn handle(
    mut stream: BoxStream,
    at: Accepted,
    input: InputTx,
    cfg: &Config,
    zk: &ZkSettings,
    stats: &Arc<Stats>,
    state: SharedState,
    signal: Signal,
) {
    // The first 4 bytes: a four-letter word, or the connect frame's length.
    let mut head = [0u8; 4];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut head)).await {
        Ok(Ok(_)) => {}
        _ => return,
    }
    if head.iter().all(u8::is_ascii_lowercase) {
        let word = String::from_utf8_lossy(&head).to_string();
        words::answer(stream, &word, &input, cfg, zk, stats, &state).await;
        return;
    }
    let len = i32::from_be_bytes(head);
    if len <= 0 || len as usize > cfg.max_frame {
        debug!(len, "zookeeper: bad connect frame length; closing");
        return;
    }
    let mut frame = vec![0u8; len as usize];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut frame)).await {
        Ok(Ok(_)) => {}
        _ => return,
    }
    let connect = match ConnectRequest::decode(&frame) {
        Ok(c) => c,
        Err(e) => {
            // A Baton client dialled the wrong port: tell it so.
            if let Some(reply) = baton_proto::not_a_client_port(&frame, "a ZooKeeper port") {
                let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.write_all(&reply)).await;
            }
            debug!("zookeeper: undecodable connect request ({e}); closing");
            return;
        }
    };
    let Accepted { conn, peer, cert_name } = at;
    let (tx, rx) = ConnTx::new(cfg.limits.max_queued_bytes);
    if let Some(cn) = cert_name {
        tx.add_identity(format!("x509:{cn}"));
    }
    if input.send(Input::ConnOpened { conn, tx: tx.clone() }).is_err() {
        return;
    }
    let (rd, wr) = tokio::io::split(stream);
    let mut g = Gateway {
        conn,
        tx,
        flags: crate::settings::from_flags(cfg),
        input,
        state,
        rx,
        w: FramedWrite::new(wr, baton_proto::codec(usize::MAX)),
        linearizable: zk.linearizable_reads,
        loss_reply: cfg.faults.zk_loss_reply(),
        session: 0,
        timeout_ms: 0,
        stats: None,
        secret: Vec::new(),
        next_id: 1,
        next_seq: 1,
        epoch: 0,
        resume_without_claim: cfg.faults.zk_resume_without_claim(),
        speak_unvouched: cfg.faults.zk_speak_unvouched(),
        writes: std::collections::BTreeSet::new(),
        queue: VecDeque::new(),
        by_id: HashMap::new(),
        vouch: Vouch::new(Duration::ZERO, Instant::now()),
        out: VecDeque::new(),
        out_bytes: 0,
        max_out: cfg.limits.max_queued_bytes,
        max_multi_ops: cfg.limits.max_multi_ops,
        notified: (0, Vec::new()),
        max_reply_bytes: cfg.limits.max_reply_bytes,
        watches: HashMap::new(),
        next_watch: 1,
        closing: false,
        outstanding: 0,
        class: Class::Local,
        waiting: VecDeque::new(),
    };
    if g.connect(&connect, cfg).await {
        g.stats = Some(stats.open(conn, peer, g.session, g.timeout_ms as u64));
        let frames = FramedRead::new(rd, baton_proto::codec(cfg.max_frame));
        g.run(frames, cfg.limits.max_inflight, signal).await;
    }
    let _ = g.input.send(Input::ConnClosed { conn });
}

/// One ZooKeeper request waiting for its Baton responses.
struct Zreq {
    xid: i32,
    op: i32,
    what: What,
    /// Baton responses still to come.
    want: usize,
    got: Vec<baton_proto::Response>,
    /// Sequence numbers of its writes (forgotten once answered).
    seqs: Vec<u64>,
    /// The reply, once built.
    reply: Option<Vec<u8>>,
    /// Bytes of the responses in `got`; past `--max-reply-bytes` their
    /// bodies are dropped and the reply is refused (a `multiRead`).
    bytes: usize,
    /// When its frame was read.
    at: Instant,
}

/// What a request needs to build its reply.
enum What {
    /// Answered from `got[0]` by opcode.
    Plain,
    /// A sync: its reply names its path.
    Sync {
        path: String,
    },
    /// A read that registered watch `watch` (dropped again if the read failed).
    Watched {
        watch: Option<u64>,
    },
    /// An addWatch or setWatches whose watches `ids` were recorded here
    /// (dropped again if the driver refused them).
    Watches {
        ids: Vec<u64>,
    },
    /// The opcodes of the multi's operations.
    Multi {
        ops: Vec<i32>,
    },
    MultiRead {
        ops: Vec<i32>,
    },
    Close,
    /// Already answered (`reply` is set).
    Done,
}

struct Gateway {
    conn: u64,
    /// The connection as the driver knows it: `auth` adds identities here,
    /// which the driver checks ACLs against (acl.rs).
    tx: ConnTx,
    /// This member's flags' settings, followed until the cluster record
    /// has its own (settings.rs), for the ACL checks made here
    /// (getAllChildrenNumber).
    flags: baton_proto::ClusterSettings,
    input: InputTx,
    state: SharedState,
    rx: UnboundedReceiver<baton_proto::ServerFrame>,
    w: Wr,
    linearizable: bool,
    /// The `zk-loss-reply` server fault (faults.rs): send CONNECTION_LOSS
    /// replies instead of closing.
    loss_reply: bool,
    session: u64,
    /// The session's negotiated timeout.
    timeout_ms: i32,
    /// This connection's counters (stats.rs), from the handshake's answer.
    stats: Option<stats::Opened>,
    secret: Vec<u8>,
    next_id: u64,
    next_seq: u64,
    /// The session epoch this connection's writes go under: 0 for a
    /// session it created, else its claim's index (state/mod.rs).
    epoch: u64,
    /// The `zk-resume-without-claim` server fault (faults.rs).
    resume_without_claim: bool,
    /// The `zk-speak-unvouched` server fault (faults.rs).
    speak_unvouched: bool,
    /// Sequence numbers of this connection's writes without a reply.
    writes: std::collections::BTreeSet<u64>,
    /// Requests in the order they came, by serial (= the first Baton id).
    queue: VecDeque<u64>,
    /// Baton id -> the serial of the request it belongs to.
    by_id: HashMap<u64, u64>,
    /// The session rule (vouch.rs): when a packet may be written, and the
    /// gateway's own keepalives.
    vouch: Vouch,
    /// Frames ready to be written, in the order they became ready (a
    /// reply once every earlier request's is out, events and ping answers
    /// as they come); held while [`Vouch::may_send`] says no.
    out: VecDeque<Out>,
    /// Bytes in `out`; over `max_out` the connection closes, as a native
    /// one whose client does not read.
    out_bytes: usize,
    max_out: usize,
    /// `--max-multi-ops` and `--max-reply-bytes`, for a `multiRead`'s ops
    /// and its whole reply (each of its reads is capped by the driver).
    max_multi_ops: usize,
    max_reply_bytes: usize,
    /// The notifications sent for the latest entry's changes: its index,
    /// and (event type, path) of each.
    notified: (u64, Vec<(i32, String)>),
    /// This connection's watches by id (a one-shot watch is forgotten when
    /// it fires).
    watches: HashMap<u64, Watch>,
    next_watch: u64,
    closing: bool,
    /// Requests sent to the driver and not answered yet, all of `class`.
    outstanding: usize,
    class: Class,
    /// Requests held back until those of another class are answered, in
    /// the order they came (mod.rs: "one session's requests in order").
    waiting: VecDeque<(i32, i32, Request)>,
}

/// A watch this connection set, as `removeWatches` and `checkWatches`
/// look for it.
struct Watch {
    path: String,
    kind: WatchKind,
    persistent: bool,
}

impl Watch {
    /// True when ZooKeeper's watcher type `t` (1 children, 2 data, 3 any,
    /// 4 persistent, 5 persistent recursive) covers this watch. A data
    /// watch is ZooKeeper's data or exists watch; a persistent watch is
    /// Baton's pair of persistent exists and children watches.
    fn is_of(&self, t: i32) -> bool {
        use WatchKind as K;
        match t {
            1 => !self.persistent && self.kind == K::Children,
            2 => !self.persistent && matches!(self.kind, K::Data | K::Exists),
            3 => true,
            4 => self.persistent && self.kind != K::Recursive,
            5 => self.kind == K::Recursive,
            _ => false,
        }
    }
}

/// How a request reaches the state; only requests of one class are in
/// flight at a time, so the driver answers them in the order they came.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    /// Served from this member's state at once (by the driver or here).
    Local,
    /// After a ReadIndex round.
    Linear,
    /// Through the log.
    Write,
    /// Answered by the port itself from this member's state
    /// (getAllChildrenNumber, getEphemerals, checkWatches, removeWatches):
    /// only once every earlier request is answered, so its reply never
    /// shows an older state than theirs (finding Z10).
    Here,
}

fn class_of(req: &Request, linearizable: bool) -> Class {
    match req {
        Request::Create { .. }
        | Request::Delete { .. }
        | Request::SetData { .. }
        | Request::SetAcl { .. }
        | Request::Multi(_)
        | Request::CloseSession => Class::Write,
        Request::Sync { .. } | Request::SetWatches { .. } => Class::Linear,
        Request::GetAllChildrenNumber { .. }
        | Request::GetEphemerals { .. }
        | Request::CheckWatches { .. }
        | Request::RemoveWatches { .. } => Class::Here,
        Request::Exists { .. }
        | Request::GetData { .. }
        | Request::GetChildren { .. }
        | Request::GetAcl { .. }
        | Request::MultiRead(_)
            if linearizable =>
        {
            Class::Linear
        }
        _ => Class::Local,
    }
}

/// Requests keyed by serial live in this map beside the queue.
type Zreqs = HashMap<u64, Zreq>;

impl Gateway {
    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn send(&self, req: baton_proto::Request) -> bool {
        self.input.send(Input::Client { conn: self.conn, req }).is_ok()
    }

    /// Waits for the response to Baton request `id` (the handshake's; no
    /// event can come before it).
    async fn response_to(&mut self, id: u64, limit: Duration) -> Option<baton_proto::Response> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let f = tokio::time::timeout_at(deadline, self.rx.recv()).await.ok()??;
            if let Some(server_frame::Frame::Response(r)) = f.frame {
                if r.id == id {
                    return Some(r);
                }
            }
        }
    }

    /// The handshake: a new session or a resumed one. False: close.
    async fn connect(&mut self, c: &ConnectRequest, cfg: &Config) -> bool {
        let limit = Duration::from_millis(cfg.request_timeout_ms.max(1000) * 2);
        let id = self.id();
        if c.session_id == 0 {
            let timeout_ms = c.timeout_ms.max(0) as u32;
            let body = request::Body::CreateSession(CreateSessionReq { timeout_ms });
            if !self.send(baton_proto::Request { id, body: Some(body), ..Default::default() }) {
                return false;
            }
            let Some(r) = self.response_to(id, limit).await else { return false };
            let Some(response::Body::CreateSession(s)) = r.body else {
                debug!(error = r.error, "zookeeper: session not created: {}", r.message);
                return false;
            };
            self.session = s.session_id;
            self.secret = s.secret.to_vec();
            self.next_seq = 1;
            return self.connected(s.timeout_ms as i32).await;
        }
        let sid = c.session_id as u64;
        let attach = AttachReq {
            session_id: sid,
            secret: c.passwd.clone().into(),
            last_zxid: c.last_zxid_seen.max(0) as u64,
            watches: vec![],
        };
        if !self.send(baton_proto::Request { id, body: Some(request::Body::Attach(attach)), ..Default::default() }) {
            return false;
        }
        let Some(r) = self.response_to(id, limit).await else { return false };
        match ErrorCode::try_from(r.error) {
            Ok(ErrorCode::Ok) => {
                let (timeout, next) = {
                    let sm = read(&self.state);
                    (sm.session_timeout(sid), sm.session_next_seq(sid))
                };
                let (Some(timeout), Some((next, epoch))) = (timeout, next) else { return self.expired().await };
                self.session = sid;
                self.secret = c.passwd.clone();
                if self.resume_without_claim {
                    // Deliberate bug (Z2): number from the applied state.
                    self.next_seq = next + SEQ_GAP;
                    self.epoch = epoch;
                } else if !self.claim(limit).await {
                    return false;
                }
                self.connected(timeout as i32).await
            }
            Ok(ErrorCode::SessionExpired) | Ok(ErrorCode::SessionMoved) => self.expired().await,
            _ => {
                debug!(error = r.error, "zookeeper: session {sid:#x} not resumed here: {}", r.message);
                false
            }
        }
    }

    /// Claims the resumed session for this connection through the log
    /// (mod.rs, "Writes"): this connection's writes go under the claim's
    /// index as their epoch, numbered from 1. False: close (the client
    /// tries again, here or elsewhere).
    async fn claim(&mut self, limit: Duration) -> bool {
        let id = self.id();
        let body = request::Body::ClaimSession(ClaimSessionReq {});
        if !self.send(baton_proto::Request { id, seq: 1, body: Some(body), ..Default::default() }) {
            return false;
        }
        match self.response_to(id, limit).await {
            Some(r) if r.error == ErrorCode::Ok as i32 => {
                self.epoch = r.zxid;
                self.next_seq = 1;
                true
            }
            Some(r) => {
                debug!(error = r.error, "zookeeper: session {:#x} not claimed here: {}", self.session, r.message);
                false
            }
            None => false,
        }
    }

    /// Answers the connect, once a keepalive of the session was vouched
    /// for (vouch.rs: the answer is a packet like any other).
    async fn connected(&mut self, timeout_ms: i32) -> bool {
        self.timeout_ms = timeout_ms;
        let t = Duration::from_millis(timeout_ms.max(0) as u64);
        let now = Instant::now();
        self.vouch = Vouch::new(t, now);
        let id = self.id();
        self.vouch.sent(id, now);
        let body = request::Body::Keepalive(KeepaliveReq {});
        if !self.send(baton_proto::Request { id, body: Some(body), ..Default::default() }) {
            return false;
        }
        let r = self.response_to(id, t.max(Duration::from_secs(1))).await;
        match r.map(|r| keepalive_answer(r.error)) {
            Some(Answer::Vouched) => self.vouch.answered(Answer::Vouched, Instant::now()),
            Some(Answer::Expired) => return self.expired().await,
            _ => {
                debug!(session = self.session, "zookeeper: no keepalive vouched for at connect; closing");
                return false;
            }
        }
        let resp = ConnectResponse {
            protocol_version: PROTOCOL_VERSION,
            timeout_ms,
            session_id: self.session as i64,
            passwd: self.secret.clone(),
            read_only: false,
        };
        self.w.send(bytes::Bytes::from(resp.encode())).await.is_ok()
    }

    /// ZooKeeper's answer to a session it will not resume.
    async fn expired(&mut self) -> bool {
        let resp = ConnectResponse {
            protocol_version: PROTOCOL_VERSION,
            timeout_ms: 0,
            session_id: 0,
            passwd: vec![0; 16],
            read_only: false,
        };
        let _ = self.w.send(bytes::Bytes::from(resp.encode())).await;
        false
    }

    async fn run(&mut self, mut frames: Rd, max_inflight: usize, mut signal: Signal) {
        let mut reqs: Zreqs = HashMap::new();
        let gauge = self.tx.gauge();
        loop {
            let now = Instant::now();
            if self.vouch.due(now) && !self.keepalive(now) {
                return;
            }
            let wake = tokio::time::Instant::from_std(self.vouch.next_wake(now));
            let room = self.queue.len() + self.waiting.len() < max_inflight && !self.closing;
            tokio::select! {
                f = frames.next(), if room => {
                    let Some(Ok(frame)) = f else { return };
                    self.vouch.heard(Instant::now());
                    crate::metrics::client_bytes(frame.len(), 0);
                    if let Some(s) = &self.stats {
                        s.received();
                    }
                    let Ok((x, o, req)) = Request::decode(&frame) else {
                        debug!("zookeeper: undecodable request; closing");
                        return;
                    };
                    if !self.request(&mut reqs, x, o, req) {
                        return;
                    }
                }
                f = self.rx.recv() => {
                    let Some(f) = f else { return };
                    // Off the driver's queue: credit the gauge the driver
                    // charged (finding Z4: uncredited, every connection went
                    // silent after 64 MiB of replies in all).
                    gauge.written(prost::Message::encoded_len(&f));
                    match f.frame {
                        Some(server_frame::Frame::Response(r)) if self.vouch.is_mine(r.id) => {
                            let answer = keepalive_answer(r.error);
                            self.vouch.answered(answer, Instant::now());
                            if answer == Answer::Expired {
                                // The client learns it at its next connect.
                                debug!(session = self.session, "zookeeper: session expired; closing");
                                return;
                            }
                        }
                        Some(server_frame::Frame::Response(r)) => {
                            self.response(&mut reqs, r);
                            if !self.release_waiting(&mut reqs) {
                                return;
                            }
                        }
                        Some(server_frame::Frame::Event(e)) => {
                            if let Some(frame) = self.event(e) {
                                if let Some(s) = &self.stats {
                                    s.sent();
                                }
                                self.push(Out::Frame(frame));
                            }
                        }
                        None => {}
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
                _ = gauge.closed().cancelled() => return,
                _ = signal.wait() => return,
            }
            self.collect(&mut reqs);
            if self.out_bytes > self.max_out {
                tracing::warn!(
                    queued = self.out_bytes,
                    "a ZooKeeper client is not reading its replies and events: closing its connection"
                );
                return;
            }
            let now = Instant::now();
            if !self.drain(now).await {
                return;
            }
            self.vouch.holding(!self.out.is_empty(), now);
            if self.vouch.must_close(now) {
                debug!(session = self.session, "zookeeper: no keepalive vouched for in time; closing");
                return;
            }
            if self.closing && self.queue.is_empty() && self.out.is_empty() {
                return;
            }
        }
    }

    /// Sends the gateway's keepalive for the session (vouch.rs). False:
    /// the driver is gone.
    fn keepalive(&mut self, now: Instant) -> bool {
        let id = self.id();
        self.vouch.sent(id, now);
        let body = request::Body::Keepalive(KeepaliveReq {});
        self.send(baton_proto::Request { id, body: Some(body), ..Default::default() })
    }

    fn push(&mut self, o: Out) {
        if let Out::Frame(f) = &o {
            self.out_bytes += f.len();
        }
        self.out.push_back(o);
    }

    /// Moves the replies that are due, in request order, to `out`.
    fn collect(&mut self, reqs: &mut Zreqs) {
        while let Some(serial) = self.queue.front().copied() {
            let Some(reply) = reqs.get_mut(&serial).and_then(|z| z.reply.take()) else { break };
            self.queue.pop_front();
            let z = reqs.remove(&serial);
            if lost_connection(&reply) && !self.loss_reply {
                // What ZooKeeper's clients call a connection loss happens
                // here for real: the replies before it go out, this and
                // every later one do not, and the client reconnects.
                self.push(Out::Close);
                return;
            }
            let close = z.as_ref().is_some_and(|z| matches!(z.what, What::Close));
            if let (Some(s), Some(z)) = (&self.stats, &z) {
                let zxid = reply.get(4..12).and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes);
                s.replied(stats::op_name(z.op), z.xid, zxid, z.at.elapsed());
            }
            self.push(Out::Frame(reply));
            if close {
                self.push(Out::Close);
                return;
            }
        }
    }

    /// Writes what `out` holds while the session rule allows. False: close.
    async fn drain(&mut self, now: Instant) -> bool {
        let mut wrote = false;
        while let Some(o) = self.out.front() {
            match o {
                Out::Close => {
                    debug!("zookeeper: closing after the replies before it");
                    let _ = SinkExt::<bytes::Bytes>::flush(&mut self.w).await;
                    return false;
                }
                Out::Frame(_) if !self.vouch.may_send(now) && !self.speak_unvouched => break,
                Out::Frame(_) => {
                    let Some(Out::Frame(f)) = self.out.pop_front() else { break };
                    self.out_bytes -= f.len();
                    crate::metrics::client_bytes(0, f.len());
                    if self.w.feed(bytes::Bytes::from(f)).await.is_err() {
                        return false;
                    }
                    wrote = true;
                }
            }
        }
        !wrote || SinkExt::<bytes::Bytes>::flush(&mut self.w).await.is_ok()
    }

    fn applied(&self) -> i64 {
        read(&self.state).applied() as i64
    }

    /// Queues a request that needs no Baton request: its reply is ready.
    fn answer(&mut self, reqs: &mut Zreqs, x: i32, o: i32, header_err: i32, body: Response) {
        let serial = self.id();
        let reply = Response::encode(ReplyHeader { xid: x, zxid: self.applied(), err: header_err }, &body);
        reqs.insert(
            serial,
            Zreq {
                xid: x,
                op: o,
                what: What::Done,
                want: 0,
                got: vec![],
                seqs: vec![],
                reply: Some(reply),
                bytes: 0,
                at: Instant::now(),
            },
        );
        self.queue.push_back(serial);
    }

    /// Sends `bodies` for ZooKeeper request `x` (writes get sequence
    /// numbers). False: the driver is gone.
    fn forward(&mut self, reqs: &mut Zreqs, x: i32, o: i32, what: What, bodies: Vec<(request::Body, bool)>) -> bool {
        let serial = self.next_id;
        let want = bodies.len();
        let mut seqs = Vec::new();
        for (body, is_write) in bodies {
            let id = self.id();
            let mut req = baton_proto::Request { id, body: Some(body), ..Default::default() };
            if is_write {
                req.epoch = self.epoch;
                req.seq = self.next_seq;
                self.next_seq += 1;
                self.writes.insert(req.seq);
                seqs.push(req.seq);
                // Everything below this connection's oldest unanswered
                // write is done with: no ZooKeeper client retries one.
                req.acked_below = self.writes.first().copied().unwrap_or(req.seq);
            }
            self.by_id.insert(id, serial);
            if !self.send(req) {
                return false;
            }
        }
        let got = Vec::with_capacity(want);
        let at = Instant::now();
        reqs.insert(serial, Zreq { xid: x, op: o, what, want, got, seqs, reply: None, at, bytes: 0 });
        self.queue.push_back(serial);
        self.outstanding += 1;
        true
    }

    /// A read's request, with a watch of `kind` recorded here only for a
    /// valid path (an invalid one is refused by the driver: nothing is
    /// kept for it; finding Z5). A failed read forgets it again (`build`).
    fn read_req(&mut self, path: String, kind: Option<WatchKind>) -> (ReadReq, Option<u64>) {
        let kind = kind.filter(|_| baton_proto::validate_path(&path).is_ok());
        let watch = kind.map(|k| {
            let id = self.next_watch;
            self.next_watch += 1;
            self.watches.insert(id, Watch { path: path.clone(), kind: k, persistent: false });
            WatchSpec { watch_id: id, path: path.clone(), kind: k as i32, persistent: false, existed: false }
        });
        let id = watch.as_ref().map(|w| w.watch_id);
        (ReadReq { path, stale: !self.linearizable, watch }, id)
    }

    /// Takes one request: sent now, or held behind requests of another
    /// class. False: close the connection.
    fn request(&mut self, reqs: &mut Zreqs, x: i32, o: i32, req: Request) -> bool {
        if matches!(req, Request::Ping) {
            // Outside the order, as in ZooKeeper.
            return self.dispatch(reqs, x, o, req);
        }
        if let Some(s) = &self.stats {
            s.queued();
        }
        let c = class_of(&req, self.linearizable);
        if !self.waiting.is_empty() || (self.outstanding > 0 && (self.class != c || c == Class::Here)) {
            self.waiting.push_back((x, o, req));
            return true;
        }
        self.class = c;
        self.dispatch(reqs, x, o, req)
    }

    /// Sends what waited, once what held it back is answered.
    fn release_waiting(&mut self, reqs: &mut Zreqs) -> bool {
        while let Some((_, _, req)) = self.waiting.front() {
            let c = class_of(req, self.linearizable);
            if self.outstanding > 0 && (self.class != c || c == Class::Here) {
                return true;
            }
            let Some((x, o, req)) = self.waiting.pop_front() else { return true };
            self.class = c;
            if !self.dispatch(reqs, x, o, req) {
                return false;
            }
        }
        true
    }

    /// Translates one request. False: close the connection.
    /// One request's translation: each opcode (or family) is served in
    /// the file that also builds its reply (the module doc lists them).
    fn dispatch(&mut self, reqs: &mut Zreqs, x: i32, o: i32, req: Request) -> bool {
        if nodes::uses_auth_acl(&req) && self.tx.identities().is_empty() {
            // ZooKeeper's answer to an `auth` ACL from a client that has
            // authenticated as no one (Baton's would be BAD_REQUEST).
            self.answer(reqs, x, o, err::INVALID_ACL, Response::Empty);
            return true;
        }
        match req {
            Request::Ping => self.ping(),
            Request::Create { c, .. } => self.create(reqs, x, o, c),
            Request::Delete { path, version } => self.delete(reqs, x, o, path, version),
            Request::SetData { path, data, version } => self.set_data(reqs, x, o, path, data, version),
            Request::SetAcl { path, acl, version } => self.set_acl(reqs, x, o, path, acl, version),
            Request::Exists { path, watch } => self.exists(reqs, x, o, path, watch),
            Request::GetData { path, watch } => self.get_data(reqs, x, o, path, watch),
            Request::GetChildren { path, watch, .. } => self.get_children(reqs, x, o, path, watch),
            Request::GetAcl { path } => self.get_acl(reqs, x, o, path),
            Request::Sync { path } => self.sync(reqs, x, o, path),
            Request::Check { .. } => self.check_alone(reqs, x, o),
            Request::Multi(ops) => self.multi(reqs, x, o, ops),
            Request::MultiRead(ops) => self.multi_read(reqs, x, o, ops),
            Request::AddWatch { path, mode } => self.add_watch(reqs, x, o, path, mode),
            Request::SetWatches { relative_zxid, data, exist, child, persistent, persistent_recursive, .. } => {
                self.set_watches(reqs, x, o, relative_zxid, [data, exist, child, persistent, persistent_recursive])
            }
            Request::CheckWatches { path, kind } | Request::RemoveWatches { path, kind } => {
                self.check_or_remove_watches(reqs, x, o, path, kind)
            }
            Request::WhoAmI => self.who_am_i(reqs, x, o),
            Request::CloseSession => self.close_session(reqs, x, o),
            Request::Auth { scheme, auth, .. } => self.auth(reqs, x, o, scheme, auth),
            Request::GetEphemerals { prefix } => self.get_ephemerals(reqs, x, o, prefix),
            Request::GetAllChildrenNumber { path } => self.get_all_children_number(reqs, x, o, path),
            Request::Unsupported { .. } => {
                self.answer(reqs, x, o, err::UNIMPLEMENTED, Response::Empty);
                true
            }
        }
    }

    /// A Baton response to a request of the client's.
    fn response(&mut self, reqs: &mut Zreqs, r: baton_proto::Response) -> Option<()> {
        let serial = self.by_id.remove(&r.id)?;
        let z = reqs.get_mut(&serial)?;
        let mut r = r;
        z.bytes += prost::Message::encoded_len(&r);
        if z.bytes > self.max_reply_bytes {
            r.body = None;
        }
        z.got.push(r);
        if z.got.len() < z.want {
            return None;
        }
        for s in &z.seqs {
            self.writes.remove(s);
        }
        let mut reply = build(z, &mut self.watches);
        if matches!(z.what, What::MultiRead { .. })
            && (z.bytes > self.max_reply_bytes || reply.len() > self.max_reply_bytes)
        {
            // The reads' sum over `--max-reply-bytes`: refused whole, as
            // the driver refuses one reply over it (finding Z6: 60 reads
            // of a 1 MB node gave one 60 MB reply).
            let h = ReplyHeader { xid: z.xid, zxid: self.applied(), err: err::BAD_ARGUMENTS };
            reply = Response::encode(h, &Response::Empty);
        }
        z.reply = Some(reply);
        self.outstanding = self.outstanding.saturating_sub(1);
        Some(())
    }

    /// A Baton watch event as a ZooKeeper notification (None: not one of
    /// this connection's watches any more).
    fn event(&mut self, e: baton_proto::WatchEvent) -> Option<Vec<u8>> {
        let persistent = self.watches.get(&e.watch_id)?.persistent;
        if !persistent {
            self.watches.remove(&e.watch_id);
        }
        let kind = match baton_proto::EventType::try_from(e.r#type) {
            Ok(baton_proto::EventType::NodeCreated) => jute::event::NODE_CREATED,
            Ok(baton_proto::EventType::NodeDeleted) => jute::event::NODE_DELETED,
            Ok(baton_proto::EventType::NodeDataChanged) => jute::event::NODE_DATA_CHANGED,
            Ok(baton_proto::EventType::NodeChildrenChanged) => jute::event::NODE_CHILDREN_CHANGED,
            _ => return None,
        };
        // One notification per connection per change, as ZooKeeper sends
        // (finding Z9): a second watch of this connection that the same
        // change fires (a data and an exists watch on one node, a
        // recursive one above it) was consumed above, and sends nothing.
        // One entry's events come together, so the entry's are enough.
        if self.notified.0 != e.zxid {
            self.notified = (e.zxid, Vec::new());
        }
        if self.notified.1.iter().any(|(k, p)| *k == kind && *p == e.path) {
            return None;
        }
        self.notified.1.push((kind, e.path.clone()));
        Some(jute::notification(e.zxid as i64, kind, &e.path))
    }
}

/// A frame ready to be written, or the point where the connection closes.
enum Out {
    Frame(Vec<u8>),
    Close,
}

/// What the answer to one of the gateway's keepalives means.
fn keepalive_answer(code: i32) -> Answer {
    match ErrorCode::try_from(code) {
        Ok(ErrorCode::Ok) => Answer::Vouched,
        Ok(ErrorCode::SessionExpired) | Ok(ErrorCode::SessionMoved) => Answer::Expired,
        _ => Answer::Refused,
    }
}

/// A reply whose header carries CONNECTION_LOSS (bytes 12..16 after the
/// xid and zxid): one the connection closes at instead of sending.
fn lost_connection(reply: &[u8]) -> bool {
    reply.get(12..16).and_then(|b| b.try_into().ok()).map(i32::from_be_bytes) == Some(err::CONNECTION_LOSS)
}

/// Baton's error codes as ZooKeeper's. Ambiguous ones (the write may have
/// happened) and a member with no leader are CONNECTION_LOSS, which no
/// reply carries: the connection closes there (`flush`), and ZooKeeper's
/// clients treat the loss as "may have happened", as ZooKeeper's do.
pub(crate) fn zk_err(code: i32) -> i32 {
    use ErrorCode as E;
    match E::try_from(code) {
        Ok(E::Ok) => err::OK,
        Ok(E::NoNode) => err::NO_NODE,
        Ok(E::NodeExists) => err::NODE_EXISTS,
        Ok(E::BadVersion) => err::BAD_VERSION,
        Ok(E::NotEmpty) => err::NOT_EMPTY,
        Ok(E::NoChildrenForEphemerals) => err::NO_CHILDREN_FOR_EPHEMERALS,
        Ok(E::SessionExpired) => err::SESSION_EXPIRED,
        Ok(E::InvalidPath) | Ok(E::TooLarge) | Ok(E::BadRequest) => err::BAD_ARGUMENTS,
        Ok(E::SessionMoved) => err::SESSION_MOVED,
        Ok(E::NoAuth) => err::NO_AUTH,
        Ok(E::Busy) => err::THROTTLED_OP,
        Ok(E::NoLeader) | Ok(E::ShuttingDown) | Ok(E::NotLeader) => err::CONNECTION_LOSS,
        Ok(E::Timeout) | Ok(E::LeaderChanged) => err::CONNECTION_LOSS,
        Ok(E::StaleSequence) | Ok(E::FenceRejected) | Ok(E::Internal) | Err(_) => err::SYSTEM_ERROR,
    }
}

/// ZooKeeper's `ephemeralOwner` field: the session for an ephemeral node;
/// `Long.MIN_VALUE` for a container and `0xff << 56 | ttl` for a TTL node
/// (ZooKeeper's `EphemeralType`, which clients decode).
fn ephemeral_owner(s: &Stat) -> i64 {
    if s.container {
        i64::MIN
    } else if s.ttl_ms > 0 {
        (0xff_u64 << 56 | s.ttl_ms.min(crate::state::MAX_TTL_MS)) as i64
    } else {
        s.ephemeral_owner as i64
    }
}

fn stat_out(s: Option<&Stat>) -> jute::Stat {
    let Some(s) = s else { return jute::Stat::default() };
    jute::Stat {
        czxid: s.czxid as i64,
        mzxid: s.mzxid as i64,
        ctime: s.ctime,
        mtime: s.mtime,
        version: s.version,
        cversion: s.cversion,
        aversion: s.aversion,
        ephemeral_owner: ephemeral_owner(s),
        data_length: s.data_length as i32,
        num_children: s.num_children as i32,
        pzxid: s.pzxid as i64,
    }
}

/// The reply to `z` from its Baton responses: the opcode's file builds
/// its body.
fn build(z: &mut Zreq, watches: &mut HashMap<u64, Watch>) -> Vec<u8> {
    let zxid = z.got.iter().map(|r| r.zxid).max().unwrap_or(0) as i64;
    let header = |e: i32| ReplyHeader { xid: z.xid, zxid, err: e };
    let first = z.got.first().cloned().unwrap_or_default();
    let code = zk_err(first.error);
    if z.got.iter().any(|r| zk_err(r.error) == err::CONNECTION_LOSS) {
        // Never sent: `flush` closes the connection at this reply.
        return Response::encode(header(err::CONNECTION_LOSS), &Response::Empty);
    }
    let body = match &z.what {
        What::MultiRead { ops } => Ok(multi::read_results(ops, &z.got)),
        What::Multi { ops } => multi::results(ops, &first, code),
        _ if code != err::OK => {
            watches::forget_refused(&z.what, watches);
            Err(code)
        }
        _ => match z.op {
            op::EXISTS | op::SYNC | op::GET_DATA | op::GET_CHILDREN | op::GET_CHILDREN2 | op::GET_ACL => {
                reads::reply(z.op, &first.body, &z.what)
            }
            op::ADD_WATCH => Ok(Response::Code(err::OK)),
            op::WHO_AM_I => Ok(session::who_am_i_reply(&first.body)),
            _ => Ok(nodes::reply(z.op, &first.body)),
        },
    };
    match body {
        Ok(body) => Response::encode(header(err::OK), &body),
        Err(code) => Response::encode(header(code), &Response::Empty),
    }
}
