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
use crate::kv::{prefix_end, Batch, Kv, KvError};

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
    Node(String, Option<Node>),
    Fence(String, Option<u64>),
    Ephemeral { session: u64, path: String, added: bool },
    Child { parent: String, name: String, added: bool },
    User(String, Option<(Bytes, Bytes)>),
}

/// The node tree, sessions and fences at `applied`.
#[derive(Clone)]
pub struct StateMachine {
    nodes: HashMap<String, Node>,
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
            nodes: HashMap::new(),
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
        sm.nodes.insert("/".into(), root_node());
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
        Ok(self.nodes.get(path).map(full_stat))
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
        self.nodes.get(path).map(full_stat)
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

    /// `(czxid, pzxid)` of the container or TTL node at `path` if it is
    /// due for reaping at `time_ms` (module doc, "Reaping").
    fn due(&self, path: &str, time_ms: i64) -> Option<(u64, u64)> {
        let n = self.nodes.get(path)?;
        let s = &n.stat;
        if s.num_children != 0 || s.ephemeral_owner != 0 {
            return None;
        }
        let due = (s.container && s.cversion > 0)
            || (s.ttl_ms > 0 && time_ms.saturating_sub(s.mtime) > s.ttl_ms.min(MAX_TTL_MS) as i64);
        due.then_some((s.czxid, s.pzxid))
    }

    /// Container and TTL nodes due for reaping at `time_ms`, at most
    /// [`MAX_REAP_PER_ENTRY`] (the leader's look; apply checks again).
    pub fn due_for_reaping(&self, time_ms: i64) -> Vec<baton_proto::ReapNode> {
        self.reapable
            .iter()
            .filter_map(|p| {
                self.due(p, time_ms).map(|(czxid, pzxid)| baton_proto::ReapNode { path: p.clone(), czxid, pzxid })
            })
            .take(MAX_REAP_PER_ENTRY)
            .collect()
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

    // ------------------------------------------------------------ persistence

    /// Loads state from `kv` (empty tree if nothing is stored).
    pub fn load(kv: &dyn Kv) -> Result<Self, KvError> {
        let mut sm = StateMachine::new();
        if let Some(b) = kv.get(KEY_APPLIED)? {
            sm.applied =
                u64::from_be_bytes(b.as_slice().try_into().map_err(|_| KvError("corrupt applied index".into()))?);
        }
        for (k, v) in kv.scan_prefix(&[PREFIX_NODE])? {
            let path = String::from_utf8(k[1..].to_vec()).map_err(|_| KvError("corrupt node key".into()))?;
            let rec = NodeRecord::decode(v.as_slice()).map_err(|e| KvError(format!("corrupt node {path}: {e}")))?;
            sm.nodes.insert(path, node_from_record(rec));
        }
        for (_, v) in kv.scan_prefix(&[PREFIX_SESSION])? {
            let rec = SessionRecord::decode(v.as_slice()).map_err(|e| KvError(format!("corrupt session: {e}")))?;
            sm.sessions.insert(rec.id, session_from_record(rec));
        }
        for (_, v) in kv.scan_prefix(&[PREFIX_FENCE])? {
            let rec = FenceRecord::decode(v.as_slice()).map_err(|e| KvError(format!("corrupt fence: {e}")))?;
            sm.fences.insert(rec.resource, rec.token);
        }
        for (_, v) in kv.scan_prefix(&[PREFIX_USER])? {
            let u = UserRecord::decode(v.as_slice()).map_err(|e| KvError(format!("corrupt user: {e}")))?;
            sm.users.insert(u.name, (u.salt, u.hash));
        }
        if let Some(b) = kv.get(KEY_CLUSTER)? {
            sm.cluster = ClusterRecord::decode(b.as_slice()).map_err(|e| KvError(format!("corrupt cluster: {e}")))?;
        }
        sm.rebuild_derived();
        Ok(sm)
    }

    fn rebuild_derived(&mut self) {
        self.nodes.entry("/".into()).or_insert_with(root_node);
        self.kids.clear();
        self.reapable.clear();
        for (path, n) in self.nodes.iter_mut() {
            n.stat.num_children = 0;
            if n.stat.container || n.stat.ttl_ms > 0 {
                self.reapable.insert(path.clone());
            }
        }
        let paths: Vec<(String, u64)> = self.nodes.iter().map(|(p, n)| (p.clone(), n.stat.ephemeral_owner)).collect();
        for (path, owner) in paths {
            if let Some(parent) = parent_of(&path) {
                if let Some(p) = self.nodes.get_mut(parent) {
                    p.stat.num_children += 1;
                    self.kids.entry(parent.to_string()).or_default().insert(base_name(&path).to_string());
                }
            }
            if owner != 0 {
                if let Some(s) = self.sessions.get_mut(&owner) {
                    s.ephemerals.insert(path);
                }
            }
        }
    }

    /// Keys changed since the last [`flush`](Self::flush).
    pub fn dirty_keys(&self) -> usize {
        self.dirty_nodes.len() + self.dirty_sessions.len() + self.dirty_fences.len() + self.dirty_users.len()
    }

    /// A change that must be on disk with this Ready: the whole state was
    /// replaced (a snapshot) or the cluster record changed (it goes with
    /// the configuration raft-rs stores).
    pub fn must_flush(&self) -> bool {
        self.dirty_all || self.dirty_cluster
    }

    /// Stages every change since the last flush, and the applied index.
    pub fn flush(&mut self, batch: &mut Batch) {
        if self.dirty_all {
            for prefix in [PREFIX_NODE, PREFIX_SESSION, PREFIX_FENCE, PREFIX_USER] {
                batch.delete_range(vec![prefix], prefix_end(&[prefix]));
            }
            self.dirty_nodes = self.nodes.keys().cloned().collect();
            self.dirty_sessions = self.sessions.keys().copied().collect();
            self.dirty_fences = self.fences.keys().cloned().collect();
            self.dirty_cluster = true;
            self.dirty_users = self.users.keys().cloned().collect();
            self.dirty_all = false;
        }
        for path in self.dirty_nodes.drain() {
            let key = node_key(&path);
            match self.nodes.get(&path) {
                Some(n) => batch.put(key, node_record(n).encode_to_vec()),
                // Created and deleted since the last flush: never on disk.
                None if self.born.contains(&path) => {}
                None => batch.delete(key),
            }
        }
        self.born.clear();
        for id in self.dirty_sessions.drain() {
            let key = session_key(id);
            match self.sessions.get(&id) {
                Some(s) => batch.put(key, session_record(id, s).encode_to_vec()),
                None => batch.delete(key),
            }
        }
        for name in self.dirty_fences.drain() {
            let mut key = vec![PREFIX_FENCE];
            key.extend_from_slice(name.as_bytes());
            match self.fences.get(&name) {
                Some(t) => batch.put(key, FenceRecord { resource: name.clone(), token: *t }.encode_to_vec()),
                None => batch.delete(key),
            }
        }
        for name in self.dirty_users.drain() {
            let mut key = vec![PREFIX_USER];
            key.extend_from_slice(name.as_bytes());
            match self.users.get(&name) {
                Some((salt, hash)) => {
                    let rec = UserRecord { name: name.clone(), salt: salt.clone(), hash: hash.clone() };
                    batch.put(key, rec.encode_to_vec())
                }
                None => batch.delete(key),
            }
        }
        if std::mem::take(&mut self.dirty_cluster) {
            batch.put(KEY_CLUSTER, self.cluster.encode_to_vec());
        }
        batch.put(KEY_APPLIED, self.applied.to_be_bytes().to_vec());
    }

    /// The whole state as bytes (Raft snapshot payload).
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_record().encode_to_vec()
    }

