//! Client listener: one task pair (reader, writer) per connection.
//!
//! Connections come from the accept loop every port shares (accept.rs:
//! places, connection ids, the TLS sniff).
//!
//! The reader decodes `ClientFrame`s and hands requests to the driver; the
//! writer sends what the driver queued for this connection (responses and
//! watch events, in the order the driver produced them, which is log order).
//! Caps (config.rs `Limits`): at most `max_connections` connections, this
//! port's and the ZooKeeper port's together (one more is answered BUSY and
//! closed); a connection has at most
//! `max_inflight` requests without a response (the reader waits for a slot
//! before reading more, which bounds the driver's input queue per
//! connection); its outbound queue holds at most `max_queued_bytes`
//! (`ConnTx`: past it the connection is closed).
//!
//! TLS (when `--cert`/`--key` are set): the handshake runs in the
//! connection's task, bounded by [`HANDSHAKE_TIMEOUT`]; with `--ca`, a
//! client must present a certificate that chains to it.
//!
//! Every answered request is counted and timed (metrics.rs: from its frame
//! read to its response written); one slower than `--slow-request-ms` is
//! logged as a warning with its type, id, error and time.
//!
//! Bad input: an undecodable frame gets a `BAD_REQUEST` response and the
//! connection is closed (the stream cannot be trusted after it); a frame over
//! the limit gets `TOO_LARGE` and is closed likewise. Nothing reaches the
//! state machine from either.
//!
//! Shutdown (shutdown.rs): on the notice the listener stops accepting and
//! each connection stops reading; its writer writes out what the driver
//! queued (the driver answered pending writes before the notice) and the
//! connection closes. Writes go out through the shared batch writer
//! (batch.rs), at most [`MAX_BATCH`] frames per flush.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use baton_proto::tls::BoxStream;
use baton_proto::{request, response, server_frame, AuthReq, ClientFrame, Empty, ErrorCode, Response, ServerFrame};
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Semaphore;
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, warn};

use crate::accept::{self, Secured, HANDSHAKE_TIMEOUT};
use crate::acl::Caller;
use crate::batch::{write_batch, Batch, Outbox};
use crate::config::Config;
use crate::message::{ConnTx, Input, InputTx, QueueGauge};
use crate::shutdown::Signal;
use crate::view::{capped, fast_read, SharedState};

/// Frames written per flush at most.
pub const MAX_BATCH: usize = 256;

/// `state`: the driver's shared state, for answering local reads without a
/// watch here (None: every request goes to the driver).
/// `fast_reads`: answer local reads without a watch from `state` (off when
/// deliberate bugs are on: those act in the driver).
/// `signal`: stops accepting, and every connection, on shutdown.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listener: TcpListener,
    input: InputTx,
    cfg: Config,
    state: SharedState,
    fast_reads: bool,
    tls: Option<tokio_rustls::TlsAcceptor>,
    open: Arc<Semaphore>,
    signal: Signal,
) {
    let cfg = Arc::new(cfg);
    let full = {
        let cfg = cfg.clone();
        move |stream, peer| {
            let max = cfg.limits.max_connections;
            warn!(%peer, "{max} client connections are open: refusing one more");
            async move {
                let msg = format!("this member has {max} connections open; try another");
                let mut w = FramedWrite::new(stream, baton_proto::codec(usize::MAX));
                let frame = error_frame(ErrorCode::Busy, msg);
                let _ =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, w.send(bytes::Bytes::from(frame.encode_to_vec()))).await;
            }
        }
    };
    let stop = signal.clone();
    let serve = move |c: accept::Conn| {
        let (signal, input, state, tls, cfg) = (signal.clone(), input.clone(), state.clone(), tls.clone(), cfg.clone());
        async move {
            let (conn, peer, _place) = (c.id, c.peer, c.place);
            debug!(conn, %peer, "client connected");
            let (stream, cert_name) = match accept::secure(c.stream, tls.as_ref(), conn, peer).await {
                Secured::Ready(s, name) => (s, name),
                Secured::NotTls(stream) => {
                    let frame = error_frame(
                        ErrorCode::NoAuth,
                        "this member's client port requires TLS: connect with --cacert (docs/security.md)".into(),
                    );
                    let mut w = FramedWrite::new(stream, baton_proto::codec(usize::MAX));
                    let _ = w.send(bytes::Bytes::from(frame.encode_to_vec())).await;
                    debug!(conn, %peer, "plaintext client on the TLS port: refused");
                    return;
                }
                Secured::Failed => return,
            };
            handle(conn, stream, input, &cfg, state, fast_reads, cert_name, signal).await;
            debug!(conn, "client disconnected");
        }
    };
    accept::serve("client", listener, open, stop, full, serve).await;
}

