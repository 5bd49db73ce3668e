//! The replicated state machine: a pure function of the Raft log.
//!
//! `apply(index, command)` changes the node tree, the session table and the
//! fence table, and returns the reply for the proposer plus the list of
//! changes (for watches). It reads no clock, no randomness and nothing that
//! differs between members: time comes from `Command::time_ms`, session ids
//! are log indexes, secrets are chosen by the proposer and carried in the
//! entry. Run the same log on any member and you get the same bytes.
//!
//! Invariants:
//! - `zxid` of every change is the index of the entry that caused it; the
//!   `czxid` of a node is its fencing token.
//! - A write that fails changes nothing (a `multi` rolls back every op).
//! - Exactly-once: each session remembers the replies to writes whose
//!   sequence number the client has not yet acknowledged (`acked_below`), so
//!   a retried write returns its first reply instead of running again. A
//!   write below the session's floor (what the client acknowledged, or the
//!   oldest reply evicted from a full window) fails with STALE_SEQUENCE and
//!   never runs: at most once, however many writes are in flight.
//! - Sequential suffixes come from a per-parent counter that only grows.
//!   A sequential create skips numbers whose name is taken, so a plain
//!   create of any valid name, one ending in ten digits included, can
//!   never jam the counter: it is accepted, as ZooKeeper accepts it (real
//!   names end so: epoch seconds, order ids, a uuid's hex; finding Z11,
//!   kazoo's own tests failed on one). Who may put a plain node into a
//!   lock's folder is the folder's ACL's business, as in ZooKeeper.
//!
//! - A client write runs only with its session's secret: the entry carries
//!   the secret the proposing member took from the connection's attach or
//!   create, and a mismatch fails with SESSION_MOVED. No entry can act as a
//!   session whose secret its proposer did not have.
//!
//! # Applying a client write, in order (`apply_write`)
//! 1. Unknown session: `SESSION_EXPIRED`.
//! 2. The entry's secret is not the session's: `SESSION_MOVED`.
//!
//!    Then (2a) `claim_session` (the ZooKeeper port's resume, ZooKeeper's
//!    owner change): the entry's index becomes the session's epoch, the
//!    exactly-once window is emptied (no cached reply, floor 0), and the
//!    reply is OK at that index; nothing is cached. The claiming
//!    connection sends its writes under that epoch, numbered from 1.
//!    And (2b) a write whose epoch is below the session's:
//!    `SESSION_MOVED` (a connection the session has moved away from: it
//!    definitely did not run); above it: `BAD_REQUEST` (no claim made it).
//! 3. If `acked_below` is higher than the session's stored value, store it
//!    and drop every cached reply with a lower `seq`.
//! 4. `seq == 0`: `BAD_REQUEST`.
//! 5. A cached reply for this `seq`: return it unchanged (same `zxid`, same
//!    result, no change, no event); the driver rewrites only its `id`. The
//!    reply is cached with a digest of its write's op ([`op_digest`]); a
//!    write whose op has another digest gets `STALE_SEQUENCE` and does not
//!    run: a reused sequence number is a definite error, never another
//!    write's reply (finding Z2: two connections of one session numbered
//!    their writes alike, and the second's create was answered with the
//!    first's path and never ran). Replies cached before digests (0) match
//!    any op.
//! 6. `seq < acked_below`: `STALE_SEQUENCE` (the client said it had the
//!    answer, or the answer left the window; this attempt does not run).
//! 7. `close_session`: end the session; its reply is not cached (a retry
//!    gets `SESSION_EXPIRED`).
//! 8. Otherwise run the write and cache its reply, success or failure,
//!    under `seq`: at most [`MAX_CACHED_REPLIES`] replies and
//!    [`MAX_CACHED_REPLY_BYTES`] per session; past either the lowest `seq`
//!    is dropped and the floor rises past it.
//!
//! Only steps 5 and 8 cache or replay; nothing refused before the log
//! (driver/requests.rs) is cached. The cached replies and `acked_below` are
//! part of the session's record: persisted, in snapshots, identical on
//! every member. So a sequential or ephemeral create whose reply was lost
//! returns, when retried, the path it created the first time, and makes no
//! second node.
//!
//! What it does not do: validate framing or keep time for session expiry
//! (the leader does, and writes an `ExpireSessions` entry).
//!
//! # Container and TTL nodes ("Reaping")
//! Both are persistent nodes that the cluster deletes on its own, as
//! ZooKeeper's container manager does:
//! - A **container** (`CreateOp::container`; not ephemeral, not sequential,
//!   no TTL) is due once it has had a child and has none
//!   (`cversion > 0 && num_children == 0`). One that never had a child
//!   stays.
//! - A **TTL node** (`CreateOp::ttl_ms`, 1 ms to [`MAX_TTL_MS`]; not
//!   ephemeral, may be sequential) is due once it has no children and
//!   `time - mtime > ttl_ms` (a `set` starts its time again).
//! - The leader looks for due nodes every [`REAP_INTERVAL_MS`] (driver)
//!   and proposes a `ReapNodes` entry for those it found due at two looks
//!   in a row with the same `pzxid` (so a container is left alone for a
//!   while after its last child goes: a client about to add one wins).
//!   Apply deletes a listed node only if it is still the node created at
//!   the listed `czxid`, its `pzxid` is the listed one, and it is due at
//!   the entry's `time_ms`; otherwise it skips it. Deletes fire the watches
//!   any delete fires. Nothing else deletes them: a stale or repeated
//!   entry changes nothing.
//!
//! Persistence: every touched key is remembered as dirty and `flush` stages
//! them, with the applied index, into the same batch (the state on disk
//! and its applied index are always written together). The driver
//! calls `flush` only every so often (driver/ready.rs, "the state is written
//! in coalesced batches"): a key written many times in between is written
//! once, and the state on disk is the state at an older applied index.
//!
//! # Layout
//! This file: the state, its queries, `apply` and the exactly-once rules
//! above (`apply_write`). `txn.rs`: one write's ops with their undo log
//! (transactions). `reap.rs`: which nodes are due for reaping.
//! `persist.rs`: loading, staging what changed, snapshots and backups.
//! `codec.rs`: the store's keys and records. `tests.rs`: unit tests; the
//! golden scripts are server/tests/golden.rs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use baton_proto::{
    command, op, parent_of, response, validate_path, Acl, AclResp, AddUserOp, CachedReply, CheckFenceOp, CheckOp,
    ClientWrite, ClusterRecord, Command, CreateOp, CreateResp, CreateSessionResp, DeleteOp, Empty, ErrorCode,
    FenceRecord, MemberRecord, MultiResp, NodeEntry, NodeRecord, OpResult, Response, SessionRecord, SetOp, SetResp,
    Stat, UserRecord, MAX_DATA,
};
use bytes::Bytes;
use prost::Message as _;