    /// The state for a backup file (backup.rs): [`StateMachine::snapshot`]
    /// without what lets a reader act as a session. Every session's secret
    /// and cached replies are left out, so no one holding the file can
    /// resume or close a session of the live cluster; a restore gives the
    /// sessions new secrets ([`StateMachine::rekey_sessions`]).
    pub fn backup(&self) -> Vec<u8> {
        let mut snap = self.snapshot_record();
        for s in &mut snap.sessions {
            s.secret = Bytes::new();
            s.replies.clear();
        }
        snap.encode_to_vec()
    }

    /// Gives every session a fresh random secret (a restored backup's
    /// sessions: no client knows it, so they expire after their timeout
    /// with their ephemerals, and none can be taken over).
    pub fn rekey_sessions(&mut self, rng: &mut impl rand::Rng) {
        for s in self.sessions.values_mut() {
            let mut secret = [0u8; 16];
            rng.fill(&mut secret[..]);
            s.secret = Bytes::copy_from_slice(&secret);
            s.replies.clear();
            s.reply_bytes = 0;
        }
    }

    fn snapshot_record(&self) -> baton_proto::Snapshot {
        let mut nodes: Vec<NodeEntry> =
            self.nodes.iter().map(|(p, n)| NodeEntry { path: p.clone(), node: Some(node_record(n)) }).collect();
        nodes.sort_by(|a, b| a.path.cmp(&b.path));
        let mut fences: Vec<FenceRecord> =
            self.fences.iter().map(|(r, t)| FenceRecord { resource: r.clone(), token: *t }).collect();
        fences.sort_by(|a, b| a.resource.cmp(&b.resource));
        baton_proto::Snapshot {
            applied_index: self.applied,
            nodes,
            sessions: self.sessions.iter().map(|(id, s)| session_record(*id, s)).collect(),
            fences,
            cluster: (self.cluster != ClusterRecord::default()).then(|| self.cluster.clone()),
            users: self
                .users
                .iter()
                .map(|(n, (s, h))| UserRecord { name: n.clone(), salt: s.clone(), hash: h.clone() })
                .collect(),
        }
    }

    /// Replaces the whole state with a snapshot's.
    pub fn restore(&mut self, data: &[u8]) -> Result<(), prost::DecodeError> {
        let snap = baton_proto::Snapshot::decode(data)?;
        let mut sm = StateMachine::new();
        sm.applied = snap.applied_index;
        for e in snap.nodes {
            if let Some(rec) = e.node {
                sm.nodes.insert(e.path, node_from_record(rec));
            }
        }
        for s in snap.sessions {
            sm.sessions.insert(s.id, session_from_record(s));
        }
        for f in snap.fences {
            sm.fences.insert(f.resource, f.token);
        }
        sm.cluster = snap.cluster.unwrap_or_default();
        for u in snap.users {
            sm.users.insert(u.name, (u.salt, u.hash));
        }
        sm.rebuild_derived();
        sm.dirty_all = true;
        sm.faults = self.faults;
        *self = sm;
        Ok(())
    }

    /// A canonical text dump of the whole state (tests, golden scripts).
    pub fn dump(&self) -> String {
        let mut out = String::new();
        let mut paths: Vec<&String> = self.nodes.keys().collect();
        paths.sort();
        for p in paths {
            let n = &self.nodes[p];
            let s = &n.stat;
            out.push_str(&format!(
                "{p} data={:?} czxid={} mzxid={} pzxid={} v={} cv={} owner={} children={}\n",
                String::from_utf8_lossy(&n.data),
                s.czxid,
                s.mzxid,
                s.pzxid,
                s.version,
                s.cversion,
                s.ephemeral_owner,
                s.num_children
            ));
        }
        let mut acls: Vec<(&String, &Node)> = self.nodes.iter().filter(|(_, n)| !n.acl.is_empty()).collect();
        acls.sort_by(|a, b| a.0.cmp(b.0));
        for (p, n) in acls {
            let acl: Vec<String> = n.acl.iter().map(acl::format).collect();
            out.push_str(&format!("acl {p} {}\n", acl.join(",")));
        }
        for name in self.users.keys() {
            out.push_str(&format!("user {name}\n"));
        }
        for (id, s) in &self.sessions {
            out.push_str(&format!("session {id} timeout={} ephemerals={:?}\n", s.timeout_ms, s.ephemerals));
        }
        let mut fences: Vec<_> = self.fences.iter().collect();
        fences.sort();
        for (r, t) in fences {
            out.push_str(&format!("fence {r} = {t}\n"));
        }
        if !self.cluster.cluster_id.is_empty() {
            let c = &self.cluster;
            out.push_str(&format!("cluster {} set at {} joined {:?}\n", c.cluster_id, c.index, c.joined));
        }
        for m in &self.cluster.members {
            out.push_str(&format!("member {} peer {} client {}\n", m.id, m.peer_addr, m.client_addr));
        }
        out
    }
}

