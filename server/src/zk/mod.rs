//! The ZooKeeper-compatible port (`--zk-addr`): existing ZooKeeper clients
//! (the Java client, Curator, kazoo, `zookeeper-client`) against Baton's
//! state machine, with no Baton code on their side.
//!
//! # How it works
//! A ZooKeeper connection is, to the driver, a client connection like any
//! other (`Input::ConnOpened`, a [`ConnTx`], `Input::Client`): this module
//! is a translator that runs in the connection's task. It decodes jute
//! frames ([`baton_proto::jute`]), sends the matching Baton requests, and
//! turns the driver's responses and watch events back into jute. One state
//! machine serves both ports: a node, session, ephemeral or watch made
//! through one is the same through the other.
//!
//! Rules (each is what a ZooKeeper client relies on):
//! - **Replies in request order.** ZooKeeper's clients match a reply to
//!   the oldest outstanding request and drop the connection on a mismatch;
//!   the driver answers local reads before earlier writes. Replies are held
//!   until every earlier request's reply is out. Pings (xid -2) and
//!   notifications (-1) are outside that order, as in ZooKeeper. An auth
//!   reply echoes its request's xid (the Java client's -4, which it takes
//!   outside the order; `zookeeper-client`'s own xid, which it matches) and
//!   goes out in order, which both accept.
//! - **One session's requests in order** (ZooKeeper's FIFO client order:
//!   a read sent right behind a write sees it). The driver serves a local
//!   read at once and a write only once it commits, so requests are
//!   classed (local reads, ReadIndex reads, writes) and only one class is
//!   in flight at a time: a request of another class waits, with every
//!   request after it, until those are answered. Requests of one class
//!   are answered in the order they came. What this port answers itself
//!   from the member's state (getAllChildrenNumber, getEphemerals,
//!   checkWatches, removeWatches) waits for every earlier request, so its
//!   reply never shows an older state than theirs (finding Z10).
//! - **A watch event after the reply that set its watch, and before the
//!   reply that reflects its change.** The driver queues an entry's events
//!   before its replies on the connection (watches.rs), in log order.
//!   Events are written as they come: with one class in flight, no reply
//!   that set a watch is ever held behind an earlier request, so an event
//!   cannot overtake it.
//! - **Sessions are Baton sessions.** A connect with session id 0 is
//!   `create_session` (timeout negotiated within `--min/max-session-ms`);
//!   with an id and password it is `attach` (the password is the session's
//!   secret), served once this member has applied a ReadIndex and the
//!   client's `lastZxidSeen`. An unknown session or a wrong password is
//!   answered as ZooKeeper does (timeout 0, session id 0), which the client
//!   reports as an expired session. A member that cannot reach a leader
//!   closes the connection without an answer, and the client tries the
//!   next server.
//! - **A member speaks only while it can vouch for the session**
//!   ([`vouch`], the rule and its margin): the connection sends its own
//!   keepalives (answered only once a quorum recorded them, sessions.rs)
//!   and writes a reply, notification or ping answer only within a window
//!   after the latest vouched one was sent, short enough that the client's
//!   own read timeout ends before the cluster could commit the session's
//!   expiry. Otherwise the packet waits, in order, for the next vouched
//!   keepalive, and a packet that waited `T/3` closes the connection (the
//!   client reconnects elsewhere). A member cut off from its peers so
//!   falls silent, then closes, well before another session can take
//!   over a lock its client held (finding Z1: it used to serve reads and
//!   keep the client `CONNECTED` until the cut healed). Pings are answered
//!   here under the same rule; the connect answer waits for a first
//!   vouched keepalive.
//! - **No reply carries CONNECTION_LOSS (-4).** ZooKeeper never sends it:
//!   a client makes it up when its connection drops, and every client
//!   treats it as "may have happened", then reconnects and re-registers
//!   its watches. So a request whose outcome is unknown here (a timeout, a
//!   leader change after the write was sent) or that no leader can serve
//!   closes the connection once the replies before it are out; that one
//!   and every later one get no reply (conn.rs `flush`). Replying -4
//!   instead left `zookeeper-client` with an unexpected error code on a
//!   lock node's delete, and a set-watches that failed so left its
//!   watches unregistered (zookeeper.rs t21).
//! - **A resume claims the session through the log** (ZooKeeper's owner
//!   change): once the attach is served, the connection proposes
//!   `claim_session` and is answered only when it applied; its index is
//!   the session's new *epoch* (state/mod.rs, step 2a). Every write of the
//!   connection carries that epoch and a sequence number from 1 (a session
//!   this connection created has epoch 0). A write still in flight from an
//!   older connection of the session (one on a member that was paused, or
//!   a second live connection) applies after the claim as `SESSION_MOVED`
//!   (-118): definitely not run. So two connections never share a sequence
//!   number, and a reply cached for one never answers the other (finding
//!   Z2: a resume numbered from the *applied* state's next free number, a
//!   paused member's connection had drawn the same one, and the new
//!   connection's `create /w2` was answered with `/w1`'s reply and never
//!   ran). As a second guard, a replay needs the same op (state/mod.rs step
//!   5). A claim that fails closes the connection: the client reconnects.
//!   ZooKeeper clients never retry a write, so the exactly-once window
//!   only ever holds this connection's outstanding writes.
//! - **Reads** are ZooKeeper's by default: served from this member's state
//!   (`sync` first makes the next read see everything committed before
//!   it). `--zk-linearizable-reads` sends every read through ReadIndex.
//! - **`auth` and ACLs** (acl.rs has the rules): an `auth` is served in
//!   the connection's task when its turn comes, after the requests before
//!   it are sent and before any after it; scheme `digest` adds
//!   `digest:NAME:HASH` (and `user:NAME` for a Baton password user's own
//!   password, PBKDF2 with the runtime told the thread blocks; an unknown
//!   name waits as long as a check takes: listener.rs `password_user`) to the
//!   connection's [`ConnTx`], where the driver takes every later request's
//!   identities, as for a native login. Another scheme or a malformed one
//!   is `AUTH_FAILED` and the connection closes. ACLs in are mapped and
//!   checked here (conn.rs `acl_in`): what Baton does not enforce (`ip`) is
//!   `INVALID_ACL` before anything reaches the state machine, as is `auth`
//!   from a connection with no identity; permissions are checked by the
//!   state machine and denials answered `NO_AUTH`.
//! - **Container and TTL nodes** are Baton's: the leader reaps them
//!   (state/mod.rs, "Reaping"); conn/nodes.rs `create_op` maps ZooKeeper's create
//!   modes and `ephemeral_owner` shows ZooKeeper's marks for them.
//! - **removeWatches / checkWatches** act on this connection's watches
//!   (conn.rs `Watch::is_of` maps ZooKeeper's watcher types); a removed
//!   watch is forgotten here at once, so no event for it follows the reply.
//! - **zxid** is Baton's log index (64 bits; the epoch half a ZooKeeper
//!   client might read is 0 until the log passes 2^32 entries). Stat
//!   fields map one to one; `czxid` is the fencing token.
//!
//! Bad input: a first frame that is not a connect request, a frame over
//! `--max-frame` or with a negative length, or a request that does not
//! decode closes the connection (ZooKeeper does the same); an opcode this
//! port does not serve is answered `UNIMPLEMENTED` (-6). Nothing reaches
//! the state machine from any of them. docs/zookeeper.md lists every
//! opcode and four-letter word with its status.

