//! The client's own public types: what a node looks like ([`Stat`]), what a
//! watch reports ([`WatchEvent`]), and the states a session goes through.
//! They are Baton's, not the wire's: a change in the protocol crate or in
//! prost does not change this API.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A node's metadata. Every `*zxid` is a Raft log index; `czxid`, the index
/// that created the node, is the fencing token of a lock node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Stat {
    /// Log index that created the node (a lock node's fencing token).
    pub czxid: u64,
    /// Log index of the last data change.
    pub mzxid: u64,
    /// Log index of the last change to the children.
    pub pzxid: u64,
    /// Creation time, ms since the Unix epoch (stamped by the proposer).
    pub ctime: i64,
    /// Time of the last data change, ms since the Unix epoch.
    pub mtime: i64,
    /// Number of data changes.
    pub version: i32,
    /// Number of changes to the children.
    pub cversion: i32,
    /// Number of ACL changes.
    pub aversion: i32,
    /// The owning session for an ephemeral node, 0 for a persistent one.
    pub ephemeral_owner: u64,
    /// Bytes of data.
    pub data_length: u32,
    /// Number of children.
    pub num_children: u32,
    /// A container node: the cluster deletes it once its last child goes.
    pub container: bool,
    /// A TTL node's TTL in ms (0: none): the cluster deletes it once it has
    /// no children and its data has not changed for this long.
    pub ttl_ms: u64,
}

impl Stat {
    /// True for an ephemeral node (deleted when its session ends).
    pub fn is_ephemeral(&self) -> bool {
        self.ephemeral_owner != 0
    }
    /// When the node was created.
    pub fn created(&self) -> SystemTime {
        epoch_ms(self.ctime)
    }
    /// When the node's data last changed.
    pub fn modified(&self) -> SystemTime {
        epoch_ms(self.mtime)
    }
}

fn epoch_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

impl From<baton_proto::Stat> for Stat {
    fn from(s: baton_proto::Stat) -> Self {
        Stat {
            czxid: s.czxid,
            mzxid: s.mzxid,
            pzxid: s.pzxid,
            ctime: s.ctime,
            mtime: s.mtime,
            version: s.version,
            cversion: s.cversion,
            aversion: s.aversion,
            ephemeral_owner: s.ephemeral_owner,
            data_length: s.data_length,
            num_children: s.num_children,
            container: s.container,
            ttl_ms: s.ttl_ms,
        }
    }
}

/// A stat from an optional wire stat (absent: all zero).
pub(crate) fn stat(s: Option<baton_proto::Stat>) -> Stat {
    s.map(Stat::from).unwrap_or_default()
}

/// What a watch fires on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WatchKind {
    /// The node's data changes or the node is deleted (it must exist).
    Data,
    /// The node is created, changed or deleted.
    Exists,
    /// A child is created or deleted, or the node is deleted.
    Children,
    /// The node or any node below it is created, changed or deleted; each
    /// event names the node. Always persistent. After a reconnect it also
    /// reports what it missed, including `NodeChildrenChanged` for a node
    /// whose children changed meanwhile (re-read them: a deleted child
    /// cannot be named).
    Recursive,
    /// One-shot, on a queue node (an ephemeral sequential one): fires
    /// `NodeFirst` when the node is the first of its parent's children in
    /// sequence order (at once if it already is), `NodeDeleted` if it goes.
    /// The lock recipe's pushed grant (docs/protocol.md).
    First,
}

/// How long a watch added by [`crate::Client::watch`] lives (ZooKeeper's
/// `AddWatchMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchMode {
    /// Ends after its first event.
    Once,
    /// Stays until its [`crate::Watcher`] is dropped or the session ends.
    Persistent,
}

impl WatchKind {
    pub(crate) fn to_wire(self) -> baton_proto::WatchKind {
        match self {
            WatchKind::Data => baton_proto::WatchKind::Data,
            WatchKind::Exists => baton_proto::WatchKind::Exists,
            WatchKind::Children => baton_proto::WatchKind::Children,
            WatchKind::Recursive => baton_proto::WatchKind::Recursive,
            WatchKind::First => baton_proto::WatchKind::First,
        }
    }
}