use crate::acl::{self, Caller};
use crate::kv::{prefix_end, Batch, Kv, KvError, KvView};

mod codec;
mod persist;
mod reap;
mod shards;
mod txn;

use codec::*;
use shards::Sharded;
use txn::Txn;
pub use txn::{FENCE_GUARDS, MAX_FENCES};

/// Replies kept per session for exactly-once (writes not yet acknowledged).
/// When a session has more unacknowledged writes than this, the oldest reply
/// is dropped and the session's floor (`acked_below`) rises past it: a late
/// retry of it fails with STALE_SEQUENCE instead of running twice. The
/// client library never has more than 1,024 writes in flight.
pub const MAX_CACHED_REPLIES: usize = 4096;
/// Bytes of cached replies per session, at most (evicted like
/// [`MAX_CACHED_REPLIES`]). A constant, not a flag: apply must be the same
/// on every member.
pub const MAX_CACHED_REPLY_BYTES: usize = 32 << 20;

/// The longest TTL a node may have: ZooKeeper's (2^40 - 1 ms, the bits
/// its ephemeral-owner field has for it).
pub const MAX_TTL_MS: u64 = (1 << 40) - 1;
/// How often the leader looks for due container and TTL nodes ("Reaping").
pub const REAP_INTERVAL_MS: u64 = 1000;
/// At most this many nodes in one `ReapNodes` entry.
pub const MAX_REAP_PER_ENTRY: usize = 1000;

