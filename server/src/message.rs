//! The messages between the driver and the I/O around it: what comes in
//! ([`Input`]), what goes out to peers ([`PeerOut`] through a [`PeerSink`]),
//! and how a client connection is named ([`ConnId`]).
//!
//! This module is the seam between the deterministic driver
//! (`driver/` and its pieces) and the runtime (`node.rs`, `transport.rs`,
//! `listener.rs`): the runtime turns sockets and timers into `Input`s, the
//! simulator (`server/tests/sim/mod.rs`) makes them up from a seeded schedule. Nothing here
//! does I/O.
//!
//! # Channels, their capacity, and what happens when full
//! | Channel | Type | From | To |
//! |---|---|---|---|
//! | Driver input ([`InputTx`]) | tokio unbounded, of [`Input`] | listener tasks, transport tasks, the signal task, the syncer and snapshot threads (wake-ups) | the driver task (node.rs) |
//! | Per client connection | tokio unbounded, of `ServerFrame`, bounded in bytes by [`ConnTx`] (`--max-queued-bytes`: past it the connection is closed) | the driver, and the listener's own answers (fast reads, `auth`, errors) | that connection's writer task |
//! | Per peer | tokio unbounded, of [`PeerOut`] | the driver, through the transport's [`PeerSink`] | that peer's sender task |
//!
//! The unbounded ones are bounded by their producers: client input by the
//! listener (at most `--max-inflight` requests per connection without a
//! response; its reader stops reading until one is answered), Raft traffic
//! by raft-rs's flow control (`max_inflight_msgs`), a connection's output
//! by [`ConnTx`]'s byte limit; a peer's queue is dropped while the peer is
//! unreachable (transport.rs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use baton_proto::{Request, ServerFrame, SessionAge};
use prost::Message as _;
use raft::prelude::Message;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

/// Where the driver's inputs are sent: a tokio channel, so the driver can
/// be a task on the I/O runtime (node.rs) and a thread (the syncer) can
/// still send to it without blocking.
pub type InputTx = UnboundedSender<Input>;

/// The driver's end of its input channel.
pub type InputRx = UnboundedReceiver<Input>;

/// A client connection's outbound queue (responses and watch events),
/// bounded in bytes: a frame that would take the queue over its limit is
/// not queued and the connection is closed (`closed` fires; the listener
/// ends both directions). A client that stops reading while its watches
/// fire costs the member at most the limit, never its memory.
///
/// It also carries the connection's identities (acl.rs), shared by the
/// listener (which adds them: a client certificate, a password `auth`) and
/// the driver (which checks them).
#[derive(Clone)]
pub struct ConnTx {
    tx: UnboundedSender<ServerFrame>,
    gauge: Arc<QueueGauge>,
    limit: usize,
    identities: Arc<std::sync::RwLock<Vec<String>>>,
}

/// What the writer of a connection shares with its senders (it holds no
/// sender: the queue ends when the last `ConnTx` is dropped).
#[derive(Default)]
pub struct QueueGauge {
    queued: AtomicUsize,
    closed: CancellationToken,
}

impl QueueGauge {
    /// The writer took a frame of `n` bytes off the queue.
    pub fn written(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::Relaxed);
    }

    /// Fires when the queue overflowed.
    pub fn closed(&self) -> &CancellationToken {
        &self.closed
    }
}

impl ConnTx {
    pub fn new(limit: usize) -> (ConnTx, UnboundedReceiver<ServerFrame>) {
        let (tx, rx) = unbounded_channel();
        (ConnTx { tx, gauge: Default::default(), limit, identities: Default::default() }, rx)
    }

