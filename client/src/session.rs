//! The session actor: one task owns the connection, the pending requests,
//! the watches and the session state; the public API talks to it through a
//! channel (`Cmd`). The actor reads its socket itself, so an answer or an
//! event is handled by the task that read it (no reader task hands frames
//! over); it reads only while free, so a busy actor slows the member
//! (TCP back-pressure) and never buffers without bound.
//!
//! Connection life: connect -> (first time) CreateSession, or (after a loss)
//! Attach with the secret, the last index seen and every watch -> requests
//! flow -> resend every unanswered request in id order. A connection with
//! no frame for 2/3 of the session timeout is presumed dead and replaced.
//!
//! State: `Connected` only while a keepalive the cluster vouched for is
//! recent enough ([`Liveness`]: 2/3 of the timeout after it was *sent*);
//! losing the connection, or no vouched keepalive in time, is `Suspended`;
//! the server saying the session expired, or no member answering anything
//! for three timeouts, is `Expired`. An attach does not make the client `Connected`: the keepalive
//! sent right after it does, once answered. A member that cannot vouch for
//! half a timeout, or leaves a keepalive unanswered for a keepalive period
//! (T/3), is left for the next one.
//!
//! Retries: a request answered with NO_LEADER / BUSY / SHUTTING_DOWN (not
//! applied) or LEADER_CHANGED / TIMEOUT (maybe applied) is sent again until
//! its deadline, paced by the [`crate::RetryPolicy`] (as are reconnects). Writes keep their sequence number, so the server applies a
//! write at most once and answers a retry with the first outcome. When the
//! deadline passes, a write that was ever sent fails as `Ambiguous`; one that
//! never left fails as `Unavailable`. A write holds its slot (of
//! [`crate::MAX_WRITES_IN_FLIGHT`]) until the actor is done with it, even if
//! the caller stopped waiting: the server's exactly-once window must never
//! see more writes in flight than it caches replies for.
//!
//! # Start ([`start`])
//! The endpoints are tried in order, round robin, until `op_timeout`
//! (default 15 s), pausing by the [`crate::RetryPolicy`] after each round. On each: dial (`connect_timeout`, default 2 s; TLS when
//! configured), send `auth` (request id 1) when a password user is
//! configured, then `create_session` (id 2), and wait at most twice the
//! connect timeout for its answer. The first success starts the actor
//! `Connected`, its proof of life dating from when the create was sent and
//! `last_zxid` at the session's creation index; that connection is ready
//! at once (the server bound it to the new session). A refused identity
//! (TLS, `NO_AUTH`) ends the start with `Error::NoAuth`; running out of
//! time ends it with `Error::Unavailable` naming every endpoint tried and
//! its last failure. If a
//! `create_session` answer is lost, the next endpoint creates another
//! session; the first, if it was created, expires after its timeout.
//!
//! # Keeping the session, and leaving a member
//! - Every `T/3` ([`KEEPALIVE_FRACTION`]) a keepalive goes out: a new
//!   request each time, never resent, one outstanding at most; a refused
//!   one is followed by the next 40 ms later (`KEEPALIVE_RETRY`). Only one answered `OK` is
//!   proof (liveness.rs).
//! - Housekeeping (`on_tick`) runs when its next deadline is due
//!   (`next_wake`), not on a period: an idle session wakes for its
//!   keepalives and nothing else. The connection is dropped when
//!   no frame arrived on it for 2/3 of the timeout, when its member has
//!   refused to vouch for half a timeout, or has left a keepalive
//!   unanswered for `T/3` (it hangs): a new leader keeps sessions only
//!   half a timeout after its election, so the client must find it in time.
//! - Dropping a connection (`drop_conn`; also when the socket closes, a
//!   write fails, the server answers `SHUTTING_DOWN`, or an attach fails)
//!   marks every request waiting for an answer for resending, drops the
//!   keepalives and internal requests of that connection, makes the state
//!   `Suspended`, and moves on to the next endpoint.
//!
//! # Reconnecting (`reconnect`)
//! With no connection, the next endpoint is tried after the retry policy's
//! delay for the number of failed reconnects in a row (capped at `T/6`, so
//! a session finds a new leader within its grace), each dial within the
//! smaller of the connect timeout and `T/3`. On the new connection go
//! `auth` (if configured) and `attach` with the session id, the secret,
//! `last_zxid` and every watch whose `Watcher` still exists; nothing else
//! is sent until the attach is answered (deadline: half the session
//! timeout, at least 500 ms).
//!
//! | Attach answer | Action |
//! |---|---|
//! | `OK` | the connection is ready; a keepalive goes out at once (its answer makes the state `Connected`); every unanswered request is resent in id order |
//! | `SESSION_EXPIRED`, `SESSION_MOVED` | `Expired` |
//! | anything else, or none by the deadline | drop this connection, try the next member |
//!
//! # Answers and retries (`on_response`, `on_tick`)
//! The deadline of a call is `op_timeout` from when it was made.
//!
//! | Answer | Before the deadline | At or after it |
//! |---|---|---|
//! | `NO_LEADER`, `BUSY`, `SHUTTING_DOWN` (not applied) | resend after the retry policy's delay for its attempt; `SHUTTING_DOWN` also switches member | returned to the caller |
//! | `LEADER_CHANGED`, `TIMEOUT` (maybe applied) | resend after the policy's delay | returned; for a write, `Error::Ambiguous` |
//! | `SESSION_EXPIRED` | the session is `Expired`; the call fails with `SessionExpired`, or `Ambiguous` for a write sent more than once (an earlier attempt may have been applied), except a `close_session`, which has what it asked for (`Client::close` succeeds) | same |
//! | `STALE_SEQUENCE` to a write sent more than once | `Error::Ambiguous` (its reply left the server's window) | same |
//! | `SESSION_MOVED` | the session is `Expired` | same |
//! | no answer | | a write sent at least once: `Error::Ambiguous`; otherwise `Error::Unavailable` |
//!
//! When the session expires, every waiting write that was sent fails as
//! `Ambiguous` (it may have committed before the session ended), every
//! other call as `SessionExpired`, and every watch ends
//! (`WatchEnd::SessionEnded`).
//!
//! # Watch events
//! Each event goes to its watcher's bounded buffer (watcher.rs); a full or
//! dropped watcher's watch is removed on the server. A one-shot watch ends
//! with `WatchEnd::Fired` after its event.
//!
//! # Sequence numbers
//! `seq` starts at 1 and grows by one per write (`create`, `set`,
//! `delete`, `multi`, `close_session`, `set_acl`, `add_user`,
//! `remove_user`); a resend keeps it. `acked_below` is the smallest `seq`
//! still waiting for an answer, or the next `seq` if none is
//! (`Actor::acked_below`), set each time a write is sent; a write stops
//! waiting at its final answer or its deadline. Request ids come from one
//! counter for the whole session, across connections.
//!
//! # Closing (`close`)
//! `Client::close`, or dropping the last `Client` clone, sends
//! `close_session` as a write with a 3 s deadline, serves events while it
//! waits, and sets the state to `Expired`. A `SESSION_EXPIRED` answer
//! counts as success.
//!
//! # Edges
//! Every state change is also broadcast as a [`ConnectionEvent`]
//! (`Suspended`, `Reconnected` when `Connected` comes back, `Lost` once
//! expired or closed), so a listener sees each edge even when the state
//! flips back before it looks.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use baton_proto::tls::BoxStream;
use baton_proto::{
    request, response, server_frame, AttachReq, AuthReq, CreateSessionReq, ErrorCode, KeepaliveReq, RemoveWatchReq,
    Request, Response, ServerFrame, WatchSpec,
};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tracing::debug;