/// What happened to a watched node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventType {
    /// The node was created.
    NodeCreated,
    /// The node was deleted.
    NodeDeleted,
    /// The node's data changed.
    NodeDataChanged,
    /// A child was created or deleted.
    NodeChildrenChanged,
    /// A [`WatchKind::First`] watch's node is first in its queue.
    NodeFirst,
}

impl EventType {
    /// ZooKeeper's name for it (`NODE_CREATED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::NodeCreated => "NODE_CREATED",
            EventType::NodeDeleted => "NODE_DELETED",
            EventType::NodeDataChanged => "NODE_DATA_CHANGED",
            EventType::NodeChildrenChanged => "NODE_CHILDREN_CHANGED",
            EventType::NodeFirst => "NODE_FIRST",
        }
    }

    pub(crate) fn from_wire(t: i32) -> Option<EventType> {
        match baton_proto::EventType::try_from(t).ok()? {
            baton_proto::EventType::NodeCreated => Some(EventType::NodeCreated),
            baton_proto::EventType::NodeDeleted => Some(EventType::NodeDeleted),
            baton_proto::EventType::NodeDataChanged => Some(EventType::NodeDataChanged),
            baton_proto::EventType::NodeChildrenChanged => Some(EventType::NodeChildrenChanged),
            baton_proto::EventType::NodeFirst => Some(EventType::NodeFirst),
            baton_proto::EventType::None => None,
        }
    }
}

/// One change a watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// What happened.
    pub event_type: EventType,
    /// The node it happened to (for a recursive watch, the node below the
    /// watched one that changed).
    pub path: String,
    /// The log index of the change.
    pub zxid: u64,
}

/// The session as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// The cluster vouched for the session recently enough that no leader
    /// can have expired it yet (see [`crate::liveness`]): a lock held is held.
    Connected,
    /// No recent proof (connection lost, the member cut off from the
    /// leader, no leader): the session may still be alive on the servers,
    /// but anything that depends on it (a lock) is in doubt.
    Suspended,
    /// The session is gone: a member said it expired, it was closed, or no
    /// member answered anything for three session timeouts (and nothing
    /// vouched for it for one: [`crate::liveness::GIVE_UP_TIMEOUTS`]). Its
    /// ephemeral nodes are or will be deleted.
    Expired,
}

/// An edge in the session's life, as Curator's `ConnectionStateListener`
/// reports them (see [`crate::Client::connection_events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// Connected for the first time.
    Connected,
    /// Lost the proof of life: what depends on the session is in doubt.
    Suspended,
    /// Connected again after `Suspended`, with the same session: locks and
    /// ephemeral nodes are still held.
    Reconnected,
    /// The session is gone: locks are lost, ephemeral nodes deleted.
    Lost,
    /// A renewing client ([`crate::ClientConfig::renew_session`]) opened a
    /// new session after `expired` expired: nothing of the old one (locks,
    /// leaderships, permits, ephemeral nodes, watches) carries over.
    NewSession {
        /// The id of the session that expired.
        expired: u64,
        /// The new session's id.
        session: u64,
    },
}

/// Options for [`crate::Client::create`], built from
/// [`CreateOptions::persistent`], [`CreateOptions::ephemeral`], ... and the
/// `with_*` methods; the fields can be read, not set from outside.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CreateOptions {
    /// Deleted when the session ends.
    pub ephemeral: bool,
    /// The server appends a 10-digit, per-parent, never-reused counter.
    pub sequential: bool,
    /// Create missing parents (persistent, empty).
    pub parents: bool,
    /// A container node (persistent, not sequential): the cluster deletes
    /// it once it has had a child and has none left (ZooKeeper's
    /// containers; a lock's or a queue's parent).
    pub container: bool,
    /// A TTL node (persistent, may be sequential): the cluster deletes it
    /// once it has no children and its data has not changed for this long.
    /// At most 2^40 - 1 ms.
    pub ttl: Option<Duration>,
}

