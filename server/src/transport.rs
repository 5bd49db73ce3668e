//! Peer transport: TCP, length-delimited frames of `PeerFrame`.
//!
//! One outbound connection per peer, owned by a task that batches whatever
//! the driver queued since its last write into one flush. Connections are
//! one-way (we only write on the ones we dial, and only read on the ones we
//! accept), so there is no ordering between the two directions to keep.
//! While a peer is down, its queue is drained and dropped (Raft retransmits)
//! and the driver is told the peer is unreachable; reconnects back off from
//! 50 ms to 1 s.
//!
//! raft-rs messages travel as protobuf-2 bytes inside our prost frame; they
//! are decoded only from peers (protobuf 2.28 has RUSTSEC-2024-0437).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::mpsc::Sender;
use std::time::Duration;

use baton_proto::{
    peer_frame, PeerFrame, PeerHello, SessionSync, SessionSyncAck, SessionTouch, TouchAck, MAX_PEER_FRAME,
};
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, info, warn};

use crate::message::{Input, PeerOut, PeerSink, Report};

/// Messages written per flush at most.
const MAX_BATCH: usize = 512;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The driver's handle: one queue per peer. Queues are unbounded because
/// raft-rs bounds what it sends (`max_inflight_msgs` appends per peer).
pub struct Transport {
    queues: HashMap<u64, UnboundedSender<PeerOut>>,
}

impl PeerSink for Transport {
    fn send(&self, to: u64, msg: PeerOut) {
        if let Some(q) = self.queues.get(&to) {
            let _ = q.send(msg);
        }
    }
}

/// Starts one sender task per other member (call inside a tokio runtime).
pub fn start_senders(me: u64, peers: &BTreeMap<u64, SocketAddr>, input: Sender<Input>) -> Transport {
    let mut queues = HashMap::new();
    for (&id, &addr) in peers {
        if id == me {
            continue;
        }
        let (tx, rx) = unbounded_channel();
        queues.insert(id, tx);
        tokio::spawn(sender(me, id, addr, rx, input.clone()));
    }
    Transport { queues }
}

fn encode(msg: PeerOut) -> Option<(bytes::Bytes, bool)> {
    let (frame, snap) = match msg {
        PeerOut::Raft(m) => {
            let snap = m.get_msg_type() == MessageType::MsgSnapshot;
            match m.write_to_bytes() {
                Ok(b) => (peer_frame::Frame::Raft(b.into()), snap),
                Err(e) => {
                    warn!("cannot encode raft message: {e}");
                    return None;
                }
            }
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

async fn sender(me: u64, to: u64, addr: SocketAddr, mut rx: UnboundedReceiver<PeerOut>, input: Sender<Input>) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            _ => {
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
            }
        };
        backoff = BACKOFF_MIN;
        let _ = stream.set_nodelay(true);
        debug!(to, %addr, "peer connected");
        let mut w = FramedWrite::new(stream, baton_proto::codec(MAX_PEER_FRAME));
        let hello = PeerFrame { frame: Some(peer_frame::Frame::Hello(PeerHello { from: me, cluster_version: 1 })) };
        if w.send(bytes::Bytes::from(hello.encode_to_vec())).await.is_err() {
            continue;
        }
        loop {
            let Some(first) = rx.recv().await else { return };
            let mut snaps = 0;
            let mut failed = false;
            let mut next = Some(first);
            let mut n = 0;
            while let Some(msg) = next.take() {
                if let Some((bytes, snap)) = encode(msg) {
                    snaps += snap as usize;
                    if w.feed(bytes).await.is_err() {
                        failed = true;
                        break;
                    }
                }
                n += 1;
                if n < MAX_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            if !failed && SinkExt::<bytes::Bytes>::flush(&mut w).await.is_err() {
                failed = true;
            }
            for _ in 0..snaps {
                let _ = input.send(Input::SnapshotSent { to, ok: !failed });
            }
            if failed {
                let _ = input.send(Input::Unreachable(to));
                info!(to, "peer connection lost");
                break;
            }
        }
    }
}

/// Accepts peer connections and feeds their messages to the driver.
pub async fn serve(listener: TcpListener, me: u64, input: Sender<Input>) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!("peer accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let input = input.clone();
        tokio::spawn(async move {
            let (peer, r) = receive(stream, me, &input).await;
            if let Err(e) = r {
                debug!(%from, "peer connection closed: {e}");
            }
            if let Some(p) = peer {
                let _ = input.send(Input::PeerGone(p));
            }
        });
    }
}

/// Reads one peer's connection until it closes; returns who it was (once
/// the hello said so) and why it ended.
async fn receive(stream: TcpStream, me: u64, input: &Sender<Input>) -> (Option<u64>, anyhow::Result<()>) {
    let _ = stream.set_nodelay(true);
    let mut r = FramedRead::new(stream, baton_proto::codec(MAX_PEER_FRAME));
    let peer = match hello(&mut r).await {
        Ok(p) => p,
        Err(e) => return (None, Err(e)),
    };
    (Some(peer), frames(&mut r, peer, me, input).await)
}

async fn hello(r: &mut FramedRead<TcpStream, tokio_util::codec::LengthDelimitedCodec>) -> anyhow::Result<u64> {
    let first = r.next().await.ok_or_else(|| anyhow::anyhow!("closed before hello"))??;
    match PeerFrame::decode(first)?.frame {
        Some(peer_frame::Frame::Hello(h)) => Ok(h.from),
        _ => anyhow::bail!("first peer frame is not a hello"),
    }
}

async fn frames(
    r: &mut FramedRead<TcpStream, tokio_util::codec::LengthDelimitedCodec>,
    peer: u64,
    me: u64,
    input: &Sender<Input>,
) -> anyhow::Result<()> {
    while let Some(frame) = r.next().await {
        match PeerFrame::decode(frame?)?.frame {
            Some(peer_frame::Frame::Raft(b)) => {
                let mut m = Message::default();
                m.merge_from_bytes(&b)?;
                if m.from != peer || m.to != me {
                    anyhow::bail!("raft message from {} to {} on {peer}'s connection", m.from, m.to);
                }
                if input.send(Input::Peer(Box::new(m))).is_err() {
                    return Ok(());
                }
            }
            Some(peer_frame::Frame::Hello(_)) | None => anyhow::bail!("unexpected peer frame"),
            Some(other) => {
                if let Some(out) = session_frame(other) {
                    let _ = input.send(out.into_input(peer));
                }
            }
        }
    }
    Ok(())
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
        F::Hello(_) | F::Raft(_) => return None,
    })
}