/// A password `auth`: checked off the runtime's threads (PBKDF2 is slow
/// on purpose); on success the connection gains `user:<name>` and
/// ZooKeeper's `digest:<name>:<hash>` of the same password (acl.rs), so one
/// login serves ACLs written through either port. A name and password
/// whose digest identity is a `--superuser` (the first admin of a cluster
/// without client certificates: docs/operations.md, The first admin) gain
/// that identity even when no such password user exists.
async fn auth(state: &SharedState, tx: &ConnTx, id: u64, a: &AuthReq, superusers: &[String]) -> Response {
    let (st, user, password) = (state.clone(), a.user.clone(), a.password.clone());
    let ok = tokio::task::spawn_blocking(move || password_ok(&st, &user, &password)).await.unwrap_or(false);
    let zxid = crate::view::read(state).applied();
    let digest = crate::acl::digest(&a.user, &a.password);
    if !ok && superusers.contains(&digest) {
        tx.add_identity(digest);
        return Response { id, zxid, body: Some(response::Body::Empty(Empty {})), ..Default::default() };
    }
    if ok {
        tx.add_identity(format!("user:{}", a.user));
        tx.add_identity(crate::acl::digest(&a.user, &a.password));
        return Response { id, zxid, body: Some(response::Body::Empty(Empty {})), ..Default::default() };
    }
    let msg = format!("auth as {:?}: unknown user or wrong password", a.user);
    Response { id, zxid, error: ErrorCode::NoAuth as i32, message: msg, ..Default::default() }
}

/// True when `user` is a password user and `password` is theirs. Blocks
/// for the PBKDF2 hash (call it off the runtime's threads); the state's
/// lock is held only to copy the user's salt and hash. See
/// [`check_password`] for what bounds its cost.
pub(crate) fn password_ok(state: &SharedState, user: &str, password: &str) -> bool {
    let stored = crate::view::read(state).user_hash(user);
    check_password(stored.as_ref().map(|(s, h)| (s.as_ref(), h.as_ref())), password)
}

/// [`password_ok`] for the ZooKeeper port's `addauth digest`, where any name
/// and password are accepted (as in ZooKeeper) and the check only adds the
/// `user:` identity of a Baton password user. An unknown name is not
/// hashed (every ZooKeeper client's login would cost a PBKDF2, two at a
/// time per member) but waits as long as a check takes on this member
/// lately ([`wait_like_a_check`]), so the answer's timing does not tell
/// which names are Baton users (finding A5). With no Baton users at all
/// there is nothing to tell, and no wait.
pub(crate) fn password_user(state: &SharedState, user: &str, password: &str) -> bool {
    let (stored, any_users) = {
        let st = crate::view::read(state);
        (st.user_hash(user), st.has_users())
    };
    password_user_with(stored, any_users, password)
}

/// [`password_user`] once the user's (salt, hash) and whether there are
/// users at all are read.
fn password_user_with(stored: Option<(bytes::Bytes, bytes::Bytes)>, any_users: bool, password: &str) -> bool {
    match stored {
        Some((salt, hash)) => check_password(Some((salt.as_ref(), hash.as_ref())), password),
        None => {
            if any_users {
                wait_like_a_check();
            }
            false
        }
    }
}