use crate::liveness::{Liveness, KEEPALIVE_FRACTION};
use crate::namespace::Namespace;
use crate::watcher::{WatchEnd, WatchTx};
use crate::{ClientConfig, ClientTls, ConnectionEvent, Error, EventType, Result, SessionState, WatchEvent};

/// The largest frame the client accepts from a server (responses carry at
/// most 1 MiB of data plus a children list).
pub(crate) const MAX_FRAME: usize = 64 * 1024 * 1024;
/// How often a closing session looks at its deadlines while it waits for
/// the close to be answered.
const TICK: Duration = Duration::from_millis(20);
/// The longest the actor sleeps with nothing due (a safety net: every
/// deadline it keeps is in [`Actor::next_wake`]).
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// The shortest: a deadline already past is handled at most this often.
const MIN_SLEEP: Duration = Duration::from_millis(1);
/// Pause before the next keepalive after one was refused (a liveness
/// rule, not a retry: see liveness.rs).
const KEEPALIVE_RETRY: Duration = Duration::from_millis(40);
/// Commands queued for the actor before callers wait (writes are bounded
/// separately by their slots).
pub(crate) const CMD_QUEUE: usize = 4096;

pub(crate) enum Cmd {
    Call {
        req: Request,
        is_write: bool,
        reply: oneshot::Sender<Result<Response>>,
        timeout: Duration,
        /// A write's slot, held until the actor is done with the write.
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
    },
    /// Registered before the read that carries it (same queue, in order).
    /// With `for_create`, a create's FIRST watch: its path is the create's
    /// answer, so it is not re-registered until that answer came.
    NewWatch {
        spec: WatchSpec,
        events: WatchTx,
        for_create: bool,
    },
    WatchSeen {
        id: u64,
        existed: bool,
    },
    DropWatch(u64),
    LastZxid(oneshot::Sender<u64>),
    /// The end of the session's vouched window ([`Liveness::connected_until`]).
    ConnectedUntil(oneshot::Sender<Instant>),
    Close(Option<oneshot::Sender<Result<()>>>),
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Kind {
    User,
    Keepalive,
    Attach,
    /// Our own bookkeeping (remove-watch): no caller, no proof.
    Internal,
}

struct Pending {
    req: Request,
    is_write: bool,
    kind: Kind,
    reply: Option<oneshot::Sender<Result<Response>>>,
    deadline: Instant,
    /// Sent at least once: a lost answer makes a write ambiguous.
    sent: bool,
    /// Sent more than once: an earlier attempt may have been applied, so a
    /// SESSION_EXPIRED answer to this one does not make a write definite.
    resent: bool,
    /// "Not now" answers so far (the retry policy's attempt number).
    attempts: u32,
    /// Not before this instant (retry pacing); None = waiting for an answer.
    retry_at: Option<Instant>,
    /// When it was last sent (a keepalive's proof dates from it).
    sent_at: Instant,
    /// A write's slot; released when this is dropped.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

struct WatchEntry {
    spec: WatchSpec,
    tx: WatchTx,
    /// A create's FIRST watch whose create is unanswered: its node's path
    /// is not known yet, so an attach does not carry it (the create, sent
    /// again, registers it where it is answered).
    awaiting_create: bool,
}

struct Conn {
    /// Read by the actor itself (`next_frame`): a frame costs no hand-off
    /// between tasks before it is handled.
    r: FramedRead<ReadHalf<BoxStream>, LengthDelimitedCodec>,
    w: FramedWrite<WriteHalf<BoxStream>, LengthDelimitedCodec>,
    /// Frames read while a write was blocked (`write_reading`), handled
    /// before the socket is read again; they belong to this connection and
    /// go with it.
    inbox: VecDeque<Incoming>,
    /// Attach answered: requests may flow.
    ready: bool,
}

struct Actor {
    cfg: ClientConfig,
    ep: usize,
    session_id: u64,
    secret: Bytes,
    timeout: Duration,
    conn: Option<Conn>,
    state: watch::Sender<SessionState>,
    edges: broadcast::Sender<ConnectionEvent>,
    ns: Namespace,
    pending: BTreeMap<u64, Pending>,
    next_id: u64,
    next_seq: u64,
    unacked: BTreeSet<u64>,
    watches: HashMap<u64, WatchEntry>,
    last_zxid: u64,
    /// Last frame of any kind on the current connection (is it alive?).
    last_frame: Instant,
    /// Last frame from any member (is the cluster reachable at all?).
    last_heard: Instant,
    /// What the cluster vouched for (is the session alive?).
    liveness: Liveness,
    last_keepalive: Instant,
    /// Set when a keepalive was refused: the next one goes sooner.
    keepalive_retry: Option<Instant>,
    next_connect: Instant,
    /// Reconnects that failed since the last attach (the retry policy's
    /// attempt number).
    reconnect_failures: u32,
}

/// TCP, then TLS when configured, within `timeout`.
pub(crate) async fn dial(endpoint: &str, timeout: Duration, tls: Option<&ClientTls>) -> std::io::Result<BoxStream> {
    let go = async {
        let s = baton_proto::net::connect(endpoint).await?;
        let _ = s.set_nodelay(true);
        match tls {
            None => Ok(Box::new(s) as BoxStream),
            Some(t) => {
                let name = baton_proto::tls::server_name_of(endpoint)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
                baton_proto::tls::connect(t.config.clone(), name, s).await
            }
        }
    };
    tokio::time::timeout(timeout, go)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
}

fn encode(req: &Request) -> Bytes {
    baton_proto::client_frame_bytes(req)
}

/// Sends one request on a fresh connection and waits for its response.
pub(crate) async fn one_shot(
    endpoint: &str,
    body: request::Body,
    timeout: Duration,
    tls: Option<&ClientTls>,
    auth: Option<&(String, String)>,
) -> Result<Response> {
    let fut = async {
        let unavailable = |e: &dyn std::fmt::Display| Error::Unavailable(format!("{endpoint}: {e}"));
        let s = dial(endpoint, timeout, tls).await.map_err(|e| unavailable(&e))?;
        let mut f = tokio_util::codec::Framed::new(s, baton_proto::codec(MAX_FRAME));
        // With a password user, `auth` first (id 1); the request is id 2.
        let mut want = 1;
        if let Some((user, password)) = auth {
            let a = request::Body::Auth(baton_proto::AuthReq { user: user.clone(), password: password.clone() });
            let req = Request { id: 1, body: Some(a), ..Default::default() };
            f.send(encode(&req)).await.map_err(|e| unavailable(&e))?;
            want = 2;
        }
        let req = Request { id: want, body: Some(body), ..Default::default() };
        f.send(encode(&req)).await.map_err(|e| unavailable(&e))?;
        while let Some(frame) = f.next().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => match wrong_port(f.read_buffer(), None) {
                    Some(what) => return Err(Error::Invalid(what)),
                    None => return Err(unavailable(&e)),
                },
            };
            if let Ok(ServerFrame { frame: Some(server_frame::Frame::Response(r)) }) = ServerFrame::decode(frame) {
                if let Some(what) = wrong_port(&[], Some(&r.message)) {
                    return Err(Error::Invalid(what));
                }
                if r.id == 1 && want == 2 && r.error != 0 {
                    return Err(Error::NoAuth(format!("{endpoint}: {}", r.message)));
                }
                if r.id == want || r.id == 0 {
                    return Ok(r);
                }
            }
        }
        Err(unavailable(&"connection closed"))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| Error::Unavailable(format!("{endpoint}: no answer in {timeout:?}")))?
}

