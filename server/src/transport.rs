//! Peer transport: TCP (TLS when configured), length-delimited frames of
//! `PeerFrame`.
//!
//! One outbound connection per peer, owned by a task that batches whatever
//! the driver queued since its last write into one flush (the shared batch
//! writer, batch.rs). On shutdown (shutdown.rs) every link and the
//! acceptor stop. Connections are
//! one-way (we only write on the ones we dial, and only read on the ones we
//! accept), so there is no ordering between the two directions to keep;
//! the one exception is the acceptor's `PeerRefused` frame, which the
//! dialer reads and logs. While a peer is down, its queue is drained and
//! dropped (Raft retransmits) and the driver is told the peer is
//! unreachable; reconnects back off from 50 ms to 1 s. A dial that
//! connected to itself (a peer's port in the ephemeral range, nothing
//! listening yet) is dropped at once and logged (`baton_proto::net`), so
//! the dialer never holds the port its peer needs to bind.
//!
//! Admission (the rule is in `cluster.rs`), after the accept loop every
//! port shares (accept.rs): the TLS handshake (mutual, when
//! `--peer-ca` is set), then the hello, within [`ADMIT_TIMEOUT`], with
//! frames limited to `HELLO_FRAME_LIMIT`; at most [`MAX_ADMITTING`]
//! connections are being admitted at once (more are closed at accept).
//! raft-rs messages travel as protobuf-2 bytes inside our prost frame and
//! are decoded only on admitted connections (protobuf 2.28 has
//! RUSTSEC-2024-0437). A raft message whose `from` is not the admitted peer,
//! or whose `to` is not this member, is dropped and logged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::tls::{cert_names_member, member_name, BoxStream};
use baton_proto::{
    peer_frame, PeerFrame, PeerRefused, SessionSync, SessionSyncAck, SessionTouch, TouchAck, MAX_PEER_FRAME,
};
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use tokio::io::{AsyncWriteExt, ReadHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tracing::{debug, error, info, warn};

use crate::batch::{write_batch, Batch, Outbox};
use crate::cluster::{self, Verdict, HELLO_FRAME_LIMIT};
use crate::message::{Input, InputTx, PeerOut, PeerSink, Report};
use crate::shutdown::Signal;
use crate::view::SharedState;

/// Messages written per flush at most.
const MAX_BATCH: usize = 512;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Time an accepted connection has to finish TLS and send its hello.
pub const ADMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections being admitted at once.
pub const MAX_ADMITTING: usize = 64;

/// Peer-port TLS: both ends of every link (see `baton_proto::tls`).
#[derive(Clone)]
pub struct PeerTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub connector: tokio_rustls::TlsConnector,
}

impl PeerTls {
    pub fn load(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> Result<Self, baton_proto::tls::TlsError> {
        let server = baton_proto::tls::server_config(cert, key, Some(ca))?;
        let client = baton_proto::tls::client_config(ca, Some((cert, key)))?;
        Ok(PeerTls { acceptor: server.into(), connector: client.into() })
    }
}

/// What the transport needs to introduce this member and admit others.
#[derive(Clone)]
pub struct PeerAuth {
    pub me: u64,
    /// The configuration's members (membership.rs), as the driver last set
    /// them through [`Transport`].
    pub members: Members,
    pub tls: Option<PeerTls>,
    /// The state machine: the cluster record (cluster.rs).
    pub state: SharedState,
    /// This data dir's incarnation and the peers' (cluster.rs, rule 6).
    pub incarnations: Arc<cluster::Incarnations>,
}

/// The member ids the acceptor admits, shared with the driver's handle.
pub type Members = Arc<std::sync::RwLock<BTreeSet<u64>>>;

impl PeerAuth {
    fn cluster(&self) -> baton_proto::ClusterRecord {
        crate::view::read(&self.state).cluster().clone()
    }