impl CreateOptions {
    /// A persistent node (the default).
    pub fn persistent() -> Self {
        Self::default()
    }
    /// An ephemeral node.
    pub fn ephemeral() -> Self {
        CreateOptions { ephemeral: true, ..Self::default() }
    }
    /// An ephemeral node with a sequential suffix (a queue entry).
    pub fn ephemeral_sequential() -> Self {
        CreateOptions { ephemeral: true, sequential: true, ..Self::default() }
    }
    /// Also create missing parents.
    pub fn with_parents(mut self) -> Self {
        self.parents = true;
        self
    }
    /// Append a sequential suffix.
    pub fn sequential(mut self) -> Self {
        self.sequential = true;
        self
    }
    /// A container node: deleted by the cluster once its last child goes.
    pub fn container() -> Self {
        CreateOptions { container: true, ..Self::default() }
    }
    /// A TTL node: deleted by the cluster once childless and unchanged for `ttl`.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// One ACL entry: who (`world:anyone`, `user:NAME`, `x509:CN`,
/// `digest:NAME:HASH`, `auth`) may
/// do what (a mask of [`crate::acl::READ`], `WRITE`, `CREATE`, `DELETE`,
/// `ADMIN`). Parse and print them with [`crate::acl`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Acl {
    /// The identity.
    pub id: String,
    /// The permissions, a bit mask.
    pub perms: u32,
}

impl From<baton_proto::Acl> for Acl {
    fn from(a: baton_proto::Acl) -> Self {
        Acl { id: a.id, perms: a.perms }
    }
}

impl Acl {
    pub(crate) fn to_wire(&self) -> baton_proto::Acl {
        baton_proto::Acl { id: self.id.clone(), perms: self.perms }
    }
}

/// One member's status, as it answers it (`baton status`, `/health`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberStatus {
    /// The member's id.
    pub id: u64,
    /// `leader`, `follower`, `candidate` or `pre-candidate`.
    pub role: String,
    /// Its Raft term.
    pub term: u64,
    /// Its commit index.
    pub commit_index: u64,
    /// Its applied index.
    pub applied_index: u64,
    /// The leader it knows of (0: none).
    pub leader_id: u64,
    /// The first log index it still stores (after compaction).
    pub first_index: u64,
    /// Live sessions.
    pub sessions: u64,
    /// Nodes in the tree.
    pub nodes: u64,
    /// Voting members.
    pub voters: Vec<u64>,
    /// Learners (members without a vote).
    pub learners: Vec<u64>,
    /// The cluster's id (empty until a first leader set it).
    pub cluster_id: String,
    /// Members that joined the cluster's record.
    pub joined: Vec<u64>,
    /// Milliseconds since the member started.
    pub uptime_ms: u64,
    /// On-disk size of its store.
    pub db_bytes: u64,
    /// batond's version.
    pub version: String,
    /// It leads, or heard from its leader within an election timeout.
    pub leader_contact: bool,
    /// The cluster-wide settings it follows: the superusers.
    pub superusers: Vec<String>,
    /// The cluster-wide settings it follows: with no superuser, admin
    /// operations are open to every client.
    pub open_admin: bool,
}

impl From<baton_proto::StatusResp> for MemberStatus {
    fn from(s: baton_proto::StatusResp) -> Self {
        MemberStatus {
            id: s.id,
            role: s.role,
            term: s.term,
            commit_index: s.commit_index,
            applied_index: s.applied_index,
            leader_id: s.leader_id,
            first_index: s.first_index,
            sessions: s.sessions,
            nodes: s.nodes,
            voters: s.voters,
            learners: s.learners,
            cluster_id: s.cluster_id,
            joined: s.joined,
            uptime_ms: s.uptime_ms,
            db_bytes: s.db_bytes,
            version: s.version,
            leader_contact: s.leader_contact,
            superusers: s.settings.as_ref().map(|x| x.superusers.clone()).unwrap_or_default(),
            open_admin: s.settings.as_ref().is_some_and(|x| x.open_admin),
        }
    }
}

impl MemberStatus {
    /// The health rule (`baton_proto::health`: a leader in contact, and
    /// applied within 1,000 entries of the commit index); `Err` says why not.
    pub fn healthy(&self) -> Result<(), String> {
        let wire = baton_proto::StatusResp {
            id: self.id,
            role: self.role.clone(),
            term: self.term,
            commit_index: self.commit_index,
            applied_index: self.applied_index,
            leader_id: self.leader_id,
            leader_contact: self.leader_contact,
            ..Default::default()
        };
        baton_proto::health(&wire)
    }
}