/// What [`start`] hands the client: the actor's queue, the state, the
/// edges, the session id and the timeout the server granted.
pub(crate) struct Started {
    pub(crate) cmds: mpsc::Sender<Cmd>,
    pub(crate) state: watch::Receiver<SessionState>,
    pub(crate) session_id: u64,
    pub(crate) timeout: Duration,
}

/// Creates the session and starts the actor. When no member will have it
/// before `op_timeout`, the error lists every endpoint tried and why.
pub(crate) async fn start(cfg: ClientConfig, edges: broadcast::Sender<ConnectionEvent>) -> Result<Started> {
    let ns = Namespace::new(&cfg.namespace).map_err(Error::Invalid)?;
    let deadline = Instant::now() + cfg.op_timeout;
    let mut tried: BTreeMap<String, String> = BTreeMap::new();
    let mut ep = 0usize;
    let mut attempt = 0u32;
    loop {
        if Instant::now() >= deadline {
            let why: Vec<String> = tried.iter().map(|(e, w)| format!("{e}: {w}")).collect();
            let why = if why.is_empty() { "no endpoint tried".to_string() } else { why.join("; ") };
            return Err(Error::Unavailable(format!("could not create a session ({why})")));
        }
        let endpoint = cfg.endpoints[ep % cfg.endpoints.len()].clone();
        ep += 1;
        let sent = Instant::now();
        match create_session(&endpoint, &cfg).await {
            Ok((conn, sid, secret, timeout, zxid)) => {
                let (state_tx, state_rx) = watch::channel(SessionState::Connected);
                let (cmd_tx, cmd_rx) = mpsc::channel(CMD_QUEUE);
                let now = Instant::now();
                let actor = Actor {
                    ep: ep - 1,
                    session_id: sid,
                    secret,
                    timeout,
                    conn: Some(conn),
                    state: state_tx,
                    edges: edges.clone(),
                    ns,
                    pending: BTreeMap::new(),
                    next_id: 3,
                    next_seq: 1,
                    unacked: BTreeSet::new(),
                    watches: HashMap::new(),
                    // The session's own creation: nothing before it matters
                    // to this client, and a member it moves to must have it.
                    last_zxid: zxid,
                    last_frame: now,
                    last_heard: now,
                    liveness: Liveness::new(timeout, sent),
                    last_keepalive: now,
                    keepalive_retry: None,
                    next_connect: now,
                    reconnect_failures: 0,
                    cfg,
                };
                tokio::spawn(actor.run(cmd_rx));
                return Ok(Started { cmds: cmd_tx, state: state_rx, session_id: sid, timeout });
            }
            Err(Failed::NoAuth(e)) => return Err(Error::NoAuth(format!("{endpoint}: {e}"))),
            Err(Failed::WrongPort(e)) => {
                // Not a client port: no retry will make it one. When every
                // endpoint is one, say so at once.
                debug!("{endpoint}: {e}");
                tried.insert(endpoint, e);
                let distinct: BTreeSet<&String> = cfg.endpoints.iter().collect();
                if tried.values().filter(|w| w.contains(baton_proto::NOT_A_CLIENT_PORT)).count() >= distinct.len() {
                    let why: Vec<String> = tried.iter().map(|(e, w)| format!("{e}: {w}")).collect();
                    return Err(Error::Invalid(format!("no endpoint is a Baton client port ({})", why.join("; "))));
                }
            }
            Err(Failed::Retry(e)) => {
                debug!("{endpoint}: {e}");
                tried.insert(endpoint, e);
                // Once around the list, then back off.
                if ep.is_multiple_of(cfg.endpoints.len()) {
                    tokio::time::sleep(cfg.retry.delay(attempt)).await;
                    attempt += 1;
                }
            }
        }
    }
}