    fn members(&self) -> BTreeSet<u64> {
        self.members.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A link to open: the member, its peer address, its queue.
type NewLink = (u64, String, UnboundedReceiver<PeerOut>);

/// The driver's handle: one queue per other member. Queues are unbounded
/// because raft-rs bounds what it sends (`max_inflight_msgs` appends per
/// peer). `set_members` opens links to new members (their sender tasks
/// start in the runtime) and closes the queues of removed ones (their tasks
/// end).
pub struct Transport {
    me: u64,
    queues: HashMap<u64, (String, UnboundedSender<PeerOut>)>,
    members: Members,
    links: UnboundedSender<NewLink>,
}

impl PeerSink for Transport {
    fn send(&self, to: u64, msg: PeerOut) {
        if let Some((_, q)) = self.queues.get(&to) {
            let _ = q.send(msg);
        }
    }

    fn set_members(&mut self, members: &BTreeMap<u64, String>) {
        *self.members.write().unwrap_or_else(|p| p.into_inner()) = members.keys().copied().collect();
        self.queues.retain(|id, (addr, _)| members.get(id) == Some(addr));
        for (&id, addr) in members {
            if id == self.me || self.queues.contains_key(&id) {
                continue;
            }
            let (tx, rx) = unbounded_channel();
            self.queues.insert(id, (addr.clone(), tx));
            let _ = self.links.send((id, addr.clone(), rx));
        }
    }
}

/// The links the driver opens, for [`start_senders`] to serve.
pub struct Links {
    rx: UnboundedReceiver<NewLink>,
}

/// The driver's handle, the links it will open, and the member set the
/// acceptor checks.
pub fn transport(me: u64) -> (Transport, Links, Members) {
    let (links, rx) = unbounded_channel();
    let members = Members::default();
    (Transport { me, queues: HashMap::new(), members: members.clone(), links }, Links { rx }, members)
}

/// Starts a sender task for every link the driver opens (call inside a
/// tokio runtime).
pub fn start_senders(mut links: Links, input: InputTx, auth: PeerAuth, mut signal: Signal) {
    tokio::spawn(async move {
        loop {
            let (id, addr, rx) = tokio::select! {
                l = links.rx.recv() => match l { Some(l) => l, None => return },
                _ = signal.wait() => return,
            };
            info!(peer = id, %addr, "link to member {id}");
            let (input, auth, mut signal) = (input.clone(), auth.clone(), signal.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = sender(id, addr, rx, input, auth) => {}
                    _ = signal.wait() => {}
                }
            });
        }
    });
}

/// A peer link's side of the batch writer: encodes, counts bytes, and
/// reports each snapshot sent once its batch is flushed (or failed).
struct PeerOutbox<'a> {
    to: u64,
    input: &'a InputTx,
    snaps: usize,
}

impl Outbox for PeerOutbox<'_> {
    type Item = PeerOut;
    fn frame(&mut self, msg: PeerOut) -> Option<bytes::Bytes> {
        let (bytes, snap) = encode(msg)?;
        self.snaps += snap as usize;
        crate::metrics::peer_bytes(0, bytes.len());
        Some(bytes)
    }
    fn flushed(&mut self, ok: bool) {
        crate::metrics::peer_flush();
        for _ in 0..std::mem::take(&mut self.snaps) {
            let _ = self.input.send(Input::SnapshotSent { to: self.to, ok });
        }
    }
}

fn encode(msg: PeerOut) -> Option<(bytes::Bytes, bool)> {
    crate::metrics::peer_message(message_kind(&msg));
    let (frame, snap) = match msg {
        PeerOut::Raft(m) => {
            // Written once, straight into the frame (issue 26, R2).
            let snap = m.get_msg_type() == MessageType::MsgSnapshot;
            let len = m.compute_size() as usize;
            let mut failed = None;
            let bytes = baton_proto::peer_frame_raft_bytes(len, |buf| {
                let mut out = protobuf::CodedOutputStream::vec(buf);
                if let Err(e) = m.write_to_with_cached_sizes(&mut out).and_then(|()| out.flush()) {
                    failed = Some(e);
                }
            });
            if let Some(e) = failed {
                warn!("cannot encode raft message: {e}");
                return None;
            }
            return Some((bytes, snap));
        }
        PeerOut::Touch { ids, batch } => (peer_frame::Frame::Touch(SessionTouch { session_ids: ids, batch }), false),
        PeerOut::TouchAck { batch, expired, expiring } => {
            (peer_frame::Frame::TouchAck(TouchAck { batch, expired, expiring }), false)
        }
        PeerOut::Sync { term, round, ids, want_report } => {
            (peer_frame::Frame::Sync(SessionSync { term, round, session_ids: ids, want_report }), false)
        }
        PeerOut::SyncAck { term, round, report } => {
            let has_report = report.is_some();
            let Report { boot_age_ms, ages } = report.unwrap_or_default();
            (peer_frame::Frame::SyncAck(SessionSyncAck { term, round, has_report, report: ages, boot_age_ms }), false)
        }
    };
    Some((PeerFrame { frame: Some(frame) }.encode_to_vec().into(), snap))
}