/// How long the last password checks took on this member (an average, in
/// ns; 0 before the first): the hash itself, not the wait for a place.
static CHECK_NANOS: AtomicU64 = AtomicU64::new(0);

/// Sleeps as long as a password check takes here lately, without hashing
/// or taking one of the [`PASSWORD_CHECKS_AT_ONCE`] places. Before any
/// check ran, runs one (against the dummy) to learn how long it takes.
fn wait_like_a_check() {
    match CHECK_NANOS.load(Ordering::Relaxed) {
        0 => {
            let _ = check_password(None, "");
        }
        n => std::thread::sleep(std::time::Duration::from_nanos(n)),
    }
}

/// Password checks a member runs at once: each is a 100,000-round PBKDF2,
/// so many connections sending `auth` at once cost at most this many
/// threads; the others wait their turn (each connection's own requests
/// wait for its `auth`, so one connection has one check at a time).
pub const PASSWORD_CHECKS_AT_ONCE: usize = 2;

static CHECKS_RUNNING: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static CHECK_FREED: std::sync::Condvar = std::sync::Condvar::new();
/// PBKDF2 runs so far (tests).
static HASHES_RUN: AtomicU64 = AtomicU64::new(0);

/// One of the [`PASSWORD_CHECKS_AT_ONCE`] places, held while hashing.
struct CheckSlot;

impl CheckSlot {
    fn take() -> CheckSlot {
        let mut n = CHECKS_RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        while *n >= PASSWORD_CHECKS_AT_ONCE {
            n = CHECK_FREED.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        *n += 1;
        CheckSlot
    }
}

impl Drop for CheckSlot {
    fn drop(&mut self) {
        let mut n = CHECKS_RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        CHECK_FREED.notify_one();
    }
}

/// Checks `password` against a user's stored (salt, hash), None for a name
/// that is no user: that one is hashed too, against a fixed dummy, so an
/// unknown name costs what a known one does and the answer's timing does
/// not tell which names exist (finding A5). At most
/// [`PASSWORD_CHECKS_AT_ONCE`] run at once on the member.
fn check_password(stored: Option<(&[u8], &[u8])>, password: &str) -> bool {
    static DUMMY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    const DUMMY_SALT: &[u8] = b"baton-no-such-user";
    let dummy = DUMMY.get_or_init(|| baton_proto::auth::hash_password("", DUMMY_SALT));
    let _slot = CheckSlot::take();
    HASHES_RUN.fetch_add(1, Ordering::Relaxed);
    let started = std::time::Instant::now();
    let ok = match stored {
        Some((salt, hash)) => baton_proto::auth::verify_password(password, salt, hash),
        None => {
            let _ = baton_proto::auth::verify_password(password, DUMMY_SALT, dummy);
            false
        }
    };
    let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
    let _ = CHECK_NANOS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        Some(if old == 0 { took } else { old - old / 4 + took / 4 })
    });
    ok
}

fn error_frame(code: ErrorCode, msg: String) -> ServerFrame {
    ServerFrame {
        frame: Some(server_frame::Frame::Response(Response { error: code as i32, message: msg, ..Default::default() })),
    }
}