const KEY_APPLIED: &[u8] = b"a";
const PREFIX_NODE: u8 = b'n';
const PREFIX_SESSION: u8 = b's';
const PREFIX_FENCE: u8 = b'f';
/// One keyspace with raft_store.rs (h, c, t, p, e) and cluster.rs (o, m):
/// `keys_are_distinct` checks.
const KEY_CLUSTER: &[u8] = b"i";
const PREFIX_USER: u8 = b'u';

/// What a committed entry changed, for watches. `zxid` is the entry index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created(String),
    Deleted(String),
    DataChanged(String),
    ChildrenChanged(String),
}

/// What this member knows of a session id (`StateMachine::session_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Applied here and not yet expired or closed.
    Live,
    /// Applied here and since expired or closed: gone for good.
    Gone,
    /// Above this member's applied index: made by an entry not applied here yet.
    NotYetApplied,
}

/// The outcome of applying one entry.
#[derive(Debug, Default)]
pub struct Applied {
    /// Reply for the proposer to send (None for internal entries).
    pub reply: Option<Response>,
    /// Changes in the order they happened.
    pub changes: Vec<Change>,
    /// Sessions that ended (closed or expired) in this entry.
    pub ended_sessions: Vec<u64>,
}

#[derive(Debug, Clone)]
struct Node {
    data: Bytes,
    stat: Stat,
    next_seq: u64,
    /// Empty: open to everyone (acl.rs).
    acl: Vec<Acl>,
}

#[derive(Debug, Clone)]
struct Session {
    timeout_ms: u32,
    secret: Bytes,
    acked_below: u64,
    /// The index of the session's last `claim_session` (0: never claimed).
    epoch: u64,
    /// seq -> (digest of the write's op, encoded Response).
    replies: BTreeMap<u64, (u64, Bytes)>,
    /// Bytes in `replies`. Derived, not persisted.
    reply_bytes: usize,
    /// Paths of this session's ephemeral nodes. Derived, not persisted.
    ephemerals: BTreeSet<String>,
}

/// A failed operation: code plus a human-readable message.
pub type OpError = (ErrorCode, String);

fn err<T>(code: ErrorCode, msg: impl Into<String>) -> Result<T, OpError> {
    Err((code, msg.into()))
}

enum Undo {
    Node(String, Option<Box<Node>>),
    Fence(String, Option<u64>),
    Ephemeral { session: u64, path: String, added: bool },
    Child { parent: String, name: String, added: bool },
    User(String, Option<(Bytes, Bytes)>),
}

/// The node tree, sessions and fences at `applied`.
#[derive(Clone)]
pub struct StateMachine {
    /// Boxed: a map entry is a path and a pointer, so the table a million
    /// nodes need is small to grow and rehash (a load spent 40% of its
    /// time zeroing pages for a table of 176-byte entries); sharded, so
    /// no insert rehashes the whole of it (shards.rs).
    nodes: Sharded<Box<Node>>,
    /// parent path -> child names, sorted. Derived from `nodes`, not
    /// persisted; kept apart so that saving a node for undo stays O(1).
    kids: HashMap<String, BTreeSet<String>>,
    /// Paths of container and TTL nodes ("Reaping"). Derived, not
    /// persisted; may hold paths that are gone (a rolled-back create).
    reapable: BTreeSet<String>,
    sessions: BTreeMap<u64, Session>,
    fences: HashMap<String, u64>,
    /// The cluster's id and who joined it (cluster.rs).
    cluster: ClusterRecord,
    /// Password users: name -> (salt, hash) (acl.rs).
    users: BTreeMap<String, (Bytes, Bytes)>,
    dirty_users: HashSet<String>,
    applied: u64,
    dirty_cluster: bool,
    dirty_nodes: HashSet<String>,
    /// Dirty nodes that did not exist at the last `flush` (so not on disk):
    /// one deleted again before the next needs no tombstone.
    born: HashSet<String>,
    dirty_sessions: HashSet<u64>,
    dirty_fences: HashSet<String>,
    /// Set when the whole state was replaced (snapshot install).
    dirty_all: bool,
    /// Deliberate bugs for harness tests; identical on every member.
    faults: crate::faults::Faults,
}