/// Dials `to`: TCP, then TLS verifying that the far end is `to`'s
/// certificate.
async fn dial(to: u64, addr: &str, auth: &PeerAuth) -> Option<BoxStream> {
    // A name is resolved on every dial: a member that moved is found again.
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, baton_proto::net::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) if baton_proto::net::is_self_connect(&e) => {
            warn!(to, %addr, "peer dial: {e}");
            return None;
        }
        _ => return None,
    };
    let _ = tcp.set_nodelay(true);
    let Some(tls) = &auth.tls else { return Some(Box::new(tcp)) };
    let name = match rustls_pki_types::ServerName::try_from(member_name(to)) {
        Ok(n) => n,
        Err(e) => {
            error!(to, "bad member name: {e}");
            return None;
        }
    };
    match tokio::time::timeout(ADMIT_TIMEOUT, tls.connector.connect(name, tcp)).await {
        Ok(Ok(s)) => Some(Box::new(s)),
        Ok(Err(e)) => {
            warn!(to, %addr, "TLS to member {to} failed: {e}");
            None
        }
        Err(_) => {
            warn!(to, %addr, "TLS to member {to} timed out");
            None
        }
    }
}

/// Logs the acceptor's refusal, if it sends one.
async fn read_refusal(to: u64, rd: ReadHalf<BoxStream>) {
    let mut r = FramedRead::new(rd, baton_proto::codec(HELLO_FRAME_LIMIT));
    if let Some(Ok(frame)) = r.next().await {
        if let Ok(PeerFrame { frame: Some(peer_frame::Frame::Refused(PeerRefused { reason, removed, wiped })) }) =
            PeerFrame::decode(frame)
        {
            error!(to, "member {to} refused this member: {reason}");
            if removed || wiped {
                // cluster.rs rules 2, 5 and 6: a removed or wiped member stops.
                eprintln!("batond: {reason}");
                std::process::exit(2);
            }
        }
    }
}