#[allow(clippy::too_many_arguments)]
async fn handle(
    conn: u64,
    stream: BoxStream,
    input: InputTx,
    cfg: &Config,
    state: SharedState,
    fast_reads: bool,
    cert_name: Option<String>,
    mut signal: Signal,
) {
    let max_frame = cfg.max_frame;
    let (rd, wr) = tokio::io::split(stream);
    let (tx, rx) = ConnTx::new(cfg.limits.max_queued_bytes);
    if let Some(cn) = cert_name {
        tx.add_identity(format!("x509:{cn}"));
    }
    let slots = Arc::new(Semaphore::new(cfg.limits.max_inflight));
    if input.send(Input::ConnOpened { conn, tx: tx.clone() }).is_err() {
        return;
    }
    let (noted, notes) = unbounded_channel();
    let slow = (cfg.slow_request_ms > 0).then(|| std::time::Duration::from_millis(cfg.slow_request_ms));
    let writer = tokio::spawn(write_loop(wr, rx, slots.clone(), tx.gauge(), notes, conn, slow));
    let mut frames = FramedRead::new(rd, baton_proto::codec(max_frame));
    let closed = tx.gauge().closed().clone();
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = closed.cancelled() => break,
            _ = signal.wait() => break,
        };
        let next = tokio::select! {
            f = frames.next() => f,
            _ = closed.cancelled() => break,
            _ = signal.wait() => break,
        };
        let frame = match next {
            None => break,
            Some(Ok(f)) => f,
            Some(Err(e)) => {
                let too_big =
                    e.get_ref().is_some_and(|inner| inner.is::<tokio_util::codec::LengthDelimitedCodecError>());
                let code = if too_big { ErrorCode::TooLarge } else { ErrorCode::BadRequest };
                let _ = tx.send(error_frame(code, format!("bad frame: {e} (limit {max_frame} bytes); closing")));
                break;
            }
        };
        crate::metrics::client_bytes(frame.len(), 0);
        let req = match ClientFrame::decode(frame) {
            Ok(ClientFrame { request: Some(r) }) => r,
            Ok(ClientFrame { request: None }) => {
                let _ = tx.send(error_frame(ErrorCode::BadRequest, "frame without a request".into()));
                break;
            }
            Err(e) => {
                let _ = tx.send(error_frame(ErrorCode::BadRequest, format!("undecodable frame: {e}; closing")));
                break;
            }
        };
        if req.id == 0 {
            // Id 0 marks connection-level errors in responses.
            let _ = tx.send(error_frame(ErrorCode::BadRequest, "request id 0 is reserved".into()));
            continue;
        }
        permit.forget(); // returned by the writer when the response goes out
        let _ = noted.send(Noted {
            id: req.id,
            kind: crate::metrics::request_kind(req.body.as_ref()),
            since: Instant::now(),
        });
        if let Some(request::Body::Auth(a)) = &req.body {
            let resp = auth(&state, &tx, req.id, a, &crate::settings::current(&state, cfg).superusers).await;
            let _ = tx.send(ServerFrame { frame: Some(server_frame::Frame::Response(resp)) });
            continue;
        }
        let caller = || Caller::new(tx.identities(), &crate::settings::current(&state, cfg).superusers);
        if let Some(resp) = fast_reads.then(|| fast_read(&state, &req, &caller())).flatten() {
            let resp = capped(resp, cfg.limits.max_reply_bytes);
            let _ = tx.send(ServerFrame { frame: Some(server_frame::Frame::Response(resp)) });
            continue;
        }
        if input.send(Input::Client { conn, req }).is_err() {
            let _ = tx.send(error_frame(ErrorCode::ShuttingDown, "member is shutting down".into()));
            break;
        }
    }
    let _ = input.send(Input::ConnClosed { conn });
    drop(tx);
    // The writer ends when the driver drops its sender (after ConnClosed);
    // bound the wait so a dead driver cannot keep this task alive.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
}

/// A request read: its id, type and when. The reader sends one to the
/// writer before the request goes on, so the writer holds the note before
/// the answer (a channel, not a map both tasks lock: issue 26, R2).
struct Noted {
    id: u64,
    kind: &'static str,
    since: Instant,
}