mod conn;
mod stats;
pub mod vouch;
mod words;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::accept;
use crate::config::Config;
use crate::message::InputTx;
use crate::shutdown::Signal;
use crate::view::SharedState;

/// How far past a resumed session's next free sequence number the
/// `zk-resume-without-claim` fault starts a connection (the old rule).
pub const SEQ_GAP: u64 = 1 << 20;

/// Settings of the ZooKeeper port.
#[derive(Debug, Clone)]
pub struct ZkSettings {
    /// Every read through ReadIndex (`--zk-linearizable-reads`).
    pub linearizable_reads: bool,
    /// The four-letter words this port answers (`--zk-4lw-whitelist`;
    /// `*` is all of them).
    pub words: Vec<String>,
}

impl Default for ZkSettings {
    fn default() -> Self {
        // ZooKeeper 3.5+'s default whitelist.
        ZkSettings { linearizable_reads: false, words: vec!["srvr".into()] }
    }
}

impl ZkSettings {
    pub fn allows(&self, word: &str) -> bool {
        self.words.iter().any(|w| w == "*" || w == word)
    }
}

/// Accepts ZooKeeper clients until shutdown. `open` holds the member's
/// `--max-connections` slots, shared with the native port.
/// `tls`: the client port's TLS (`--cert`/`--key`, docs/security.md):
/// when set, this port takes TLS connections only, as a ZooKeeper secure
/// client port does, and a client certificate's common name is the
/// connection's `x509:` identity.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listener: TcpListener,
    input: InputTx,
    cfg: Config,
    zk: ZkSettings,
    state: SharedState,
    tls: Option<tokio_rustls::TlsAcceptor>,
    open: Arc<Semaphore>,
    signal: Signal,
) {
    let cfg = Arc::new(cfg);
    let zk = Arc::new(zk);
    let stats = Arc::new(stats::Stats::default());
    let max = cfg.limits.max_connections;
    let full = move |_stream, peer| {
        warn!(%peer, "{max} connections are open on the ZooKeeper port: refusing one more");
        async {}
    };
    let stop = signal.clone();
    let serve = move |c: accept::Conn| {
        let (input, cfg, zk, state, signal) = (input.clone(), cfg.clone(), zk.clone(), state.clone(), signal.clone());
        let (stats, tls) = (stats.clone(), tls.clone());
        async move {
            let (conn, peer, _place) = (c.id, c.peer, c.place);
            let (stream, cert_name) = match accept::secure(c.stream, tls.as_ref(), conn, peer).await {
                accept::Secured::Ready(s, name) => (s, name),
                accept::Secured::NotTls(_) => {
                    debug!(%peer, "plaintext client on the ZooKeeper port, which requires TLS: closed");
                    return;
                }
                accept::Secured::Failed => return,
            };
            let at = conn::Accepted { conn, peer, cert_name };
            conn::handle(stream, at, input, &cfg, &zk, &stats, state, signal).await;
            debug!(%peer, "zookeeper client disconnected");
        }
    };
    accept::serve("zookeeper", listener, open, stop, full, serve).await;
}