/// One write in progress, with what it takes to undo it.
/// Where a fence's guard lives: a node `/_baton/fences/<name>` whose ACL
/// says who may use fence `<name>` (WRITE); no node, no guard.
pub const FENCE_GUARDS: &str = "/_baton/fences";

/// The most fence names the cluster keeps: a constant, so every member
/// applies the same rule (a new name past it is `BUSY`).
pub const MAX_FENCES: usize = 100_000;

struct Txn<'a> {
    sm: &'a mut StateMachine,
    undo: Vec<Undo>,
    changes: Vec<Change>,
    index: u64,
    time: i64,
    session: u64,
    /// Whose write this is, for ACL checks (acl.rs).
    caller: Caller,
}

/// A failed write: code, message, and (for multi) the per-op results.
type TxnError = Box<(ErrorCode, String, Option<response::Body>)>;

impl Txn<'_> {
    fn run(&mut self, w: &ClientWrite) -> Result<response::Body, TxnError> {
        use baton_proto::client_write::Op as W;
        let single = |r: Result<response::Body, OpError>| r.map_err(|(c, m)| Box::new((c, m, None)));
        match &w.op {
            Some(W::Create(c)) => {
                single(self.create(c).map(|(path, stat)| response::Body::Create(CreateResp { path, stat: Some(stat) })))
            }
            Some(W::Set(s)) => single(self.set(s).map(|stat| response::Body::Set(SetResp { stat: Some(stat) }))),
            Some(W::Delete(d)) => single(self.delete(d).map(|_| response::Body::Empty(Empty {}))),
            Some(W::Multi(m)) => self.multi(&m.ops),
            Some(W::SetAcl(a)) => single(self.set_acl(a).map(|stat| response::Body::Set(SetResp { stat: Some(stat) }))),
            Some(W::AddUser(u)) => single(self.add_user(u).map(|_| response::Body::Empty(Empty {}))),
            Some(W::ResetFence(f)) => single(self.reset_fence(&f.resource).map(|_| response::Body::Empty(Empty {}))),
            Some(W::SetSettings(s)) => single(self.set_settings(s).map(|_| response::Body::Empty(Empty {}))),
            Some(W::RemoveUser(u)) => single(self.remove_user(&u.name).map(|_| response::Body::Empty(Empty {}))),
            Some(W::CloseSession(_)) | Some(W::ClaimSession(_)) | None => {
                Err(Box::new((ErrorCode::BadRequest, "unknown write".into(), None)))
            }
        }
    }

    fn multi(&mut self, ops: &[baton_proto::Op]) -> Result<response::Body, TxnError> {
        let mut results = Vec::with_capacity(ops.len());
        for (i, o) in ops.iter().enumerate() {
            let r = match &o.op {
                Some(op::Op::Create(c)) => {
                    self.create(c).map(|(path, stat)| OpResult { path, stat: Some(stat), ..Default::default() })
                }
                Some(op::Op::Set(s)) => self.set(s).map(|stat| OpResult { stat: Some(stat), ..Default::default() }),
                Some(op::Op::Delete(d)) => self.delete(d).map(|_| OpResult::default()),
                Some(op::Op::Check(c)) => self.check(c).map(|_| OpResult::default()),
                Some(op::Op::CheckFence(f)) => self.check_fence(f).map(|_| OpResult::default()),
                Some(op::Op::SetAcl(a)) => {
                    self.set_acl(a).map(|stat| OpResult { stat: Some(stat), ..Default::default() })
                }
                None => err(ErrorCode::BadRequest, "empty op"),
            };
            match r {
                Ok(res) => results.push(res),
                Err((code, msg)) => {
                    results.push(OpResult { error: code as i32, ..Default::default() });
                    let body = response::Body::Multi(MultiResp { results });
                    return Err(Box::new((code, format!("multi op #{i} failed: {msg}"), Some(body))));
                }
            }
        }
        Ok(response::Body::Multi(MultiResp { results }))
    }

    fn save_node(&mut self, path: &str) {
        let prev = self.sm.nodes.get(path).cloned();
        self.undo.push(Undo::Node(path.to_string(), prev));
        self.sm.mark_node(path);
    }

    fn create(&mut self, c: &CreateOp) -> Result<(String, Stat), OpError> {
        check_path(&c.path)?;
        if c.data.len() > MAX_DATA {
            return err(ErrorCode::TooLarge, format!("data is {} bytes, over {MAX_DATA}", c.data.len()));
        }
        if c.path == "/" && !c.sequential {
            return err(ErrorCode::NodeExists, "/ exists");
        }
        let parent = parent_of(&c.path).unwrap_or("/").to_string();
        if !self.sm.nodes.contains_key(&parent) {
            if c.parents {
                self.create_parents(&parent)?;
            } else {
                return err(ErrorCode::NoNode, format!("parent {parent} does not exist"));
            }
        }
        let p = &self.sm.nodes[&parent];
        self.caller.check(&p.acl, acl::CREATE, "create in", &parent)?;
        if p.stat.ephemeral_owner != 0 {
            return err(ErrorCode::NoChildrenForEphemerals, format!("{parent} is ephemeral and cannot have children"));
        }
        acl::validate(&c.acl)?;
        check_kind(c)?;
        let node_acl = if c.acl.is_empty() { p.acl.clone() } else { self.caller.expand(&c.acl)? };
        let mut seq = p.next_seq;
        let path = if c.sequential {
            loop {
                let candidate = format!("{}{seq:010}", c.path);
                if !self.sm.nodes.contains_key(&candidate) {
                    break candidate;
                }
                seq += 1;
            }
        } else {
            c.path.clone()
        };
        if c.sequential {
            check_path(&path)?; // the suffix may push it over the limit
        }
        if self.sm.nodes.contains_key(&path) {
            return err(ErrorCode::NodeExists, format!("{path} exists"));
        }
        let owner = if c.ephemeral { self.session } else { 0 };
        self.insert_node(&parent, &path, c.data.clone(), owner, c.sequential.then_some(seq + 1), node_acl);
        if c.container || c.ttl_ms > 0 {
            if let Some(n) = self.sm.nodes.get_mut(&path) {
                n.stat.container = c.container;
                n.stat.ttl_ms = c.ttl_ms;
            }
            self.sm.reapable.insert(path.clone());
        }
        Ok((path.clone(), full_stat(&self.sm.nodes[&path])))
    }

    fn create_parents(&mut self, path: &str) -> Result<(), OpError> {
        let mut missing = Vec::new();
        let mut cur = path;
        while !self.sm.nodes.contains_key(cur) {
            missing.push(cur.to_string());
            cur = parent_of(cur).unwrap_or("/");
        }
        let top = &self.sm.nodes[cur];
        self.caller.check(&top.acl, acl::CREATE, "create in", cur)?;
        if top.stat.ephemeral_owner != 0 {
            return err(ErrorCode::NoChildrenForEphemerals, format!("{cur} is ephemeral and cannot have children"));
        }
        let inherited = top.acl.clone();
        for p in missing.iter().rev() {
            let parent = parent_of(p).unwrap_or("/").to_string();
            self.insert_node(&parent, p, Bytes::new(), 0, None, inherited.clone());
        }
        Ok(())
    }

    /// `next_seq`: the parent's counter after a sequential create.
    fn insert_node(&mut self, parent: &str, path: &str, data: Bytes, owner: u64, next_seq: Option<u64>, acl: Vec<Acl>) {
        self.save_node(parent);
        self.save_node(path);
        let (index, time) = (self.index, self.time);
        if let Some(p) = self.sm.nodes.get_mut(parent) {
            if let Some(n) = next_seq {
                p.next_seq = n;
            }
            p.stat.num_children += 1;
            p.stat.cversion += 1;
            p.stat.pzxid = index;
        }
        let stat = Stat {
            czxid: index,
            mzxid: index,
            pzxid: index,
            ctime: time,
            mtime: time,
            ephemeral_owner: owner,
            ..Default::default()
        };
        self.sm.kids.entry(parent.to_string()).or_default().insert(base_name(path).to_string());
        self.undo.push(Undo::Child { parent: parent.to_string(), name: base_name(path).to_string(), added: true });
        self.sm.nodes.insert(path.to_string(), Node { data, stat, next_seq: 0, acl });
        if owner != 0 {
            if let Some(s) = self.sm.sessions.get_mut(&owner) {
                if s.ephemerals.insert(path.to_string()) {
                    self.undo.push(Undo::Ephemeral { session: owner, path: path.to_string(), added: true });
                }
            }
        }
        self.changes.push(Change::Created(path.to_string()));
        self.changes.push(Change::ChildrenChanged(parent.to_string()));
    }

    fn set(&mut self, s: &SetOp) -> Result<Stat, OpError> {
        check_path(&s.path)?;
        if s.data.len() > MAX_DATA {
            return err(ErrorCode::TooLarge, format!("data is {} bytes, over {MAX_DATA}", s.data.len()));
        }
        let n = self.sm.lookup(&s.path)?;
        self.caller.check(&n.acl, acl::WRITE, "set", &s.path)?;
        check_version(&s.path, n, s.version)?;
        self.save_node(&s.path);
        let (index, time) = (self.index, self.time);
        let n = self.sm.nodes.get_mut(&s.path).ok_or((ErrorCode::Internal, "vanished".to_string()))?;
        n.data = s.data.clone();
        n.stat.version += 1;
        n.stat.mzxid = index;
        n.stat.mtime = time;
        let stat = full_stat(n);
        self.changes.push(Change::DataChanged(s.path.clone()));
        Ok(stat)
    }

    fn delete(&mut self, d: &DeleteOp) -> Result<(), OpError> {
        check_path(&d.path)?;
        if d.path == "/" {
            return err(ErrorCode::InvalidPath, "/ cannot be deleted");
        }
        let n = self.sm.lookup(&d.path)?;
        let parent_acl = parent_of(&d.path).and_then(|p| self.sm.nodes.get(p)).map(|p| p.acl.as_slice()).unwrap_or(&[]);
        self.caller.check(parent_acl, acl::DELETE, "delete", &d.path)?;
        check_version(&d.path, n, d.version)?;
        if n.stat.num_children > 0 {
            return err(ErrorCode::NotEmpty, format!("{} has {} children", d.path, n.stat.num_children));
        }
        let owner = n.stat.ephemeral_owner;
        let parent = parent_of(&d.path).unwrap_or("/").to_string();
        self.save_node(&d.path);
        self.save_node(&parent);
        if owner != 0 {
            if let Some(s) = self.sm.sessions.get_mut(&owner) {
                if s.ephemerals.remove(&d.path) {
                    self.undo.push(Undo::Ephemeral { session: owner, path: d.path.clone(), added: false });
                }
            }
        }
        self.undo.push(Undo::Child { parent: parent.clone(), name: base_name(&d.path).to_string(), added: false });
        let mut changes = Vec::new();
        self.sm.remove_node(&d.path, self.index, &mut changes);
        self.changes.extend(changes);
        Ok(())
    }

    fn set_acl(&mut self, a: &baton_proto::SetAclOp) -> Result<Stat, OpError> {
        check_path(&a.path)?;
        acl::validate(&a.acl)?;
        let n = self.sm.lookup(&a.path)?;
        self.caller.check(&n.acl, acl::ADMIN, "set-acl", &a.path)?;
        // After ADMIN, as ZooKeeper checks them. An empty list here would
        // mean "open to everyone", which no one asking to set an ACL means;
        // ZooKeeper answers INVALIDACL.
        if a.acl.is_empty() {
            return err(
                ErrorCode::BadRequest,
                format!("an empty ACL would open {} to everyone: to mean that, set world:anyone:rwcda", a.path),
            );
        }
        if let Some(v) = a.version {
            if v != n.stat.aversion {
                return err(
                    ErrorCode::BadVersion,
                    format!("{}'s ACL is at version {}, not {v}", a.path, n.stat.aversion),
                );
            }
        }
        let new = self.caller.expand(&a.acl)?;
        self.save_node(&a.path);
        let n = self.sm.nodes.get_mut(&a.path).ok_or((ErrorCode::Internal, "vanished".to_string()))?;
        n.acl = new;
        n.stat.aversion += 1;
        Ok(full_stat(n))
    }

    fn superuser_only(&self, what: &str) -> Result<(), OpError> {
        if self.caller.superuser {
            return Ok(());
        }
        err(ErrorCode::NoAuth, format!("{what} needs a superuser (--superuser)"))
    }

    fn add_user(&mut self, u: &AddUserOp) -> Result<(), OpError> {
        self.superuser_only("add-user")?;
        if u.name.is_empty() || u.name.len() > 256 || u.name.contains(':') || u.name.chars().any(char::is_control) {
            return err(ErrorCode::BadRequest, "a user name is 1..256 characters, no ':' or control characters");
        }
        if self.sm.users.contains_key(&u.name) {
            return err(ErrorCode::NodeExists, format!("user {} exists", u.name));
        }
        self.undo.push(Undo::User(u.name.clone(), None));
        self.sm.users.insert(u.name.clone(), (u.salt.clone(), u.hash.clone()));
        self.sm.dirty_users.insert(u.name.clone());
        Ok(())
    }

    /// Replaces the cluster-wide settings (settings.rs): superusers only,
    /// never to settings that leave no admin; logged on every member.
    fn set_settings(&mut self, op: &baton_proto::SetSettingsOp) -> Result<(), OpError> {
        self.superuser_only("changing the cluster settings")?;
        let s = op.settings.clone().unwrap_or_default();
        crate::settings::validate(&s).map_err(|m| (ErrorCode::BadRequest, m))?;
        tracing::warn!(
            superusers = ?s.superusers,
            open_admin = s.open_admin,
            index = self.index,
            by = ?self.caller.identities,
            "audit: cluster settings changed by a superuser"
        );
        // Last: nothing after it can fail, so there is nothing to undo.
        self.sm.cluster.settings = Some(s);
        self.sm.dirty_cluster = true;
        Ok(())
    }

    /// An admin's way out of a jammed fence: forgets `resource`'s highest
    /// token (the next check takes any valid token), with an audit line on
    /// every member that applies it.
    fn reset_fence(&mut self, resource: &str) -> Result<(), OpError> {
        self.superuser_only("fence reset")?;
        let Some(prev) = self.sm.fences.remove(resource) else {
            return err(ErrorCode::NoNode, format!("no fence {resource}"));
        };
        tracing::warn!(
            fence = resource,
            token = prev,
            index = self.index,
            by = ?self.caller.identities,
            "audit: fence reset by a superuser (it was at token {prev})"
        );
        self.undo.push(Undo::Fence(resource.to_string(), Some(prev)));
        self.sm.dirty_fences.insert(resource.to_string());
        Ok(())
    }

    fn remove_user(&mut self, name: &str) -> Result<(), OpError> {
        self.superuser_only("remove-user")?;
        let Some(prev) = self.sm.users.remove(name) else {
            return err(ErrorCode::NoNode, format!("no user {name}"));
        };
        self.undo.push(Undo::User(name.to_string(), Some(prev)));
        self.sm.dirty_users.insert(name.to_string());
        Ok(())
    }

    fn check(&mut self, c: &CheckOp) -> Result<(), OpError> {
        let n = self.sm.lookup(&c.path)?;
        check_version(&c.path, n, c.version)
    }

    fn check_fence(&mut self, f: &CheckFenceOp) -> Result<(), OpError> {
        if f.resource.is_empty() || f.resource.len() > baton_proto::MAX_PATH {
            return err(ErrorCode::BadRequest, "fence resource name must be 1..4096 bytes");
        }
        // A token is a log index: one above this entry's own index was
        // handed out by no lock, and would jam the fence for every real
        // holder (finding A3: `--fence counter=18446744073709551615`).
        if f.token > self.index {
            return err(
                ErrorCode::BadRequest,
                format!(
                    "fence {}: token {} is above this write's log index {}: no lock has handed it out",
                    f.resource, f.token, self.index
                ),
            );
        }
        // Who may use a fence: a node `/_baton/fences/<name>` guards it with
        // its ACL (WRITE), as a lock's folder guards the lock.
        let guard = format!("{FENCE_GUARDS}/{}", f.resource);
        if let Some(n) = self.sm.nodes.get(&guard) {
            self.caller.check(&n.acl, acl::WRITE, "fence", &guard)?;
        }
        let prev = self.sm.fences.get(&f.resource).copied();
        if prev.is_none() && self.sm.fences.len() >= MAX_FENCES {
            return err(
                ErrorCode::Busy,
                format!("fence {}: the cluster already keeps {MAX_FENCES} fences (the most it keeps)", f.resource),
            );
        }
        if let Some(seen) = prev.filter(|_| !self.sm.faults.no_fence_check()) {
            if f.token < seen {
                return err(
                    ErrorCode::FenceRejected,
                    format!("fence {}: token {} is older than {} already used", f.resource, f.token, seen),
                );
            }
        }
        self.undo.push(Undo::Fence(f.resource.clone(), prev));
        self.sm.fences.insert(f.resource.clone(), f.token);
        self.sm.dirty_fences.insert(f.resource.clone());
        Ok(())
    }

    fn rollback(&mut self) {
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Node(path, prev) => match prev {
                    Some(n) => {
                        if n.stat.container || n.stat.ttl_ms > 0 {
                            self.sm.reapable.insert(path.clone());
                        }
                        self.sm.nodes.insert(path, n);
                    }
                    None => {
                        self.sm.nodes.remove(&path);
                    }
                },
                Undo::Fence(name, prev) => match prev {
                    Some(t) => {
                        self.sm.fences.insert(name, t);
                    }
                    None => {
                        self.sm.fences.remove(&name);
                    }
                },
                Undo::User(name, prev) => match prev {
                    Some(v) => {
                        self.sm.users.insert(name, v);
                    }
                    None => {
                        self.sm.users.remove(&name);
                    }
                },
                Undo::Child { parent, name, added } => {
                    let set = self.sm.kids.entry(parent).or_default();
                    if added {
                        set.remove(&name);
                    } else {
                        set.insert(name);
                    }
                }
                Undo::Ephemeral { session, path, added } => {
                    if let Some(s) = self.sm.sessions.get_mut(&session) {
                        if added {
                            s.ephemerals.remove(&path);
                        } else {
                            s.ephemerals.insert(path);
                        }
                    }
                }
            }
        }
        self.changes.clear();
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