    /// The identities this connection has proven (not `world:anyone`).
    pub fn identities(&self) -> Vec<String> {
        self.identities.read().map(|v| v.clone()).unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Adds a proven identity (once).
    pub fn add_identity(&self, id: String) {
        let mut v = self.identities.write().unwrap_or_else(|p| p.into_inner());
        if !v.contains(&id) {
            v.push(id);
        }
    }

    /// Queues `f`; false when the connection is closed or just overflowed.
    pub fn send(&self, f: ServerFrame) -> bool {
        if self.gauge.closed.is_cancelled() {
            return false;
        }
        let n = f.encoded_len();
        let before = self.gauge.queued.fetch_add(n, Ordering::Relaxed);
        if before + n > self.limit {
            tracing::warn!(
                queued = before,
                limit = self.limit,
                "a client is not reading its responses and events: closing its connection"
            );
            self.gauge.closed.cancel();
            return false;
        }
        self.tx.send(f).is_ok()
    }

    /// The queue's gauge, for the connection's writer.
    pub fn gauge(&self) -> Arc<QueueGauge> {
        self.gauge.clone()
    }
}

/// A client connection, as the driver knows it.
pub type ConnId = u64;

/// Everything the driver reacts to. The runtime's channel is unbounded:
/// client input is bounded per connection by the listener (`max_inflight`
/// requests), and peer input by raft-rs's own flow control
/// (`max_inflight_msgs`).
pub enum Input {
    ConnOpened {
        conn: ConnId,
        tx: ConnTx,
    },
    ConnClosed {
        conn: ConnId,
    },
    Client {
        conn: ConnId,
        req: Request,
    },
    /// A Raft message, and when the transport read it (`None` where time
    /// is simulated): the driver logs one that waited long for it.
    Peer(Box<Message>, Option<std::time::Instant>),
    /// Follower -> leader: sessions heard from (see `sessions.rs`).
    Touch {
        from: u64,
        ids: Vec<u64>,
        batch: u64,
    },
    /// Leader -> follower: touch batch `batch` is recorded by a quorum.
    TouchAck {
        from: u64,
        batch: u64,
        expired: Vec<u64>,
        expiring: Vec<u64>,
    },
    /// Leader -> voter: record these touches.
    Sync {
        from: u64,
        term: u64,
        round: u64,
        ids: Vec<u64>,
        want_report: bool,
    },
    /// Voter -> leader: recorded (with this member's records if asked).
    SyncAck {
        from: u64,
        term: u64,
        round: u64,
        report: Option<Report>,
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
    /// The snapshot thread built the snapshot a checkpoint asked for
    /// (syncer.rs), or could not.
    SnapshotBuilt(Box<crate::syncer::Built>),
    /// The snapshot thread built the backup a client asked for (backup.rs).
    BackupBuilt(Box<crate::syncer::BuiltBackup>),
    Shutdown,
}

/// What the driver sends to a peer.
#[derive(Debug, Clone)]
pub enum PeerOut {
    Raft(Box<Message>),
    Touch { ids: Vec<u64>, batch: u64 },
    TouchAck { batch: u64, expired: Vec<u64>, expiring: Vec<u64> },
    Sync { term: u64, round: u64, ids: Vec<u64>, want_report: bool },
    SyncAck { term: u64, round: u64, report: Option<Report> },
}

/// A member's session records, for a new leader (see `sessions.rs`).
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// How long ago the member started: it has no records from before.
    pub boot_age_ms: u64,
    /// Per session: how long ago the member last recorded it.
    pub ages: Vec<SessionAge>,
}

impl PeerOut {
    /// The `Input` this becomes at the receiving member.
    pub fn into_input(self, from: u64) -> Input {
        match self {
            PeerOut::Raft(m) => Input::Peer(m, None),
            PeerOut::Touch { ids, batch } => Input::Touch { from, ids, batch },
            PeerOut::TouchAck { batch, expired, expiring } => Input::TouchAck { from, batch, expired, expiring },
            PeerOut::Sync { term, round, ids, want_report } => Input::Sync { from, term, round, ids, want_report },
            PeerOut::SyncAck { term, round, report } => Input::SyncAck { from, term, round, report },
        }
    }
}

/// Outgoing peer traffic: the driver hands messages to the transport (or
/// to the simulator's network).
pub trait PeerSink: Send + 'static {
    fn send(&self, to: u64, msg: PeerOut);
    /// The configuration's members and their peer addresses changed (this
    /// member's included): links to new members open, to removed ones close.
    fn set_members(&mut self, _members: &std::collections::BTreeMap<u64, String>) {}
}