/// The `auth` request for `cfg`'s user, if it has one.
fn auth_request(cfg: &ClientConfig, id: u64) -> Option<Request> {
    let (user, password) = cfg.auth.clone()?;
    Some(Request { id, body: Some(request::Body::Auth(AuthReq { user, password })), ..Default::default() })
}

/// Why a session could not be created on one member.
enum Failed {
    /// TLS or the member refused this client's identity, or this client
    /// refused the member's: another try will not help.
    NoAuth(String),
    /// The endpoint is another kind of port (HTTP, peer, ZooKeeper).
    WrongPort(String),
    Retry(String),
}

/// What a port that answered a client's first request with something that
/// is not Baton's protocol is, if it can be told: an HTTP port answers
/// `HTTP/`, and Baton's peer and ZooKeeper ports answer
/// `baton_proto::not_a_client_port`'s message.
pub(crate) fn wrong_port(first_bytes: &[u8], answer: Option<&str>) -> Option<String> {
    if first_bytes.starts_with(b"HTTP/") {
        return Some(format!(
            "this is an HTTP port (a member's metrics and health?), {}",
            baton_proto::NOT_A_CLIENT_PORT
        ));
    }
    let a = answer?;
    a.contains(baton_proto::NOT_A_CLIENT_PORT).then(|| a.to_string())
}

impl From<std::io::Error> for Failed {
    fn from(e: std::io::Error) -> Self {
        match e.get_ref().and_then(|i| i.downcast_ref::<baton_proto::tls::rustls::Error>()) {
            Some(t) => Failed::NoAuth(format!("TLS: {t}")),
            None => Failed::Retry(e.to_string()),
        }
    }
}

/// What came in on the connection.
enum Incoming {
    Frame(Box<ServerFrame>),
    /// Closed by the server, failed, or sent a frame that does not decode.
    Closed,
}

/// The next frame on `conn` (pending forever when there is none). The
/// actor reads its own connection, and only while it is free: a busy
/// actor slows the member (TCP), never grows memory. Cancel-safe (a frame
/// half read stays in the `FramedRead`'s buffer).
async fn next_frame(conn: &mut Option<Conn>) -> Incoming {
    let Some(c) = conn else { return std::future::pending().await };
    match c.inbox.pop_front() {
        Some(queued) => queued,
        None => read_frame(&mut c.r).await,
    }
}

async fn read_frame(r: &mut FramedRead<ReadHalf<BoxStream>, LengthDelimitedCodec>) -> Incoming {
    match r.next().await {
        Some(Ok(frame)) => match ServerFrame::decode(frame) {
            Ok(f) => Incoming::Frame(Box::new(f)),
            Err(_) => Incoming::Closed,
        },
        Some(Err(_)) | None => Incoming::Closed,
    }
}

/// Writes `bytes` on `c`, reading while the write waits: a member at its
/// in-flight cap stops reading until its answers are read, so an actor
/// that only wrote would wait on the member while the member waits on it.
/// What is read meanwhile queues in `c.inbox` (bounded by what the member
/// may queue for a connection, `--max-queued-bytes`). Returns false when
/// the connection failed.
async fn write_reading(c: &mut Conn, bytes: Bytes) -> bool {
    let Conn { r, w, inbox, .. } = c;
    let send = w.send(bytes);
    tokio::pin!(send);
    loop {
        tokio::select! {
            biased;
            sent = &mut send => return sent.is_ok(),
            incoming = read_frame(r), if !matches!(inbox.back(), Some(Incoming::Closed)) => inbox.push_back(incoming),
        }
    }
}