async fn sender(to: u64, addr: String, mut rx: UnboundedReceiver<PeerOut>, input: InputTx, auth: PeerAuth) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let Some(stream) = dial(to, &addr, &auth).await else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
            // Drop what queued meanwhile; Raft will send again.
            let mut dropped = false;
            loop {
                match rx.try_recv() {
                    Ok(PeerOut::Raft(m)) => {
                        dropped = true;
                        if m.get_msg_type() == MessageType::MsgSnapshot {
                            let _ = input.send(Input::SnapshotSent { to, ok: false });
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
            if dropped {
                let _ = input.send(Input::Unreachable(to));
            }
            continue;
        };
        backoff = BACKOFF_MIN;
        debug!(to, %addr, "peer connected");
        let (rd, wr) = tokio::io::split(stream);
        let refusal = tokio::spawn(read_refusal(to, rd));
        let mut w = FramedWrite::new(wr, baton_proto::codec(MAX_PEER_FRAME));
        let hello = PeerFrame {
            frame: Some(peer_frame::Frame::Hello(cluster::hello(auth.me, to, &auth.cluster(), &auth.incarnations))),
        };
        if w.send(bytes::Bytes::from(hello.encode_to_vec())).await.is_err() {
            refusal.abort();
            continue;
        }
        let mut out = PeerOutbox { to, input: &input, snaps: 0 };
        loop {
            match write_batch(&mut w, &mut rx, MAX_BATCH, &mut out).await {
                Batch::Written => {}
                Batch::Closed => {
                    refusal.abort();
                    return;
                }
                Batch::Failed => {
                    let _ = input.send(Input::Unreachable(to));
                    info!(to, "peer connection lost");
                    refusal.abort();
                    break;
                }
            }
        }
    }
}

/// Accepts peer connections, admits them (cluster.rs) and feeds their
/// messages to the driver.
pub async fn serve(listener: TcpListener, input: InputTx, auth: PeerAuth, signal: Signal) {
    let admitting = Arc::new(tokio::sync::Semaphore::new(MAX_ADMITTING));
    let full = |_stream, from| {
        warn!(%from, "{MAX_ADMITTING} peer connections are being admitted already; closing this one");
        async {}
    };
    let stop = signal.clone();
    let serve = move |c: crate::accept::Conn| {
        let (input, auth, mut signal) = (input.clone(), auth.clone(), signal.clone());
        async move {
            let from = c.peer;
            let admitted = match tokio::time::timeout(ADMIT_TIMEOUT, admit(c.stream, &auth)).await {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => {
                    debug!(%from, "peer connection not admitted: {e}");
                    return;
                }
                Err(_) => {
                    debug!(%from, "peer connection not admitted: no TLS handshake and hello within {ADMIT_TIMEOUT:?}");
                    return;
                }
            };
            drop(c.place);
            let (peer, mut r) = admitted;
            tokio::select! {
                r = frames(&mut r, peer, auth.me, &input) => if let Err(e) = r {
                    debug!(%from, "peer connection closed: {e}");
                },
                _ = signal.wait() => return,
            }
            let _ = input.send(Input::PeerGone(peer));
        }
    };
    crate::accept::serve("peer", listener, admitting, stop, full, serve).await;
}

type PeerReader = FramedRead<ReadHalf<BoxStream>, LengthDelimitedCodec>;

/// TLS, then the hello: who the peer is, if it may talk to this member.
async fn admit(tcp: TcpStream, auth: &PeerAuth) -> anyhow::Result<(u64, PeerReader)> {
    // (accept.rs set TCP_NODELAY.)
    let (stream, cert): (BoxStream, _) = match &auth.tls {
        Some(tls) => {
            let s = tls.acceptor.accept(tcp).await?;
            let cert = s.get_ref().1.peer_certificates().and_then(|c| c.first()).cloned();
            (Box::new(s), cert)
        }
        None => (Box::new(tcp), None),
    };
    let (rd, wr) = tokio::io::split(stream);
    let mut r = FramedRead::new(rd, baton_proto::codec(HELLO_FRAME_LIMIT));
    let first = r.next().await.ok_or_else(|| anyhow::anyhow!("closed before hello"))??;
    // A Baton client that dialled this port by mistake is told so (a
    // client's request would also decode as a hello).
    if let Some(reply) = baton_proto::not_a_client_port(&first, "a Baton peer port") {
        let mut wr = wr;
        let _ = wr.write_all(&reply).await;
        anyhow::bail!("a client request on the peer port");
    }
    let hello = match PeerFrame::decode(first)?.frame {
        Some(peer_frame::Frame::Hello(h)) => h,
        _ => anyhow::bail!("first peer frame is not a hello"),
    };
    let mut verdict = cluster::judge(auth.me, auth.incarnations.me, &auth.members(), &auth.cluster(), &hello);
    // Rule 3 before anything a hello can make this member do or remember.
    if !matches!(verdict, Verdict::Refuse(_))
        && auth.tls.is_some()
        && !cert.is_some_and(|c| cert_names_member(&c, hello.from))
    {
        verdict = Verdict::Refuse(format!(
            "the peer says it is member {} but its certificate does not name {}",
            hello.from,
            member_name(hello.from)
        ));
    }
    if verdict == Verdict::Admit {
        // A first contact syncs the peer's incarnation to disk: off the
        // runtime's threads.
        let (inc, h) = (auth.incarnations.clone(), hello.clone());
        verdict = tokio::task::spawn_blocking(move || inc.admit(&h))
            .await
            .unwrap_or_else(|e| Verdict::Refuse(format!("recording member {}'s incarnation: {e}", hello.from)));
    }
    let reason = match verdict {
        Verdict::Admit => {
            r.decoder_mut().set_max_frame_length(MAX_PEER_FRAME);
            info!(peer = hello.from, "peer admitted");
            return Ok((hello.from, r));
        }
        Verdict::Refuse(why) => {
            warn!(peer = hello.from, "refusing a peer: {why}");
            why
        }
        Verdict::Removed(why) => {
            warn!(peer = hello.from, "refusing a removed member: {why}");
            send_refusal(wr, PeerRefused { reason: why.clone(), removed: true, wiped: false }).await;
            anyhow::bail!("refused: {why}");
        }
        Verdict::DialerWiped(why) => {
            warn!(peer = hello.from, "refusing a wiped member: {why}");
            send_refusal(wr, PeerRefused { reason: why.clone(), removed: false, wiped: true }).await;
            anyhow::bail!("refused: {why}");
        }
        Verdict::Wiped(why) => {
            error!("{why}");
            eprintln!("batond: {why}");
            refuse(wr, &why).await;
            std::process::exit(2);
        }
    };
    refuse(wr, &reason).await;
    anyhow::bail!("refused: {reason}")
}

async fn refuse(wr: tokio::io::WriteHalf<BoxStream>, reason: &str) {
    send_refusal(wr, PeerRefused { reason: reason.to_string(), ..Default::default() }).await;
}

async fn send_refusal(wr: tokio::io::WriteHalf<BoxStream>, refusal: PeerRefused) {
    let mut w = FramedWrite::new(wr, baton_proto::codec(HELLO_FRAME_LIMIT));
    let frame = PeerFrame { frame: Some(peer_frame::Frame::Refused(refusal)) };
    let _ = tokio::time::timeout(Duration::from_secs(1), w.send(bytes::Bytes::from(frame.encode_to_vec()))).await;
}

async fn frames(r: &mut PeerReader, peer: u64, me: u64, input: &InputTx) -> anyhow::Result<()> {
    while let Some(frame) = r.next().await {
        let frame = frame?;
        crate::metrics::peer_bytes(frame.len(), 0);
        match PeerFrame::decode(frame)?.frame {
            Some(peer_frame::Frame::Raft(b)) => {
                let mut m = Message::default();
                m.merge_from_bytes(&b)?;
                if m.from != peer || m.to != me {
                    warn!(peer, "dropping a raft message from {} to {} on member {peer}'s connection", m.from, m.to);
                    continue;
                }
                if input.send(Input::Peer(Box::new(m), Some(std::time::Instant::now()))).is_err() {
                    return Ok(());
                }
            }
            Some(peer_frame::Frame::Hello(_)) | Some(peer_frame::Frame::Refused(_)) | None => {
                anyhow::bail!("unexpected peer frame")
            }
            Some(other) => {
                if let Some(out) = session_frame(other) {
                    let _ = input.send(out.into_input(peer));
                }
            }
        }
    }
    Ok(())
}

/// A peer message's kind, for `baton_peer_messages_sent_total`.
fn message_kind(msg: &PeerOut) -> &'static str {
    use MessageType as T;
    match msg {
        PeerOut::Raft(m) => match m.get_msg_type() {
            T::MsgAppend => "append",
            T::MsgAppendResponse => "append_response",
            T::MsgHeartbeat => "heartbeat",
            T::MsgHeartbeatResponse => "heartbeat_response",
            T::MsgPropose => "propose",
            T::MsgReadIndex => "read_index",
            T::MsgReadIndexResp => "read_index_response",
            T::MsgRequestVote | T::MsgRequestPreVote => "vote",
            T::MsgRequestVoteResponse | T::MsgRequestPreVoteResponse => "vote_response",
            T::MsgSnapshot => "snapshot",
            _ => "raft_other",
        },
        PeerOut::Touch { .. } => "touch",
        PeerOut::TouchAck { .. } => "touch_ack",
        PeerOut::Sync { .. } => "sync",
        PeerOut::SyncAck { .. } => "sync_ack",
    }
}

/// A session frame as the driver's `PeerOut` (the inverse of `encode`).
fn session_frame(f: peer_frame::Frame) -> Option<PeerOut> {
    use peer_frame::Frame as F;
    Some(match f {
        F::Touch(t) => PeerOut::Touch { ids: t.session_ids, batch: t.batch },
        F::TouchAck(a) => PeerOut::TouchAck { batch: a.batch, expired: a.expired, expiring: a.expiring },
        F::Sync(s) => PeerOut::Sync { term: s.term, round: s.round, ids: s.session_ids, want_report: s.want_report },
        F::SyncAck(a) => {
            let report = a.has_report.then_some(Report { boot_age_ms: a.boot_age_ms, ages: a.report });
            PeerOut::SyncAck { term: a.term, round: a.round, report }
        }
        F::Hello(_) | F::Raft(_) | F::Refused(_) => return None,
    })
}