impl Default for StateMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl StateMachine {
    /// An empty tree: just `/`.
    pub fn new() -> Self {
        let mut sm = StateMachine {
            nodes: Sharded::default(),
            kids: HashMap::new(),
            reapable: BTreeSet::new(),
            sessions: BTreeMap::new(),
            fences: HashMap::new(),
            cluster: ClusterRecord::default(),
            users: BTreeMap::new(),
            dirty_users: HashSet::new(),
            applied: 0,
            dirty_cluster: false,
            dirty_nodes: HashSet::new(),
            born: HashSet::new(),
            dirty_sessions: HashSet::new(),
            dirty_fences: HashSet::new(),
            dirty_all: false,
            faults: Default::default(),
        };
        sm.nodes.insert("/".into(), Box::new(root_node()));
        sm
    }

    /// Switches on deliberate bugs (harness tests only).
    pub fn set_faults(&mut self, faults: crate::faults::Faults) {
        self.faults = faults;
    }

    pub fn applied(&self) -> u64 {
        self.applied
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Ephemeral nodes of every session (walks the sessions).
    pub fn ephemeral_count(&self) -> usize {
        self.sessions.values().map(|s| s.ephemerals.len()).sum()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Session ids with their timeouts, in id order.
    pub fn sessions(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.sessions.iter().map(|(id, s)| (*id, s.timeout_ms))
    }

    pub fn session_timeout(&self, id: u64) -> Option<u32> {
        self.sessions.get(&id).map(|s| s.timeout_ms)
    }

    pub fn session_exists(&self, id: u64) -> bool {
        self.sessions.contains_key(&id)
    }

    /// Whether session `id` is live here, gone, or not yet applied: a
    /// session id is the index of the entry that made it, so an id above
    /// this member's applied index names a session another member may
    /// already serve (a follower can apply an entry before the leader,
    /// whose own fsync came later). Such a session is not expired; the
    /// caller answers `BUSY` (see the `sessions` module doc).
    pub fn session_state(&self, id: u64) -> SessionState {
        if self.sessions.contains_key(&id) {
            SessionState::Live
        } else if id > self.applied {
            SessionState::NotYetApplied
        } else {
            SessionState::Gone
        }
    }

    /// Checks a session's secret (constant-time enough for our purpose: the
    /// secret is random and compared whole).
    /// The lowest write sequence number session `id` can use that meets
    /// neither a cached reply nor the floor, and its epoch (only the
    /// `zk-resume-without-claim` fault numbers writes from here).
    pub fn session_next_seq(&self, id: u64) -> Option<(u64, u64)> {
        let s = self.sessions.get(&id)?;
        let cached = s.replies.last_key_value().map_or(0, |(seq, _)| seq + 1);
        Some((s.acked_below.max(cached).max(1), s.epoch))
    }

    /// Session `id`'s ephemeral nodes (ZooKeeper's `getEphemerals`).
    pub fn session_ephemerals(&self, id: u64) -> Vec<String> {
        self.sessions.get(&id).map(|s| s.ephemerals.iter().cloned().collect()).unwrap_or_default()
    }

    pub fn check_session(&self, id: u64, secret: &[u8]) -> Result<u32, OpError> {
        match self.sessions.get(&id) {
            None => err(ErrorCode::SessionExpired, format!("session {id:#x} does not exist (expired or closed)")),
            Some(s) if s.secret.as_ref() != secret => {
                err(ErrorCode::SessionMoved, format!("wrong secret for session {id:#x}"))
            }
            Some(s) => Ok(s.timeout_ms),
        }
    }

    // ------------------------------------------------------------ reads

    pub fn get(&self, path: &str) -> Result<(Bytes, Stat), OpError> {
        let n = self.lookup(path)?;
        Ok((n.data.clone(), full_stat(n)))
    }

    pub fn exists(&self, path: &str) -> Result<Option<Stat>, OpError> {
        check_path(path)?;
        Ok(self.nodes.get(path).map(Box::as_ref).map(full_stat))
    }

    /// The names of `path`'s children, borrowed (none if it has none).
    pub fn child_names<'a>(&'a self, path: &str) -> impl Iterator<Item = &'a str> + 'a {
        self.kids.get(path).into_iter().flat_map(|k| k.iter().map(String::as_str))
    }

    pub fn children(&self, path: &str) -> Result<(Vec<String>, Stat), OpError> {
        let n = self.lookup(path)?;
        let kids = self.kids.get(path).map(|k| k.iter().cloned().collect()).unwrap_or_default();
        Ok((kids, full_stat(n)))
    }

    /// Every node strictly below `path` with its stat, parents before
    /// children (for recursive watches' gap reports).
    pub fn descendants(&self, path: &str) -> Vec<(String, Stat)> {
        let mut out = Vec::new();
        let mut stack = vec![path.to_string()];
        while let Some(dir) = stack.pop() {
            let Some(kids) = self.kids.get(&dir) else { continue };
            for k in kids.iter().rev() {
                let child = if dir == "/" { format!("/{k}") } else { format!("{dir}/{k}") };
                if let Some(n) = self.nodes.get(&child) {
                    out.push((child.clone(), full_stat(n)));
                    stack.push(child);
                }
            }
        }
        out
    }

    /// The stat of a node, if it exists (no path check; for watches).
    pub fn stat_of(&self, path: &str) -> Option<Stat> {
        self.nodes.get(path).map(Box::as_ref).map(full_stat)
    }

    pub fn fence(&self, resource: &str) -> Option<u64> {
        self.fences.get(resource).copied()
    }

    fn lookup(&self, path: &str) -> Result<&Node, OpError> {
        check_path(path)?;
        match self.nodes.get(path) {
            Some(n) => Ok(n),
            None => err(ErrorCode::NoNode, format!("{path} does not exist")),
        }
    }

    /// A node's ACL and stat, if `caller` may read it or administer it;
    /// without ADMIN, `digest` hashes redacted (acl.rs).
    pub fn get_acl(&self, path: &str, caller: &Caller) -> Result<AclResp, OpError> {
        let n = self.lookup(path)?;
        if caller.check(&n.acl, acl::ADMIN, "get-acl", path).is_ok() {
            return Ok(AclResp { acl: n.acl.clone(), stat: Some(full_stat(n)) });
        }
        caller.check(&n.acl, acl::READ, "get-acl", path)?;
        Ok(AclResp { acl: acl::redact(&n.acl), stat: Some(full_stat(n)) })
    }

    /// Checks that `caller` may read `path` (no node: Ok, the read itself
    /// answers NO_NODE).
    pub fn check_read(&self, path: &str, caller: &Caller, what: &str) -> Result<(), OpError> {
        match self.nodes.get(path) {
            Some(n) => caller.check(&n.acl, acl::READ, what, path),
            None => Ok(()),
        }
    }

    /// True when `user` exists and `password` is theirs.
    pub fn verify_user(&self, user: &str, password: &str) -> bool {
        self.users.get(user).is_some_and(|(salt, hash)| baton_proto::auth::verify_password(password, salt, hash))
    }

    /// `user`'s salt and password hash, to verify a password with
    /// [`baton_proto::auth::verify_password`] after the state's lock is
    /// released (PBKDF2 is slow on purpose).
    pub fn user_hash(&self, user: &str) -> Option<(Bytes, Bytes)> {
        self.users.get(user).cloned()
    }

    /// True when the cluster has a password user.
    pub fn has_users(&self) -> bool {
        !self.users.is_empty()
    }

    /// Password users, by name.
    pub fn user_names(&self) -> Vec<String> {
        self.users.keys().cloned().collect()
    }

    /// The cluster's id (empty until set) and the members that joined it.
    pub fn cluster(&self) -> &ClusterRecord {
        &self.cluster
    }

    /// Applies a cluster record at `index`: the first id sticks; later
    /// records of the same id add to `joined`; others change nothing.
    pub fn set_cluster(&mut self, index: u64, rec: &ClusterRecord) {
        self.applied = self.applied.max(index);
        if rec.cluster_id.is_empty() {
            return;
        }
        if self.cluster.cluster_id.is_empty() {
            self.cluster.cluster_id = rec.cluster_id.clone();
            self.cluster.index = index;
            self.cluster.joined.clear();
        } else if self.cluster.cluster_id != rec.cluster_id {
            return;
        }
        // A seed of the cluster-wide settings applies only while none are
        // recorded (settings.rs): an admin's change is never undone by one.
        if self.cluster.settings.is_none() {
            if let Some(s) = &rec.settings {
                self.cluster.settings = Some(s.clone());
            }
        }
        let mut joined: BTreeSet<u64> = self.cluster.joined.iter().copied().collect();
        joined.extend(rec.joined.iter().copied());
        self.cluster.joined = joined.into_iter().collect();
        self.dirty_cluster = true;
    }

    /// Replaces the cluster record (a restored backup: backup.rs).
    pub fn replace_cluster(&mut self, rec: ClusterRecord) {
        self.cluster = rec;
        self.dirty_cluster = true;
    }

    /// The addresses of member `id`, if recorded.
    pub fn member(&self, id: u64) -> Option<&MemberRecord> {
        self.cluster.members.iter().find(|m| m.id == id)
    }

    /// Records a member's addresses (membership.rs); empty addresses keep
    /// the recorded ones.
    pub fn set_member(&mut self, index: u64, rec: &MemberRecord) {
        self.applied = self.applied.max(index);
        let ms = &mut self.cluster.members;
        match ms.iter_mut().find(|m| m.id == rec.id) {
            Some(m) => {
                if !rec.peer_addr.is_empty() {
                    m.peer_addr = rec.peer_addr.clone();
                }
                if !rec.client_addr.is_empty() {
                    m.client_addr = rec.client_addr.clone();
                }
            }
            None => {
                ms.push(rec.clone());
                ms.sort_by_key(|m| m.id);
            }
        }
        self.dirty_cluster = true;
    }

    /// Forgets a removed member: its addresses and that it joined.
    pub fn remove_member(&mut self, index: u64, id: u64) {
        self.applied = self.applied.max(index);
        self.cluster.members.retain(|m| m.id != id);
        self.cluster.joined.retain(|j| *j != id);
        if !self.cluster.removed.contains(&id) {
            self.cluster.removed.push(id);
        }
        self.dirty_cluster = true;
    }

    /// A learner the leader may now promote was promoted: no longer to be.
    pub fn set_auto_promote(&mut self, id: u64, on: bool) {
        if let Some(m) = self.cluster.members.iter_mut().find(|m| m.id == id) {
            m.auto_promote = on;
            self.dirty_cluster = true;
        }
    }

    // ------------------------------------------------------------ apply

    /// Records that `index` was applied without changing state (empty
    /// entries from a new leader, configuration changes).
    pub fn skip(&mut self, index: u64) {
        self.applied = self.applied.max(index);
    }

    /// Applies one committed command at log `index`.
    pub fn apply(&mut self, index: u64, cmd: &Command) -> Applied {
        self.applied = self.applied.max(index);
        let mut out = Applied::default();
        let reply = match &cmd.body {
            Some(command::Body::NewSession(ns)) => {
                self.sessions.insert(
                    index,
                    Session {
                        timeout_ms: ns.timeout_ms,
                        secret: ns.secret.clone(),
                        acked_below: 0,
                        epoch: 0,
                        replies: BTreeMap::new(),
                        reply_bytes: 0,
                        ephemerals: BTreeSet::new(),
                    },
                );
                self.dirty_sessions.insert(index);
                Some(Response {
                    zxid: index,
                    body: Some(response::Body::CreateSession(CreateSessionResp {
                        session_id: index,
                        secret: ns.secret.clone(),
                        timeout_ms: ns.timeout_ms,
                    })),
                    ..Default::default()
                })
            }
            Some(command::Body::Expire(ex)) => {
                for id in &ex.session_ids {
                    if self.end_session(*id, index, &mut out.changes) {
                        out.ended_sessions.push(*id);
                    }
                }
                None
            }
            Some(command::Body::Write(w)) => Some(self.apply_write(index, cmd.time_ms, w, &mut out)),
            Some(command::Body::Cluster(c)) => {
                self.set_cluster(index, c);
                None
            }
            Some(command::Body::Member(m)) => {
                self.set_member(index, m);
                None
            }
            Some(command::Body::Reap(r)) => {
                for n in &r.nodes {
                    if self.due(&n.path, cmd.time_ms).is_some_and(|(c, p)| c == n.czxid && p == n.pzxid) {
                        self.remove_node(&n.path, index, &mut out.changes);
                    }
                }
                None
            }
            None => Some(error_response(index, ErrorCode::BadRequest, "empty command")),
        };
        out.reply = reply;
        out
    }

    fn apply_write(&mut self, index: u64, time: i64, w: &ClientWrite, out: &mut Applied) -> Response {
        let sid = w.session_id;
        let Some(session) = self.sessions.get_mut(&sid) else {
            return error_response(
                index,
                ErrorCode::SessionExpired,
                format!("session {sid:#x} does not exist (expired or closed)"),
            );
        };
        if session.secret != w.secret {
            return error_response(index, ErrorCode::SessionMoved, format!("wrong secret for session {sid:#x}"));
        }
        if matches!(w.op, Some(baton_proto::client_write::Op::ClaimSession(_))) {
            session.epoch = index;
            session.acked_below = 0;
            session.replies.clear();
            session.reply_bytes = 0;
            self.dirty_sessions.insert(sid);
            return Response { zxid: index, body: Some(response::Body::Empty(Empty {})), ..Default::default() };
        }
        if w.epoch != session.epoch {
            let (code, msg) = if w.epoch < session.epoch {
                (
                    ErrorCode::SessionMoved,
                    format!("session {sid:#x} moved to another connection (epoch {})", session.epoch),
                )
            } else {
                (ErrorCode::BadRequest, format!("epoch {} was never claimed for session {sid:#x}", w.epoch))
            };
            return error_response(index, code, msg);
        }
        // Exactly-once bookkeeping.
        if w.acked_below > session.acked_below {
            session.acked_below = w.acked_below;
            let keep = session.replies.split_off(&w.acked_below);
            session.reply_bytes -= session.replies.values().map(|(_, r)| r.len()).sum::<usize>();
            session.replies = keep;
            self.dirty_sessions.insert(sid);
        }
        if w.seq == 0 {
            return error_response(index, ErrorCode::BadRequest, "write without a sequence number");
        }
        let digest = op_digest(w);
        if let Some((cached_digest, cached)) = session.replies.get(&w.seq) {
            if *cached_digest != 0 && *cached_digest != digest && !self.faults.reply_without_digest() {
                return error_response(
                    index,
                    ErrorCode::StaleSequence,
                    format!("write {} of session {sid:#x} is numbered like an earlier, different write", w.seq),
                );
            }
            if let Ok(resp) = Response::decode(cached.clone()) {
                return resp;
            }
        }
        if w.seq < session.acked_below {
            return error_response(
                index,
                ErrorCode::StaleSequence,
                format!(
                    "write {} is below this session's floor {} (acknowledged, or its reply left the window)",
                    w.seq, session.acked_below
                ),
            );
        }
        if matches!(w.op, Some(baton_proto::client_write::Op::CloseSession(_))) {
            self.end_session(sid, index, &mut out.changes);
            out.ended_sessions.push(sid);
            return Response { zxid: index, body: Some(response::Body::Empty(Empty {})), ..Default::default() };
        }
        let caller = Caller { identities: w.identities.clone(), superuser: w.superuser };
        let mut txn = Txn { sm: self, undo: Vec::new(), changes: Vec::new(), index, time, session: sid, caller };
        let result = txn.run(w);
        let (resp, changes) = match result {
            Ok(body) => {
                let changes = std::mem::take(&mut txn.changes);
                (Response { zxid: index, body: Some(body), ..Default::default() }, changes)
            }
            Err(e) => {
                let (code, msg, body) = *e;
                txn.rollback();
                let mut r = error_response(index, code, msg);
                r.body = body;
                (r, Vec::new())
            }
        };
        out.changes.extend(changes);
        if let Some(session) = self.sessions.get_mut(&sid) {
            let encoded: Bytes = resp.encode_to_vec().into();
            session.reply_bytes += encoded.len();
            if let Some((_, old)) = session.replies.insert(w.seq, (digest, encoded)) {
                session.reply_bytes -= old.len();
            }
            while session.replies.len() > MAX_CACHED_REPLIES || session.reply_bytes > MAX_CACHED_REPLY_BYTES {
                // The window is full: forget the oldest reply, and raise the
                // floor past it, so that a late retry of it (or of anything
                // older) gets a definite STALE_SEQUENCE instead of running
                // a second time (finding S5).
                match session.replies.pop_first() {
                    Some((evicted, (_, bytes))) => {
                        session.reply_bytes -= bytes.len();
                        session.acked_below = session.acked_below.max(evicted + 1);
                    }
                    None => break,
                }
            }
            self.dirty_sessions.insert(sid);
        }
        resp
    }

    /// Deletes a session and its ephemeral nodes. Returns false if unknown.
    fn end_session(&mut self, sid: u64, index: u64, changes: &mut Vec<Change>) -> bool {
        let Some(session) = self.sessions.remove(&sid) else {
            return false;
        };
        self.dirty_sessions.insert(sid);
        // Deepest first cannot matter (ephemerals have no children), but a
        // fixed order keeps every member's event order identical.
        for path in session.ephemerals.iter() {
            if self.nodes.contains_key(path) {
                self.remove_node(path, index, changes);
            }
        }
        true
    }

    /// Remembers that `path` changes, before it does (see `born`).
    fn mark_node(&mut self, path: &str) {
        if !self.dirty_nodes.contains(path) {
            if !self.nodes.contains_key(path) {
                self.born.insert(path.to_string());
            }
            self.dirty_nodes.insert(path.to_string());
        }
    }

    fn remove_node(&mut self, path: &str, index: u64, changes: &mut Vec<Change>) {
        self.mark_node(path);
        if let Some(n) = self.nodes.remove(path) {
            if n.stat.container || n.stat.ttl_ms > 0 {
                self.reapable.remove(path);
            }
        }
        self.kids.remove(path);
        if let Some(parent) = parent_of(path) {
            if let Some(set) = self.kids.get_mut(parent) {
                set.remove(base_name(path));
            }
            self.mark_node(parent);
            if let Some(p) = self.nodes.get_mut(parent) {
                p.stat.num_children = p.stat.num_children.saturating_sub(1);
                p.stat.cversion += 1;
                p.stat.pzxid = index;
                changes.push(Change::Deleted(path.to_string()));
                changes.push(Change::ChildrenChanged(parent.to_string()));
            }
        }
    }
}

fn check_path(path: &str) -> Result<(), OpError> {
    validate_path(path).map_err(|m| (ErrorCode::InvalidPath, m))
}

/// A create's kind: a container is persistent and not sequential; a TTL
/// node is persistent, its TTL within [`MAX_TTL_MS`] ("Reaping").
fn check_kind(c: &CreateOp) -> Result<(), OpError> {
    if c.container && (c.ephemeral || c.sequential || c.ttl_ms > 0) {
        return err(ErrorCode::BadRequest, "a container node is persistent, not sequential, and has no TTL");
    }
    if c.ttl_ms > 0 && c.ephemeral {
        return err(ErrorCode::BadRequest, "an ephemeral node cannot have a TTL");
    }
    if c.ttl_ms > MAX_TTL_MS {
        return err(ErrorCode::BadRequest, format!("TTL {} ms is over {MAX_TTL_MS}", c.ttl_ms));
    }
    Ok(())
}

fn check_version(path: &str, n: &Node, expected: Option<i32>) -> Result<(), OpError> {
    match expected {
        Some(v) if v != n.stat.version => {
            err(ErrorCode::BadVersion, format!("{path} is at version {}, not {v}", n.stat.version))
        }
        _ => Ok(()),
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn root_node() -> Node {
    Node { data: Bytes::new(), stat: Stat::default(), next_seq: 0, acl: Vec::new() }
}

fn full_stat(n: &Node) -> Stat {
    let mut s = n.stat;
    s.data_length = n.data.len() as u32;
    s
}

/// A digest of a write's op (FNV-1a over its encoding; never 0, which
/// marks a reply cached before digests): the same on every member, so a
/// replay is answered alike everywhere.
fn op_digest(w: &ClientWrite) -> u64 {
    let bytes = w.op.as_ref().map(|op| {
        let mut buf = Vec::with_capacity(op.encoded_len());
        op.encode(&mut buf);
        buf
    });
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes.iter().flatten() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

/// An error reply at `zxid`.
pub fn error_response(zxid: u64, code: ErrorCode, msg: impl Into<String>) -> Response {
    Response { error: code as i32, message: msg.into(), zxid, ..Default::default() }
}

#[cfg(test)]
mod tests;