async fn create_session(
    endpoint: &str,
    cfg: &ClientConfig,
) -> std::result::Result<(Conn, u64, Bytes, Duration, u64), Failed> {
    let s = dial(endpoint, cfg.connect_timeout, cfg.tls.as_ref()).await?;
    let (rd, wr) = tokio::io::split(s);
    let mut w = FramedWrite::new(wr, baton_proto::codec(MAX_FRAME));
    let mut r = FramedRead::new(rd, baton_proto::codec(MAX_FRAME));
    let ms = cfg.session_timeout.as_millis().min(u32::MAX as u128) as u32;
    // The identity first (it belongs to the connection), then the session.
    if let Some(a) = auth_request(cfg, 1) {
        w.send(encode(&a)).await?;
    }
    let req = Request {
        id: 2,
        body: Some(request::Body::CreateSession(CreateSessionReq { timeout_ms: ms })),
        ..Default::default()
    };
    w.send(encode(&req)).await?;
    // Bounded per member, so one member that accepts but never answers
    // does not use up the whole budget.
    let resp = tokio::time::timeout(cfg.connect_timeout * 2, async {
        while let Some(frame) = r.next().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => match wrong_port(r.read_buffer(), None) {
                    Some(what) => return Err(Failed::WrongPort(what)),
                    None => return Err(e.into()),
                },
            };
            if let Ok(ServerFrame { frame: Some(server_frame::Frame::Response(resp)) }) = ServerFrame::decode(frame) {
                if let Some(what) = wrong_port(&[], Some(&resp.message)) {
                    return Err(Failed::WrongPort(what));
                }
                if resp.id == 1 && resp.error != 0 {
                    return Err(Failed::NoAuth(resp.message));
                }
                if resp.id != 1 {
                    return Ok(resp);
                }
            }
        }
        Err(Failed::Retry("connection closed".to_string()))
    })
    .await
    .map_err(|_| Failed::Retry("no answer to create-session".to_string()))??;
    match resp.body {
        Some(response::Body::CreateSession(cs)) if resp.error == 0 => {
            let timeout = Duration::from_millis(cs.timeout_ms as u64);
            Ok((
                Conn { r, w, inbox: VecDeque::new(), ready: true },
                cs.session_id,
                cs.secret,
                timeout,
                resp.zxid.max(cs.session_id),
            ))
        }
        _ => {
            let code = ErrorCode::try_from(resp.error).unwrap_or(ErrorCode::Internal);
            let msg = format!("{code:?}: {}", resp.message);
            Err(if code == ErrorCode::NoAuth { Failed::NoAuth(msg) } else { Failed::Retry(msg) })
        }
    }
}