fn node_key(path: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(path.len() + 1);
    k.push(PREFIX_NODE);
    k.extend_from_slice(path.as_bytes());
    k
}

fn session_key(id: u64) -> Vec<u8> {
    let mut k = vec![PREFIX_SESSION];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn node_record(n: &Node) -> NodeRecord {
    NodeRecord { data: n.data.clone(), stat: Some(n.stat), next_seq: n.next_seq, acl: n.acl.clone() }
}

fn node_from_record(r: NodeRecord) -> Node {
    Node { data: r.data, stat: r.stat.unwrap_or_default(), next_seq: r.next_seq, acl: r.acl }
}

fn session_record(id: u64, s: &Session) -> SessionRecord {
    SessionRecord {
        id,
        timeout_ms: s.timeout_ms,
        secret: s.secret.clone(),
        replies: s
            .replies
            .iter()
            .map(|(seq, (digest, r))| CachedReply { seq: *seq, response: r.clone(), digest: *digest })
            .collect(),
        acked_below: s.acked_below,
        epoch: s.epoch,
    }
}

fn session_from_record(r: SessionRecord) -> Session {
    Session {
        timeout_ms: r.timeout_ms,
        secret: r.secret,
        acked_below: r.acked_below,
        epoch: r.epoch,
        reply_bytes: r.replies.iter().map(|c| c.response.len()).sum(),
        replies: r.replies.into_iter().map(|c| (c.seq, (c.digest, c.response))).collect(),
        ephemerals: BTreeSet::new(),
    }
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
mod tests {
    use super::*;
    use crate::kv::BatchOp;
    use crate::raft_store as rs;

    #[test]
    fn keys_are_distinct() {
        let mine = [KEY_APPLIED[0], PREFIX_NODE, PREFIX_SESSION, PREFIX_FENCE, KEY_CLUSTER[0], PREFIX_USER];
        let raft = [
            rs::KEY_HARD_STATE[0],
            rs::KEY_CONF_STATE[0],
            rs::KEY_TRUNCATED[0],
            rs::KEY_SNAPSHOT[0],
            rs::PREFIX_ENTRY,
            crate::cluster::KEY_INCARNATION[0],
            crate::cluster::PREFIX_PEER_INCARNATION,
        ];
        let all: BTreeSet<u8> = mine.iter().chain(raft.iter()).copied().collect();
        assert_eq!(all.len(), mine.len() + raft.len(), "two tables share a first key byte");
    }

    fn write(secret: &'static [u8]) -> Command {
        Command {
            body: Some(command::Body::Write(ClientWrite {
                session_id: 1,
                seq: 1,
                secret: Bytes::from_static(secret),
                op: Some(baton_proto::client_write::Op::Create(CreateOp { path: "/x".into(), ..Default::default() })),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn op(seq: u64, op: baton_proto::client_write::Op) -> Command {
        Command {
            body: Some(command::Body::Write(ClientWrite {
                session_id: 1,
                seq,
                secret: Bytes::from_static(b"s"),
                op: Some(op),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn code(a: &Applied) -> i32 {
        a.reply.as_ref().map_or(-1, |r| r.error)
    }

    #[test]
    fn a_reused_sequence_number_with_another_op_is_refused_never_answered_with_the_first_reply() {
        use baton_proto::client_write::Op as W;
        let mut sm = StateMachine::new();
        let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        let create = |p: &str| W::Create(CreateOp { path: p.into(), ..Default::default() });
        let first = sm.apply(2, &op(7, create("/w1")));
        assert_eq!(code(&first), 0);
        // The same write again: its first reply, unchanged.
        let again = sm.apply(3, &op(7, create("/w1")));
        assert_eq!(again.reply, first.reply);
        // Another write with that number: refused, not run.
        let other = sm.apply(4, &op(7, create("/w2")));
        assert_eq!(code(&other), ErrorCode::StaleSequence as i32, "{:?}", other.reply);
        assert!(sm.exists("/w2").unwrap().is_none());
        // The digest survives a snapshot.
        let mut restored = StateMachine::new();
        restored.restore(&sm.snapshot()).unwrap();
        let other = restored.apply(5, &op(7, create("/w2")));
        assert_eq!(code(&other), ErrorCode::StaleSequence as i32);
    }

    /// A multi of one `check_fence` on `resource` with `token`.
    fn fence(resource: &str, token: u64) -> baton_proto::client_write::Op {
        let f = baton_proto::op::Op::CheckFence(CheckFenceOp { resource: resource.into(), token });
        baton_proto::client_write::Op::Multi(baton_proto::MultiOp { ops: vec![baton_proto::Op { op: Some(f) }] })
    }

    #[test]
    fn a_fence_refuses_a_token_above_its_entrys_index_and_keeps_at_most_max_fences() {
        let mut sm = StateMachine::new();
        let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        // The review's jam: the largest token, refused, and nothing kept.
        let jam = sm.apply(2, &op(1, fence("counter", u64::MAX)));
        assert_eq!(code(&jam), ErrorCode::BadRequest as i32);
        assert!(sm.fences.is_empty());
        // One index too far, refused; the entry's own index, taken.
        assert_eq!(code(&sm.apply(3, &op(2, fence("counter", 4)))), ErrorCode::BadRequest as i32);
        assert_eq!(code(&sm.apply(4, &op(3, fence("counter", 4)))), 0);
        assert_eq!(code(&sm.apply(5, &op(4, fence("counter", 3)))), ErrorCode::FenceRejected as i32);
        // The table is bounded: a new name past MAX_FENCES is BUSY, a
        // known one still works.
        for i in 0..MAX_FENCES - 1 {
            sm.fences.insert(format!("f{i}"), 1);
        }
        assert_eq!(code(&sm.apply(6, &op(5, fence("one-too-many", 6)))), ErrorCode::Busy as i32);
        assert_eq!(code(&sm.apply(7, &op(6, fence("counter", 7)))), 0);
    }

    #[test]
    fn a_fence_guarded_by_its_node_needs_write_there() {
        use baton_proto::client_write::Op as W;
        let mut sm = StateMachine::new();
        let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        let as_alice = |mut c: Command| {
            if let Some(command::Body::Write(w)) = &mut c.body {
                w.identities = vec!["user:alice".into()];
            }
            c
        };
        let guard = W::Create(CreateOp {
            path: format!("{FENCE_GUARDS}/billing"),
            parents: true,
            acl: vec![Acl { perms: acl::ALL, id: "user:alice".into() }],
            ..Default::default()
        });
        assert_eq!(code(&sm.apply(2, &op(1, guard))), 0);
        // Anyone else: NO_AUTH, nothing recorded; alice: taken.
        assert_eq!(code(&sm.apply(3, &op(2, fence("billing", 3)))), ErrorCode::NoAuth as i32);
        assert!(!sm.fences.contains_key("billing"));
        assert_eq!(code(&sm.apply(4, &as_alice(op(3, fence("billing", 4))))), 0);
        // A fence with no guard node is open.
        assert_eq!(code(&sm.apply(5, &op(4, fence("open", 5)))), 0);
    }

    #[test]
    fn a_backup_leaves_secrets_and_replies_out_and_a_restore_rekeys_the_sessions() {
        use baton_proto::client_write::Op as W;
        let mut sm = StateMachine::new();
        let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        assert_eq!(code(&sm.apply(2, &op(1, W::Create(CreateOp { path: "/a".into(), ..Default::default() })))), 0);
        let full = baton_proto::Snapshot::decode(&sm.snapshot()[..]).unwrap();
        assert_eq!(full.sessions[0].secret.as_ref(), b"s", "a peer's snapshot keeps the secret");
        assert_eq!(full.sessions[0].replies.len(), 1);
        let backup = baton_proto::Snapshot::decode(&sm.backup()[..]).unwrap();
        assert_eq!(backup.sessions.len(), 1);
        assert!(backup.sessions[0].secret.is_empty());
        assert!(backup.sessions[0].replies.is_empty());
        assert_eq!(backup.nodes, full.nodes);
        // Restored, the session has a fresh secret: neither the old one nor
        // the empty one the backup carried opens it.
        let mut restored = StateMachine::new();
        restored.restore(&sm.backup()).unwrap();
        restored.rekey_sessions(&mut rand::thread_rng());
        assert!(restored.check_session(1, b"s").is_err());
        assert!(restored.check_session(1, b"").is_err());
    }

    #[test]
    fn a_claim_moves_the_session_to_a_new_epoch_and_older_writes_fail_session_moved() {
        use baton_proto::client_write::Op as W;
        let mut sm = StateMachine::new();
        let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        let create = |p: &str| W::Create(CreateOp { path: p.into(), ..Default::default() });
        let with_epoch = |seq: u64, epoch: u64, w: W| {
            let mut c = op(seq, w);
            if let Some(command::Body::Write(cw)) = &mut c.body {
                cw.epoch = epoch;
            }
            c
        };
        assert_eq!(code(&sm.apply(2, &op(1, create("/a")))), 0);
        let claim = sm.apply(3, &op(1, W::ClaimSession(baton_proto::ClaimSessionReq {})));
        assert_eq!(code(&claim), 0);
        assert_eq!(claim.reply.as_ref().map(|r| r.zxid), Some(3));
        // The old connection's next write (epoch 0): moved, not run.
        let old = sm.apply(4, &op(2, create("/old")));
        assert_eq!(code(&old), ErrorCode::SessionMoved as i32);
        assert!(sm.exists("/old").unwrap().is_none());
        // The claiming connection numbers from 1 again under epoch 3.
        let new = sm.apply(5, &with_epoch(1, 3, create("/new")));
        assert_eq!(code(&new), 0, "{:?}", new.reply);
        assert!(sm.exists("/new").unwrap().is_some());
        // An epoch no claim made.
        assert_eq!(code(&sm.apply(6, &with_epoch(2, 9, create("/x")))), ErrorCode::BadRequest as i32);
        // The epoch survives a snapshot.
        let mut restored = StateMachine::new();
        restored.restore(&sm.snapshot()).unwrap();
        assert_eq!(code(&restored.apply(7, &op(3, create("/old2")))), ErrorCode::SessionMoved as i32);
    }

    /// What a flush stages for the node at `path`: "put", "delete" or "".
    fn staged(batch: &Batch, path: &str) -> &'static str {
        let key = node_key(path);
        match batch.ops.iter().rev().find(|o| matches!(o, BatchOp::Put(k, _) | BatchOp::Delete(k) if *k == key)) {
            Some(BatchOp::Put(..)) => "put",
            Some(_) => "delete",
            None => "",
        }
    }

    #[test]
    fn a_node_born_and_gone_between_flushes_is_never_written() {
        use baton_proto::client_write::Op as W;
        let mut sm = StateMachine::new();
        let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        let create = |p: &str| W::Create(CreateOp { path: p.into(), ..Default::default() });
        let delete = |p: &str| W::Delete(DeleteOp { path: p.into(), version: None });
        sm.apply(2, &op(1, create("/old")));
        sm.flush(&mut Batch::default());
        sm.apply(3, &op(2, create("/brief")));
        sm.apply(4, &op(3, delete("/brief")));
        sm.apply(5, &op(4, delete("/old")));
        sm.apply(6, &op(5, create("/again")));
        sm.apply(7, &op(6, delete("/again")));
        sm.apply(8, &op(7, create("/again")));
        let mut b = Batch::default();
        sm.flush(&mut b);
        assert_eq!(staged(&b, "/brief"), "", "a node that was never on disk got a tombstone");
        assert_eq!(staged(&b, "/old"), "delete", "a node on disk was deleted without a tombstone");
        assert_eq!(staged(&b, "/again"), "put");
        // The next window starts afresh: /again is on disk now.
        sm.apply(9, &op(8, delete("/again")));
        let mut b = Batch::default();
        sm.flush(&mut b);
        assert_eq!(staged(&b, "/again"), "delete");
    }

    #[test]
    fn a_write_runs_only_with_its_sessions_secret() {
        let mut sm = StateMachine::new();
        let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"right") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        let r = sm.apply(2, &write(b"wrong")).reply.expect("reply");
        assert_eq!(r.error, ErrorCode::SessionMoved as i32);
        assert!(sm.exists("/x").expect("exists").is_none(), "the forged write ran");
        let r = sm.apply(3, &write(b"right")).reply.expect("reply");
        assert_eq!(r.error, 0, "{r:?}");
        assert!(sm.exists("/x").expect("exists").is_some());
    }

    #[test]
    fn containers_and_ttl_nodes_are_reaped_only_when_due_and_unchanged() {
        use baton_proto::client_write::Op as W;
        let mut sm = StateMachine::new();
        let ns = baton_proto::NewSession { timeout_ms: 1000, secret: Bytes::from_static(b"s") };
        sm.apply(1, &Command { body: Some(command::Body::NewSession(ns)), ..Default::default() });
        let at = |mut c: Command, t: i64| {
            c.time_ms = t;
            c
        };
        let create = |path: &str, container: bool, ttl_ms: u64| {
            W::Create(CreateOp { path: path.into(), container, ttl_ms, ..Default::default() })
        };
        let ok = |a: Applied| assert_eq!(a.reply.expect("reply").error, 0);
        ok(sm.apply(2, &at(op(1, create("/c", true, 0)), 1000)));
        ok(sm.apply(3, &at(op(2, create("/t", false, 500)), 1000)));
        ok(sm.apply(4, &at(op(3, create("/c/k", false, 0)), 1000)));
        // Bad kinds are refused before anything changes.
        let bad = CreateOp { path: "/e".into(), ephemeral: true, ttl_ms: 5, ..Default::default() };
        let r = sm.apply(5, &at(op(4, W::Create(bad)), 1000)).reply.expect("reply");
        assert_eq!(r.error, ErrorCode::BadRequest as i32);
        let bad = CreateOp { path: "/e".into(), container: true, sequential: true, ..Default::default() };
        assert_eq!(sm.apply(6, &op(5, W::Create(bad))).reply.expect("reply").error, ErrorCode::BadRequest as i32);
        // Nothing is due yet: the container has a child, the TTL has not run.
        assert!(sm.due_for_reaping(1400).is_empty());
        let due = sm.due_for_reaping(1501);
        assert_eq!(due.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), vec!["/t"]);
        // A set starts the TTL again: the entry the leader proposed before it deletes nothing.
        let set = W::Set(SetOp { path: "/t".into(), data: Bytes::from_static(b"v"), version: None });
        ok(sm.apply(7, &at(op(6, set), 1600)));
        let stale = Command {
            time_ms: 1700,
            body: Some(command::Body::Reap(baton_proto::ReapNodes { nodes: due })),
            ..Default::default()
        };
        assert!(sm.apply(8, &stale).changes.is_empty());
        assert!(sm.exists("/t").expect("exists").is_some(), "a TTL node changed within its TTL was reaped");
        // The container's last child goes: due, and the reap deletes it with its events.
        ok(sm.apply(9, &at(op(7, W::Delete(DeleteOp { path: "/c/k".into(), version: None })), 1700)));
        let due = sm.due_for_reaping(2200);
        assert_eq!(due.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), vec!["/c", "/t"]);
        // A child added between the look and the entry keeps the container.
        ok(sm.apply(10, &at(op(8, create("/c/k2", false, 0)), 2200)));
        let reap = Command {
            time_ms: 2200,
            body: Some(command::Body::Reap(baton_proto::ReapNodes { nodes: due })),
            ..Default::default()
        };
        let a = sm.apply(11, &reap);
        assert_eq!(a.changes, vec![Change::Deleted("/t".into()), Change::ChildrenChanged("/".into())]);
        assert!(sm.exists("/c").expect("exists").is_some());
        assert!(sm.exists("/t").expect("exists").is_none());
        // A container that never had a child stays; the index survives a restore.
        ok(sm.apply(12, &at(op(9, create("/never", true, 0)), 2200)));
        let mut copy = StateMachine::new();
        copy.restore(&sm.snapshot()).expect("restore");
        assert!(copy.due_for_reaping(i64::MAX).is_empty());
        ok(copy.apply(13, &at(op(10, W::Delete(DeleteOp { path: "/c/k2".into(), version: None })), 3000)));
        let due = copy.due_for_reaping(3000);
        assert_eq!(due.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), vec!["/c"]);
        let stat = copy.exists("/c").expect("exists").expect("stat");
        assert!(stat.container && stat.cversion > 0);
    }
}