/// A client connection's side of the batch writer: counts bytes, frees a
/// request slot and records each answered request.
struct ClientOutbox {
    slots: Arc<Semaphore>,
    gauge: Arc<QueueGauge>,
    notes: UnboundedReceiver<Noted>,
    /// Requests read and not yet answered: their type and when read.
    inflight: HashMap<u64, (&'static str, Instant)>,
    conn: u64,
    slow: Option<std::time::Duration>,
}

impl ClientOutbox {
    /// Counts, times and (when slow) logs one answered request.
    fn answered(&mut self, r: &Response) {
        while let Ok(n) = self.notes.try_recv() {
            self.inflight.insert(n.id, (n.kind, n.since));
        }
        let Some((kind, since)) = self.inflight.remove(&r.id) else { return };
        let took = since.elapsed();
        let code = (r.error != 0).then(|| ErrorCode::try_from(r.error).map_or("UNKNOWN", |c| c.as_str_name()));
        crate::metrics::request(kind, code, took);
        if self.slow.is_some_and(|s| took >= s) {
            let took_ms = took.as_millis() as u64;
            warn!(conn = self.conn, id = r.id, kind, error = code.unwrap_or("OK"), took_ms, "slow request");
        }
    }
}

impl Outbox for ClientOutbox {
    type Item = ServerFrame;
    fn frame(&mut self, f: ServerFrame) -> Option<bytes::Bytes> {
        if self.gauge.closed().is_cancelled() {
            return None; // over its queue limit: being closed
        }
        let bytes = bytes::Bytes::from(f.encode_to_vec());
        self.gauge.written(bytes.len()); // what `ConnTx::send` counted: its encoded length
        crate::metrics::client_bytes(0, bytes.len());
        if let Some(server_frame::Frame::Response(r)) = &f.frame {
            if r.id != 0 {
                self.slots.add_permits(1);
                self.answered(r);
            }
        }
        Some(bytes)
    }
}

async fn write_loop(
    wr: tokio::io::WriteHalf<BoxStream>,
    mut rx: UnboundedReceiver<ServerFrame>,
    slots: Arc<Semaphore>,
    gauge: Arc<QueueGauge>,
    notes: UnboundedReceiver<Noted>,
    conn: u64,
    slow: Option<std::time::Duration>,
) {
    let mut w = FramedWrite::new(wr, baton_proto::codec(usize::MAX));
    let mut out = ClientOutbox { slots, gauge, notes, inflight: HashMap::new(), conn, slow };
    while write_batch(&mut w, &mut rx, MAX_BATCH, &mut out).await == Batch::Written {
        if out.gauge.closed().is_cancelled() {
            return;
        }
    }
}

#[cfg(test)]
mod password_tests {
    use super::*;

    /// Finding A5: an unknown name answered at once (no hash), so timing
    /// told which users exist (on both ports), and checks had no
    /// member-wide bound.
    #[test]
    fn an_unknown_name_is_hashed_too_and_checks_run_at_most_two_at_once() {
        let before = HASHES_RUN.load(Ordering::Relaxed);
        assert!(!check_password(None, "guess"));
        assert!(HASHES_RUN.load(Ordering::Relaxed) > before, "an unknown name was not hashed");
        let salt = b"0123456789abcdef";
        let hash = baton_proto::auth::hash_password("pw", salt);
        assert!(check_password(Some((salt, &hash)), "pw"));
        assert!(!check_password(Some((salt, &hash)), "nope"));
        // The ZooKeeper port: an unknown name waits as long as a check
        // takes, without hashing; with no users at all, no wait.
        let stored = Some((bytes::Bytes::copy_from_slice(salt), bytes::Bytes::from(hash.clone())));
        assert!(password_user_with(stored.clone(), true, "pw"));
        assert!(!password_user_with(stored, true, "nope"));
        let check = std::time::Duration::from_nanos(CHECK_NANOS.load(Ordering::Relaxed));
        let t = std::time::Instant::now();
        assert!(!password_user_with(None, true, "pw"));
        let unknown = t.elapsed();
        assert!(unknown >= check / 2, "an unknown name answered in {unknown:?}, a check takes {check:?}");
        let t = std::time::Instant::now();
        assert!(!password_user_with(None, false, "pw"));
        assert!(t.elapsed() < check / 2, "waited with no users to hide");
        // Eight threads at once: never more than the bound inside.
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let now = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (peak, now) = (peak.clone(), now.clone());
                std::thread::spawn(move || {
                    let _slot = CheckSlot::take();
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert!(peak.load(Ordering::SeqCst) <= PASSWORD_CHECKS_AT_ONCE, "{peak:?}");
        assert_eq!(peak.load(Ordering::SeqCst), PASSWORD_CHECKS_AT_ONCE, "the slots were never shared");
    }
}