impl Actor {
    async fn run(mut self, mut cmds: mpsc::Receiver<Cmd>) {
        loop {
            let connected_until = tokio::time::Instant::from_std(self.liveness.connected_until());
            let wake = tokio::time::Instant::from_std(self.next_wake(Instant::now()));
            tokio::select! {
                biased;
                // Server frames first: answers free callers.
                incoming = next_frame(&mut self.conn), if self.conn.is_some() => self.on_incoming(incoming).await,
                // API calls.
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Close(reply)) => {
                        let r = self.close().await;
                        if let Some(tx) = reply { let _ = tx.send(r); }
                        return;
                    }
                    Some(cmd) => self.on_cmd(cmd).await,
                    None => { let _ = self.close().await; return; }
                },
                // The moment the last proof runs out: Suspended, on time.
                _ = tokio::time::sleep_until(connected_until), if self.is(SessionState::Connected) => {
                    self.update_state(Instant::now());
                }
                // Deadlines, keepalives, reconnects: asleep until the next is due.
                _ = tokio::time::sleep_until(wake) => {
                    if !self.on_tick().await {
                        // Expired: answer everything with SessionExpired until dropped.
                        while let Some(cmd) = cmds.recv().await {
                            match cmd {
                                Cmd::Call { reply, .. } => { let _ = reply.send(Err(Error::SessionExpired)); }
                                Cmd::Close(Some(tx)) => { let _ = tx.send(Ok(())); return; }
                                Cmd::Close(None) => return,
                                Cmd::LastZxid(tx) => { let _ = tx.send(self.last_zxid); }
                                Cmd::ConnectedUntil(tx) => { let _ = tx.send(self.liveness.connected_until()); }
                                Cmd::NewWatch { events, .. } => events.ended(WatchEnd::SessionEnded),
                                _ => {}
                            }
                        }
                        return;
                    }
                }
            }
        }
    }

    /// The next moment [`Actor::on_tick`] has something to do: the earliest
    /// of a request's deadline or retry, giving up, the silent-connection
    /// and unvouched-member switches, an unanswered keepalive, the next
    /// keepalive, and the next reconnect. The actor sleeps until then
    /// (bounded by [`MIN_SLEEP`] and [`MAX_SLEEP`]) instead of polling: an
    /// idle session costs no wake-ups between keepalives.
    fn next_wake(&self, now: Instant) -> Instant {
        let mut at = now + MAX_SLEEP;
        let mut due = |t: Instant| at = at.min(t);
        due(self.liveness.give_up_at(self.last_heard));
        let period = self.timeout / KEEPALIVE_FRACTION;
        for p in self.pending.values() {
            due(p.deadline);
            if p.kind == Kind::Keepalive && p.sent {
                due(p.sent_at + period);
            }
        }
        match &self.conn {
            Some(c) => {
                due(self.last_frame + self.timeout * 2 / 3);
                if c.ready {
                    due(self.last_keepalive + period);
                    if let Some(t) = self.keepalive_retry {
                        due(t);
                        due(self.liveness.switch_at());
                    }
                    for t in self.pending.values().filter_map(|p| p.retry_at) {
                        due(t);
                    }
                }
            }
            None => due(self.next_connect),
        }
        at.max(now + MIN_SLEEP)
    }

    fn is(&self, s: SessionState) -> bool {
        *self.state.borrow() == s
    }

    /// Connected exactly while a vouched keepalive is recent enough and a
    /// connection is up (never after Expired).
    fn update_state(&mut self, now: Instant) {
        if self.is(SessionState::Expired) {
            return;
        }
        let up = self.conn.as_ref().is_some_and(|c| c.ready);
        let want = if up && self.liveness.connected(now) { SessionState::Connected } else { SessionState::Suspended };
        if !self.is(want) {
            debug!(session = self.session_id, ?want, "session state");
            let _ = self.state.send(want);
            let edge =
                if want == SessionState::Connected { ConnectionEvent::Reconnected } else { ConnectionEvent::Suspended };
            let _ = self.edges.send(edge);
        }
    }

    fn acked_below(&self) -> u64 {
        self.unacked.first().copied().unwrap_or(self.next_seq)
    }

    async fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Call { mut req, is_write, reply, timeout, slot } => {
                if self.is(SessionState::Expired) {
                    let _ = reply.send(Err(Error::SessionExpired));
                    return;
                }
                self.ns.request(&mut req);
                req.id = self.next_id;
                self.next_id += 1;
                if is_write {
                    req.seq = self.next_seq;
                    self.next_seq += 1;
                    self.unacked.insert(req.seq);
                }
                let id = req.id;
                let now = Instant::now();
                self.pending.insert(
                    id,
                    Pending {
                        req,
                        is_write,
                        kind: Kind::User,
                        reply: Some(reply),
                        deadline: now + timeout,
                        sent: false,
                        resent: false,
                        attempts: 0,
                        retry_at: Some(now),
                        sent_at: now,
                        _slot: slot,
                    },
                );
                self.send_pending(id).await;
            }
            Cmd::NewWatch { mut spec, events, for_create } => {
                spec.path = self.ns.to_server(&spec.path);
                self.watches.insert(spec.watch_id, WatchEntry { spec, tx: events, awaiting_create: for_create });
            }
            Cmd::WatchSeen { id, existed } => {
                if let Some(w) = self.watches.get_mut(&id) {
                    w.spec.existed = existed;
                }
            }
            Cmd::DropWatch(id) => {
                // Still registered (a one-shot that fired is already gone).
                if self.watches.remove(&id).is_some() {
                    self.internal(request::Body::RemoveWatch(RemoveWatchReq { watch_id: id }), Kind::Internal).await;
                }
            }
            Cmd::LastZxid(tx) => {
                let _ = tx.send(self.last_zxid);
            }
            Cmd::ConnectedUntil(tx) => {
                let _ = tx.send(self.liveness.connected_until());
            }
            Cmd::Close(_) => {}
        }
    }

    /// Sends a request of our own (keepalive, remove-watch) if connected.
    async fn internal(&mut self, body: request::Body, kind: Kind) {
        let id = self.next_id;
        self.next_id += 1;
        let req = Request { id, body: Some(body), ..Default::default() };
        let now = Instant::now();
        self.pending.insert(
            id,
            Pending {
                req,
                is_write: false,
                kind,
                reply: None,
                deadline: now + self.timeout,
                sent: false,
                resent: false,
                attempts: 0,
                retry_at: Some(now),
                sent_at: now,
                _slot: None,
            },
        );
        self.send_pending(id).await;
    }

    /// A keepalive: a fresh request each time (its proof dates from its own
    /// send), never retried (the next one is).
    async fn keepalive(&mut self) {
        self.last_keepalive = Instant::now();
        self.keepalive_retry = None;
        // Only one outstanding: an older unanswered one proves less.
        self.pending.retain(|_, p| p.kind != Kind::Keepalive);
        self.internal(request::Body::Keepalive(KeepaliveReq {}), Kind::Keepalive).await;
    }

    /// Writes pending request `id` if a ready connection exists.
    async fn send_pending(&mut self, id: u64) {
        let acked_below = self.acked_below();
        let Some(conn) = self.conn.as_mut().filter(|c| c.ready) else { return };
        let Some(p) = self.pending.get_mut(&id) else { return };
        if p.is_write {
            p.req.acked_below = acked_below;
        }
        p.retry_at = None;
        p.resent |= p.sent;
        p.sent = true;
        p.sent_at = Instant::now();
        let bytes = encode(&p.req);
        if !write_reading(conn, bytes).await {
            self.drop_conn();
        }
    }

    fn drop_conn(&mut self) {
        if self.conn.take().is_some() {
            for p in self.pending.values_mut() {
                if p.retry_at.is_none() {
                    p.retry_at = Some(Instant::now());
                }
            }
            // Keepalives and internal requests belong to that connection.
            self.pending.retain(|_, p| p.kind == Kind::User);
            self.ep += 1;
        }
        self.update_state(Instant::now());
    }

    async fn on_incoming(&mut self, incoming: Incoming) {
        let frame = match incoming {
            Incoming::Closed => {
                debug!("connection closed by server");
                self.drop_conn();
                return;
            }
            Incoming::Frame(f) => *f,
        };
        self.last_frame = Instant::now();
        self.last_heard = self.last_frame;
        match frame.frame {
            Some(server_frame::Frame::Event(e)) => self.on_watch_event(e).await,
            Some(server_frame::Frame::Response(r)) => self.on_response(r).await,
            None => {}
        }
    }

    /// A create with a FIRST watch was answered: the watch now stands on
    /// the created node if the member registered it, and is dropped
    /// otherwise (the caller then asks with a read, or needs none).
    fn settle_first_watch(&mut self, id: u64, code: ErrorCode, r: &Response) {
        let created = match (&r.body, code) {
            (Some(response::Body::Create(c)), ErrorCode::Ok) if c.first_watch_set => Some(c.path.clone()),
            _ => None,
        };
        match (created, self.watches.get_mut(&id)) {
            (Some(path), Some(w)) => {
                w.spec.path = path;
                w.spec.existed = true;
                w.awaiting_create = false;
            }
            (None, Some(_)) => {
                self.watches.remove(&id);
            }
            (_, None) => {}
        }
    }

    async fn on_watch_event(&mut self, e: baton_proto::WatchEvent) {
        // An event is not contact: a member cut off from the leader still
        // delivers what it applies.
        self.last_zxid = self.last_zxid.max(e.zxid);
        let Some(w) = self.watches.get_mut(&e.watch_id) else { return };
        let Some(event_type) = EventType::from_wire(e.r#type) else { return };
        // Re-registration must know what this watch last saw (of its own
        // node: a recursive watch's events may be about nodes below).
        if e.path == w.spec.path {
            match event_type {
                EventType::NodeCreated => w.spec.existed = true,
                EventType::NodeDeleted => w.spec.existed = false,
                _ => {}
            }
        }
        let ev = WatchEvent { event_type, path: self.ns.to_user(&e.path), zxid: e.zxid };
        let recursive = w.spec.kind == baton_proto::WatchKind::Recursive as i32;
        let delivered = w.tx.deliver(ev);
        if !w.spec.persistent && !recursive {
            w.tx.ended(WatchEnd::Fired);
            self.watches.remove(&e.watch_id);
        } else if !delivered {
            // Overflowed or dropped: the server must stop sending.
            self.watches.remove(&e.watch_id);
            let body = request::Body::RemoveWatch(RemoveWatchReq { watch_id: e.watch_id });
            self.internal(body, Kind::Internal).await;
        }
    }

    async fn on_response(&mut self, r: Response) {
        self.last_zxid = self.last_zxid.max(r.zxid);
        let code = ErrorCode::try_from(r.error).unwrap_or(ErrorCode::Internal);
        if r.id == 0 {
            debug!(?code, "connection-level error: {}", r.message);
            return;
        }
        let Some(p) = self.pending.get_mut(&r.id) else { return };
        match code {
            ErrorCode::SessionExpired | ErrorCode::SessionMoved
                if p.kind != Kind::User || code == ErrorCode::SessionMoved =>
            {
                self.expire("server says the session expired");
                return;
            }
            ErrorCode::NoLeader
            | ErrorCode::Busy
            | ErrorCode::ShuttingDown
            | ErrorCode::LeaderChanged
            | ErrorCode::Timeout
                if Instant::now() < p.deadline =>
            {
                match p.kind {
                    Kind::Attach => {
                        // This member cannot attach now: try another.
                        self.pending.remove(&r.id);
                        self.drop_conn();
                    }
                    Kind::Keepalive => {
                        // Not vouched for; the next keepalive goes soon.
                        self.pending.remove(&r.id);
                        self.keepalive_retry = Some(Instant::now() + KEEPALIVE_RETRY);
                        if code == ErrorCode::ShuttingDown {
                            self.drop_conn();
                        }
                    }
                    _ => {
                        let delay = self.cfg.retry.delay(p.attempts);
                        debug!(
                            ?code,
                            id = r.id,
                            attempt = p.attempts,
                            ?delay,
                            "request refused; sent again after the delay"
                        );
                        p.retry_at = Some(Instant::now() + delay);
                        p.attempts += 1;
                        if code == ErrorCode::ShuttingDown {
                            self.drop_conn();
                        }
                    }
                }
                return;
            }
            _ => {}
        }
        let Some(p) = self.pending.remove(&r.id) else { return };
        if p.is_write {
            self.unacked.remove(&p.req.seq);
        }
        match p.kind {
            Kind::Attach => {
                if code == ErrorCode::Ok {
                    if let Some(c) = self.conn.as_mut() {
                        c.ready = true;
                    }
                    self.reconnect_failures = 0;
                    debug!(endpoint = %self.endpoint(), "session resumed; proving it alive");
                    // Attached, not yet vouched for: Connected comes with
                    // the answer to this keepalive.
                    self.keepalive().await;
                    let ids: Vec<u64> =
                        self.pending.iter().filter(|(_, p)| p.retry_at.is_some()).map(|(id, _)| *id).collect();
                    for id in ids {
                        self.send_pending(id).await;
                    }
                } else if code == ErrorCode::SessionExpired {
                    self.expire("session expired while disconnected");
                } else {
                    self.drop_conn();
                }
            }
            Kind::Keepalive => {
                if code == ErrorCode::Ok {
                    // The only proof of life (liveness.rs): from its send.
                    self.liveness.vouched(p.sent_at);
                    self.update_state(Instant::now());
                } else {
                    self.keepalive_retry = Some(Instant::now() + KEEPALIVE_RETRY);
                }
            }
            Kind::Internal => {}
            Kind::User => {
                let resent_write = p.is_write && p.resent;
                // A close wants the session gone: an expired one is that.
                let is_close = matches!(p.req.body, Some(request::Body::CloseSession(_)));
                if code == ErrorCode::SessionExpired {
                    // A retried write: the session may have expired after an
                    // earlier attempt was applied (its reply lost, e.g.
                    // LEADER_CHANGED). Found by the harness's register
                    // workload under partitions.
                    let err = if resent_write && !is_close {
                        Error::Ambiguous("session expired before a retried write was answered".into())
                    } else {
                        Error::SessionExpired
                    };
                    if let Some(tx) = p.reply {
                        let _ = tx.send(Err(err));
                    }
                    self.expire("session expired");
                    return;
                }
                if code == ErrorCode::StaleSequence && resent_write {
                    // Its reply was evicted from the server's window: the
                    // first attempt may have been applied.
                    if let Some(tx) = p.reply {
                        let _ = tx.send(Err(Error::Ambiguous(format!("retried write: {}", r.message))));
                    }
                    return;
                }
                if p.req.first_watch_id != 0 {
                    self.settle_first_watch(p.req.first_watch_id, code, &r);
                }
                let mut r = r;
                self.ns.response(&mut r);
                if let Some(tx) = p.reply {
                    let _ = tx.send(Ok(r));
                }
            }
        }
    }

    fn endpoint(&self) -> String {
        self.cfg.endpoints[self.ep % self.cfg.endpoints.len()].clone()
    }

    /// Housekeeping; returns false once the session is expired.
    async fn on_tick(&mut self) -> bool {
        let now = Instant::now();
        if self.is(SessionState::Expired) {
            return false;
        }
        // Deadlines.
        let late: Vec<u64> = self.pending.iter().filter(|(_, p)| now >= p.deadline).map(|(id, _)| *id).collect();
        for id in late {
            if let Some(p) = self.pending.remove(&id) {
                if p.is_write {
                    self.unacked.remove(&p.req.seq);
                }
                if p.kind == Kind::Attach {
                    self.drop_conn();
                }
                let err = if p.is_write && p.sent {
                    Error::Ambiguous("no answer before the deadline".into())
                } else {
                    Error::Unavailable("no answer from the cluster before the deadline".into())
                };
                if let Some(tx) = p.reply {
                    let _ = tx.send(Err(err));
                }
            }
        }
        if self.liveness.give_up(self.last_heard, now) {
            self.expire("no member answered for three session timeouts");
            return false;
        }
        self.update_state(now);
        if self.conn.is_some() {
            let ready = self.conn.as_ref().is_some_and(|c| c.ready);
            if now.duration_since(self.last_frame) > self.timeout * 2 / 3 {
                // A connection silent for 2/3 of the timeout is presumed dead.
                debug!(endpoint = %self.endpoint(), "no frame from member; switching");
                self.drop_conn();
            } else if ready && self.liveness.should_switch(now) && self.keepalive_retry.is_some() {
                // This member has refused to vouch for half a timeout.
                debug!(endpoint = %self.endpoint(), "member cannot vouch for the session; switching");
                self.drop_conn();
            } else if self.pending.values().any(|p| {
                p.kind == Kind::Keepalive
                    && p.sent
                    && now.duration_since(p.sent_at) >= self.timeout / KEEPALIVE_FRACTION
            }) {
                // A keepalive unanswered for a keepalive period: the member
                // hangs (paused, overloaded). A new leader keeps sessions
                // only half a timeout after its election: find it in time.
                debug!(endpoint = %self.endpoint(), "keepalive unanswered; switching");
                self.drop_conn();
            } else if ready {
                let due = now.duration_since(self.last_keepalive) >= self.timeout / KEEPALIVE_FRACTION
                    || self.keepalive_retry.is_some_and(|t| now >= t);
                if due {
                    self.keepalive().await;
                }
                // Retries that are due.
                let due: Vec<u64> = self
                    .pending
                    .iter()
                    .filter(|(_, p)| p.retry_at.is_some_and(|t| t <= now))
                    .map(|(id, _)| *id)
                    .collect();
                for id in due {
                    self.send_pending(id).await;
                }
            }
        }
        if self.conn.is_none() && now >= self.next_connect {
            self.reconnect().await;
            if self.conn.is_none() {
                self.reconnect_failures += 1;
            }
            // Paced by the policy, but never so slow that the session
            // misses a new leader's grace period (half a timeout).
            let pause = self.cfg.retry.delay(self.reconnect_failures).min(self.timeout / 6);
            self.next_connect = Instant::now() + pause;
        }
        !self.is(SessionState::Expired)
    }

    async fn reconnect(&mut self) {
        let endpoint = self.endpoint();
        let budget = self.cfg.connect_timeout.min(self.timeout / 3);
        let s = match dial(&endpoint, budget, self.cfg.tls.as_ref()).await {
            Ok(s) => s,
            Err(e) => {
                debug!(%endpoint, "reconnect: {e}");
                self.ep += 1;
                return;
            }
        };
        let (rd, wr) = tokio::io::split(s);
        let r = FramedRead::new(rd, baton_proto::codec(MAX_FRAME));
        let mut w = FramedWrite::new(wr, baton_proto::codec(MAX_FRAME));
        // The identity first: it belongs to the connection. Its answer is
        // not awaited (requests on a connection are answered in order; a
        // refused one shows as NO_AUTH on what follows).
        if let Some(a) = auth_request(&self.cfg, self.next_id) {
            self.next_id += 1;
            if w.send(encode(&a)).await.is_err() {
                self.ep += 1;
                return;
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.watches.retain(|_, w| !w.tx.is_closed());
        let watches = self.watches.values().filter(|w| !w.awaiting_create).map(|w| w.spec.clone()).collect();
        let req = Request {
            id,
            body: Some(request::Body::Attach(AttachReq {
                session_id: self.session_id,
                secret: self.secret.clone(),
                last_zxid: self.last_zxid,
                watches,
            })),
            ..Default::default()
        };
        if w.send(encode(&req)).await.is_err() {
            self.ep += 1;
            return;
        }
        let now = Instant::now();
        self.pending.insert(
            id,
            Pending {
                req,
                is_write: false,
                kind: Kind::Attach,
                reply: None,
                deadline: now + (self.timeout / 2).max(Duration::from_millis(500)),
                sent: true,
                resent: false,
                attempts: 0,
                retry_at: None,
                sent_at: now,
                _slot: None,
            },
        );
        self.conn = Some(Conn { r, w, inbox: VecDeque::new(), ready: false });
        self.last_frame = now;
        debug!(%endpoint, "reconnecting");
    }

    /// The session is over: state Expired, edge Lost, watchers ended.
    fn ended(&mut self) {
        if !self.is(SessionState::Expired) {
            let _ = self.state.send(SessionState::Expired);
            let _ = self.edges.send(ConnectionEvent::Lost);
        }
        for (_, w) in self.watches.drain() {
            w.tx.ended(WatchEnd::SessionEnded);
        }
        self.conn = None;
    }

    fn expire(&mut self, why: &str) {
        debug!(session = self.session_id, "{why}");
        self.ended();
        for (_, p) in std::mem::take(&mut self.pending) {
            // A write already sent may have committed before the session
            // ended: that is not a definite failure.
            let err = if p.is_write && p.sent {
                Error::Ambiguous(format!("session expired before the reply ({why})"))
            } else {
                Error::SessionExpired
            };
            if let Some(tx) = p.reply {
                let _ = tx.send(Err(err));
            }
        }
    }

    async fn close(&mut self) -> Result<()> {
        if self.is(SessionState::Expired) {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        let req = Request { body: Some(request::Body::CloseSession(Default::default())), ..Default::default() };
        let timeout = Duration::from_secs(3);
        self.on_cmd(Cmd::Call { req, is_write: true, reply: tx, timeout, slot: None }).await;
        // Serve events until the close is answered (or times out).
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = rx;
        let result = loop {
            tokio::select! {
                r = &mut rx => break r.map_err(|_| Error::Closed).and_then(|r| r.map(|_| ())),
                _ = tokio::time::sleep_until(deadline) => break Err(Error::Ambiguous("close not answered".into())),
                incoming = next_frame(&mut self.conn), if self.conn.is_some() => self.on_incoming(incoming).await,
                _ = tokio::time::sleep(TICK) => { self.on_tick().await; }
            }
        };
        self.ended();
        match result {
            Err(Error::SessionExpired) => Ok(()),
            r => r,
        }
    }
}
