//! Async Rust client for Baton.
//!
//! A [`Client`] holds one session on a cluster. It talks to one member at a
//! time; when that connection breaks it moves to the next endpoint and
//! resumes the *same* session, re-registering its watches with the last log
//! index it saw so that no change is missed. Its state (Connected /
//! Suspended / Expired) is a `tokio::sync::watch` channel, and its edges
//! (Suspended, Reconnected, Lost) a stream, like Curator's connection
//! states.
//!
//! Errors tell a definite failure from an ambiguous one: [`Error::is_ambiguous`]
//! is true only when a write may have happened although the call failed (it
//! was sent and no answer came in time, or the answer was `TIMEOUT` or
//! `LEADER_CHANGED`, or a resent write was answered `SESSION_EXPIRED` or
//! `STALE_SEQUENCE`). Writes carry `(session, sequence number)`; the client
//! retries a write after a lost connection or a leader change with the same
//! number and the server answers a retry with the original result
//! (exactly-once), so most transient faults never reach the caller.
//!
//! # Example
//!
//! The one in README.md (`scripts/check-docs.sh` checks that the two are
//! the same), compiled by `cargo test --doc`:
//!
//! ```no_run
//! use baton_client::{Client, CreateOptions, Op};
//!
//! #[tokio::main]
//! async fn main() -> baton_client::Result<()> {
//!     let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]).await?;
//!
//!     // An ephemeral sequential node: deleted when this session ends.
//!     let eph = CreateOptions::ephemeral_sequential().with_parents();
//!     let (path, stat) = client.create("/workers/w-", "host-a", eph).await?;
//!     println!("created {path}, its fencing token is {}", stat.czxid);
//!
//!     // Read a node and watch it for its next change.
//!     let (data, _stat, mut watch) = client.get_watch(&path).await?;
//!     println!("{path} holds {:?}", data);
//!     client.set(&path, "host-a, busy", None).await?;
//!     if let Some(event) = watch.next().await {
//!         println!("{:?} on {} at index {}", event.event_type, event.path, event.zxid);
//!     }
//!
//!     // A lock, and a write fenced by its token: refused if a later holder
//!     // of the lock has written to "billing" already.
//!     let guard = client.lock("nightly-billing").await?;
//!     let write = Op::Set { path: path.clone(), data: "billed".into(), version: None };
//!     guard.fenced("billing", &[write]).await?;
//!     guard.release().await?;
//!
//!     // Leader election.
//!     let lead = client.campaign("scheduler", "host-a").await?;
//!     println!("leading scheduler with token {}", lead.fencing_token());
//!     lead.resign().await?;
//!
//!     client.close().await
//! }
//! ```
//!
//! # Calls and their errors
//! `Client::call` (every operation goes through it) refuses data over
//! 1 MiB before sending (`ErrorKind::TooLarge`), holds one of
//! [`MAX_WRITES_IN_FLIGHT`] slots for a write, hands the request to the
//! session actor (session.rs: ids, `seq`, resends, deadlines), and maps
//! its final answer: `OK` to success, `SESSION_EXPIRED` to
//! [`Error::SessionExpired`], `NO_AUTH` to [`Error::NoAuth`], an ambiguous
//! code (`TIMEOUT`, `LEADER_CHANGED`, `INTERNAL`) on a write to
//! [`Error::Ambiguous`], anything else to [`Error::Server`] with its
//! [`ErrorKind`] (match with [`Error::kind`] or `is_no_node()`, ...). The actor
//! itself returns `Ambiguous`, `Unavailable` or `SessionExpired` when no
//! usable answer came (session.rs, "Answers and retries").
//!
//! # Watches
//! `get_watch`, `exists_watch` and `children_watch` register a one-shot
//! watch with their (linearizable) read; [`Client::watch`] registers one,
//! one-shot or persistent, with a linearizable `exists` read, so no change
//! can fall between reading and watching; [`WatchKind::Recursive`] watches
//! a whole subtree. Each returns a [`Watcher`], a `futures::Stream`: it
//! yields events and ends once a one-shot watch fired, the session expired
//! or its bounded buffer overflowed ([`Watcher::end_reason`] says which;
//! watcher.rs has the rules). The actor re-registers every live watch when
//! it attaches to another member. Dropping a `Watcher` forgets the watch
//! and, if the server still holds it, sends `remove_watch`.
//!
//! # Errors, transactions, a namespace
//!
//! ```no_run
//! use baton_client::{Client, CreateOptions};
//!
//! # async fn demo() -> baton_client::Result<()> {
//! let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102"]).await?;
//! match client.create("/config", "v1", CreateOptions::persistent()).await {
//!     Err(e) if e.is_node_exists() => {}
//!     other => { other?; }
//! }
//! let lock = client.lock("jobs").await?;
//! client.txn().check_fence("jobs", lock.fencing_token()).set("/config", "v2", None).commit().await?;
//! lock.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - this file: [`Client`] and its node operations.
//! - [`config`]: [`ClientConfig`], TLS, the [`RetryPolicy`].
//! - [`error`]: [`Error`] and [`ErrorKind`].
//! - [`types`]: [`Stat`], [`WatchEvent`], [`SessionState`], [`Acl`],
//!   [`MemberStatus`], ...: the client's own types, never the wire's (a
//!   protocol or prost change does not change this API).
//! - [`acl`]: parsing and printing ACL entries.
//! - [`watcher`]: [`Watcher`], a stream of events.
//! - [`txn`]: [`Op`] and the [`Txn`] builder.
//! - [`namespace`]: the chroot rule.
//! - `session.rs`: the actor task that owns the connection.
//! - `renew.rs`: a new session after expiry, when asked for (the rules).
//! - [`liveness`]: when the client may say `Connected` (the rule).
//! - [`recipes`]: locks, elections, read-write locks, semaphores, a tree
//!   cache, a leader selector.
//! - [`admin`]: sessionless operator calls (members, status, health).
//! - [`reader`]: sessionless reads ([`Reader`]: what `baton get`, `ls` and
//!   `stat` use).

#![warn(missing_docs)]

pub mod acl;
pub mod admin;
pub mod config;
pub mod error;
pub mod liveness;
pub mod namespace;
pub mod reader;
pub mod recipes;
mod renew;
mod session;
pub mod txn;
pub mod types;
pub mod watcher;

pub use config::{ClientConfig, ClientTls, RetryPolicy, DEFAULT_OP_TIMEOUT};
pub use error::{Error, ErrorKind, Result};
pub use reader::Reader;
pub use recipes::{
    CacheEvent, CachedNode, LeaderInfo, LeaderSelector, LeaderTerm, Leadership, LockGuard, Observer, Permit, RwGuard,
    Semaphore, TreeCache,
};
pub use txn::{Op, OpResult, Txn};
pub use types::{
    Acl, ConnectionEvent, CreateOptions, EventType, MemberStatus, SessionState, Stat, WatchEvent, WatchKind, WatchMode,
};
pub use watcher::{WatchEnd, Watcher};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::{
    op, request, response, AddUserOp, DeleteOp, MultiOp, ReadReq, RemoveUserOp, Request, Response, SetAclOp, SetOp,
    WatchSpec,
};
use bytes::Bytes;
use tokio::sync::{broadcast, oneshot, watch};

use recipes::queue::Place;
use renew::Session;
use session::Cmd;
use txn::create_op;
use types::stat;

/// Writes one client may have unanswered at once: well under the server's
/// per-session reply cache (4,096), so a retry always finds its reply.
pub const MAX_WRITES_IN_FLIGHT: usize = 1024;
pub use liveness::KEEPALIVE_FRACTION;

/// A Baton client with one session at a time (a new one after expiry only
/// with [`ClientConfig::renew_session`]: renew.rs). Cheap to clone and
/// meant to be shared by tasks; the session closes when the last clone is
/// dropped (or on [`Client::close`]).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
    /// Set on the clients recipes keep: every call goes to the session
    /// that took the lock (or leadership, or permit), never a later one.
    pinned: Option<Arc<Session>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("session_id", &format_args!("{:#x}", self.session_id()))
            .field("state", &*self.state().borrow())
            .field("timeout", &self.session_timeout())
            .finish()
    }
}

pub(crate) struct Inner {
    /// The session calls go to (replaced after an expiry when renewing).
    current: std::sync::RwLock<Arc<Session>>,
    /// Set by [`Client::close`]: never open a new session after it.
    closed: AtomicBool,
    /// Opens a new session after expiry ([`ClientConfig::renew_session`]).
    renew: bool,
    /// Recipe names held or awaited, each with the task that holds or
    /// waits (recipes are not reentrant: a second acquire by the same task
    /// is refused; other tasks queue: recipes/lock.rs).
    pub(crate) held: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Bounds writes in flight (see [`MAX_WRITES_IN_FLIGHT`]); a slot is
    /// held by the session actor until it is done with the write, even if
    /// the caller stopped waiting.
    write_slots: Arc<tokio::sync::Semaphore>,
    /// The client's state: the session's, or (renewing) a copy of the
    /// current session's kept by renew.rs.
    state: watch::Receiver<SessionState>,
    /// Every session's edges, and `NewSession`.
    edges: broadcast::Sender<ConnectionEvent>,
    next_watch: AtomicU64,
    watch_buffer: usize,
    op_timeout: Duration,
}

impl Inner {
    pub(crate) fn current(&self) -> Arc<Session> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Connection edges as they happen (see [`Client::connection_events`]).
#[derive(Debug)]
pub struct ConnectionEvents {
    rx: broadcast::Receiver<ConnectionEvent>,
}

impl ConnectionEvents {
    /// The next edge, or `None` once the session is over and every edge
    /// was read. Edges missed by a reader that fell 64 behind are skipped.
    pub async fn next(&mut self) -> Option<ConnectionEvent> {
        loop {
            match self.rx.recv().await {
                Ok(e) => return Some(e),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Client {
    /// Connects to any of `endpoints` and creates a session with defaults.
    pub async fn connect(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Result<Client> {
        Self::connect_with(ClientConfig::new(endpoints)).await
    }

    /// Connects with `cfg` and creates a session. A malformed endpoint
    /// (not `HOST:PORT`) fails at once; when no member answers in
    /// `op_timeout`, the error names every endpoint tried and why.
    pub async fn connect_with(cfg: ClientConfig) -> Result<Client> {
        if cfg.endpoints.is_empty() {
            return Err(Error::Invalid("no endpoints".into()));
        }
        for e in &cfg.endpoints {
            check_endpoint(e)?;
        }
        let (op_timeout, watch_buffer, renew) = (cfg.op_timeout, cfg.watch_buffer, cfg.renew_session);
        let (edges, _) = broadcast::channel(64);
        let first = Session::from(session::start(cfg.clone(), edges.clone()).await?);
        let (state, keeper) = match renew {
            false => (first.state.clone(), None),
            true => {
                let (tx, rx) = watch::channel(*first.state.borrow());
                (rx, Some(tx))
            }
        };
        let inner = Arc::new(Inner {
            current: std::sync::RwLock::new(Arc::new(first)),
            closed: AtomicBool::new(false),
            renew,
            held: Default::default(),
            write_slots: Arc::new(tokio::sync::Semaphore::new(MAX_WRITES_IN_FLIGHT)),
            state,
            edges: edges.clone(),
            next_watch: AtomicU64::new(1),
            watch_buffer,
            op_timeout,
        });
        if let Some(tx) = keeper {
            tokio::spawn(renew::keep(Arc::downgrade(&inner), cfg, tx, edges));
        }
        Ok(Client { inner, pinned: None })
    }

    /// The session calls go to: the pinned one, or the current one.
    fn session(&self) -> Arc<Session> {
        match &self.pinned {
            Some(s) => s.clone(),
            None => self.inner.current(),
        }
    }

    /// Waits until a renewing client has replaced session `after` with a
    /// new one (true), or never will: the client does not renew, or was
    /// closed or dropped (false).
    pub(crate) async fn next_session(&self, after: u64) -> bool {
        let mut st = self.inner.state.clone();
        loop {
            if self.inner.closed.load(Ordering::SeqCst) || !self.inner.renew {
                return false;
            }
            if self.inner.current().id != after {
                return true;
            }
            if st.changed().await.is_err() {
                return self.inner.current().id != after;
            }
        }
    }

    /// This client bound to its current session for good (renew.rs: what
    /// a session took stays bound to it).
    pub(crate) fn pinned(&self) -> Client {
        Client { inner: self.inner.clone(), pinned: Some(self.session()) }
    }

    /// The session's id (the `ephemeral_owner` of its ephemeral nodes). It
    /// changes when a renewing client opens a new session.
    pub fn session_id(&self) -> u64 {
        self.session().id
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.session().timeout
    }

    /// The session's state, as a watch channel. With
    /// [`ClientConfig::renew_session`], `Expired` is followed by the new
    /// session's states.
    pub fn state(&self) -> watch::Receiver<SessionState> {
        match &self.pinned {
            Some(s) => s.state.clone(),
            None => self.inner.state.clone(),
        }
    }

    /// Every edge of the session's state from now on: `Suspended`,
    /// `Reconnected` (the same session is proven alive again: what it held
    /// is still held), `Lost` (Curator's `ConnectionStateListener`).
    pub fn connection_events(&self) -> ConnectionEvents {
        ConnectionEvents { rx: self.inner.edges.subscribe() }
    }

    /// A transaction builder: `client.txn().check(..).set(..).commit()`.
    pub fn txn(&self) -> Txn<'_> {
        Txn::new(self)
    }

    /// The last log index this client has seen in any reply or event.
    pub async fn last_zxid(&self) -> u64 {
        let (tx, rx) = oneshot::channel();
        if self.session().cmds.send(Cmd::LastZxid(tx)).await.is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
    }

    /// The moment from which another session may hold what this one holds
    /// (a lock, leadership), as far as this client knows: two thirds of the
    /// session timeout after the send of the last keepalive the cluster
    /// vouched for, the moment the client leaves `Connected` on its own
    /// ([`liveness`]). No leader commits the expiry before a whole timeout
    /// after that send on its clock; the third between is what lets clocks
    /// run up to 10% apart (docs/guarantees.md, "The margin") and leaves
    /// time to stop. A whole timeout on this client's clock could end after
    /// the expiry, so nothing waits that long.
    pub async fn may_be_lost_at(&self) -> std::time::Instant {
        let (tx, rx) = oneshot::channel();
        let now = std::time::Instant::now();
        let session = self.session();
        if session.cmds.send(Cmd::ConnectedUntil(tx)).await.is_err() {
            return now;
        }
        rx.await.unwrap_or(now)
    }

    async fn call(&self, body: request::Body) -> Result<Response> {
        self.call_as(body, 0).await
    }

    /// [`Client::call`]; a create with `first_watch_id` also asks for its
    /// node's place in its queue and a FIRST watch on it.
    async fn call_as(&self, body: request::Body, first_watch_id: u64) -> Result<Response> {
        if let Some(n) = data_len(&body) {
            if n > baton_proto::MAX_DATA {
                // Definite: never sent (the server would refuse it too).
                let message = format!("data is {n} bytes, over {}", baton_proto::MAX_DATA);
                return Err(Error::server(ErrorKind::TooLarge, message));
            }
        }
        let is_write = matches!(
            body,
            request::Body::Create(_)
                | request::Body::Set(_)
                | request::Body::Delete(_)
                | request::Body::Multi(_)
                | request::Body::CloseSession(_)
                | request::Body::SetAcl(_)
                | request::Body::AddUser(_)
                | request::Body::RemoveUser(_)
                | request::Body::ResetFence(_)
                | request::Body::SetSettings(_)
        );
        // Exactly-once holds for as many unanswered writes as the server
        // caches replies for; never have more in flight than that. The slot
        // travels with the write to the actor, which keeps it until it stops
        // retrying: dropping this future does not free it (finding S5).
        let slot = if is_write {
            Some(self.inner.write_slots.clone().acquire_owned().await.map_err(|_| Error::Closed)?)
        } else {
            None
        };
        let (tx, rx) = oneshot::channel();
        let req = Request { body: Some(body), first_watch_id, ..Default::default() };
        self.session()
            .cmds
            .send(Cmd::Call { req, is_write, reply: tx, timeout: self.inner.op_timeout, slot })
            .await
            .map_err(|_| Error::Closed)?;
        let resp = rx.await.map_err(|_| Error::Closed)??;
        let code = baton_proto::ErrorCode::try_from(resp.error).unwrap_or(baton_proto::ErrorCode::Internal);
        match ErrorKind::from_code(code) {
            None => Ok(resp),
            Some(ErrorKind::SessionExpired) => Err(Error::SessionExpired),
            Some(ErrorKind::NoAuth) => Err(Error::NoAuth(resp.message)),
            Some(_) if code.is_ambiguous() && is_write => Err(Error::Ambiguous(format!("{code:?}: {}", resp.message))),
            Some(kind) => Err(Error::Server { kind, message: resp.message }),
        }
    }

    /// Creates a node; returns its path (with the sequential suffix) and stat.
    pub async fn create(&self, path: &str, data: impl Into<Bytes>, options: CreateOptions) -> Result<(String, Stat)> {
        let resp = self.call(request::Body::Create(create_op(path, data.into(), options))).await?;
        match resp.body {
            Some(response::Body::Create(c)) => Ok((c.path, stat(c.stat))),
            _ => Err(Error::unexpected()),
        }
    }

    /// Creates a queue node (ephemeral sequential, as the recipes do) and
    /// learns its place: first in its parent's queue, or behind another with
    /// a FIRST watch that fires when it becomes first (the pushed grant,
    /// docs/protocol.md), or not known (ask with [`Client::watch_first`]).
    pub(crate) async fn create_queued(
        &self,
        path: &str,
        data: Bytes,
        options: CreateOptions,
    ) -> Result<(String, Stat, Place)> {
        let (spec, w) = self.new_watch_as(path, WatchKind::First, false, true).await?;
        let resp = self.call_as(request::Body::Create(create_op(path, data, options)), spec.watch_id).await?;
        match resp.body {
            Some(response::Body::Create(c)) => {
                let place = match (c.first, c.first_watch_set) {
                    (true, _) => Place::First,
                    (false, true) => Place::Behind(w),
                    (false, false) => Place::Unknown,
                };
                Ok((c.path, stat(c.stat), place))
            }
            _ => Err(Error::unexpected()),
        }
    }

    /// Sets a FIRST watch on queue node `path` (fires `NodeFirst` when it is
    /// first among its siblings, at once if it is; `NodeDeleted` if it
    /// goes), against the member's local state: a state that holds the
    /// node holds every node ahead of it (recipes/queue.rs).
    pub(crate) async fn watch_first(&self, path: &str) -> Result<Watcher> {
        let (spec, w) = self.new_watch(path, WatchKind::First, false).await?;
        self.call(request::Body::Exists(Self::read(path, true, Some(spec.clone())))).await?;
        self.watch_seen(spec.watch_id, true).await;
        Ok(w)
    }

    /// Creates a node with an ACL (`acl::parse("user:alice:rwcda")`; an
    /// empty list inherits the parent's, as [`Client::create`] does).
    pub async fn create_with_acl(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        options: CreateOptions,
        acl: Vec<Acl>,
    ) -> Result<(String, Stat)> {
        let mut op = create_op(path, data.into(), options);
        op.acl = acl.iter().map(Acl::to_wire).collect();
        let resp = self.call(request::Body::Create(op)).await?;
        match resp.body {
            Some(response::Body::Create(c)) => Ok((c.path, stat(c.stat))),
            _ => Err(Error::unexpected()),
        }
    }

    /// A node's ACL and stat (needs READ).
    pub async fn get_acl(&self, path: &str) -> Result<(Vec<Acl>, Stat)> {
        let resp = self.call(request::Body::GetAcl(Self::read(path, false, None))).await?;
        match resp.body {
            Some(response::Body::Acl(a)) => Ok((a.acl.into_iter().map(Acl::from).collect(), stat(a.stat))),
            _ => Err(Error::unexpected()),
        }
    }

    /// Replaces a node's ACL (needs ADMIN), if its ACL version is `version`.
    pub async fn set_acl(&self, path: &str, acl: Vec<Acl>, version: Option<i32>) -> Result<Stat> {
        let acl = acl.iter().map(Acl::to_wire).collect();
        let resp = self.call(request::Body::SetAcl(SetAclOp { path: path.to_string(), acl, version })).await?;
        match resp.body {
            Some(response::Body::Set(s)) => Ok(stat(s.stat)),
            _ => Err(Error::unexpected()),
        }
    }

    /// Adds a password user (superusers only). The password is hashed here
    /// (`baton_proto::auth`); the cluster never sees it.
    pub async fn add_user(&self, name: &str, password: &str) -> Result<()> {
        let salt = baton_proto::auth::new_salt().map_err(Error::Invalid)?;
        let hash = baton_proto::auth::hash_password(password, &salt);
        let op = AddUserOp { name: name.to_string(), salt: salt.to_vec().into(), hash: hash.into() };
        self.call(request::Body::AddUser(op)).await.map(|_| ())
    }

    /// Forgets fence `resource`'s highest token (superusers only): the way
    /// out of a fence jammed by a bad token. Every member logs it.
    pub async fn reset_fence(&self, resource: &str) -> Result<()> {
        let op = baton_proto::ResetFenceOp { resource: resource.to_string() };
        self.call(request::Body::ResetFence(op)).await.map(|_| ())
    }

    /// Replaces the cluster-wide settings (superusers only; server
    /// settings.rs): the superusers, and whether admin operations are open
    /// to every client when there is none. Refused if they leave no admin.
    pub async fn set_settings(&self, superusers: Vec<String>, open_admin: bool) -> Result<()> {
        let op = baton_proto::SetSettingsOp { settings: Some(baton_proto::ClusterSettings { superusers, open_admin }) };
        self.call(request::Body::SetSettings(op)).await.map(|_| ())
    }

    /// Removes a password user (superusers only).
    pub async fn remove_user(&self, name: &str) -> Result<()> {
        self.call(request::Body::RemoveUser(RemoveUserOp { name: name.to_string() })).await.map(|_| ())
    }

    /// Password users (superusers only).
    pub async fn list_users(&self) -> Result<Vec<String>> {
        names_body(self.call(request::Body::ListUsers(Default::default())).await?)
    }

    /// This connection's identities (`world:anyone`, `x509:..`, `user:..`).
    pub async fn whoami(&self) -> Result<Vec<String>> {
        names_body(self.call(request::Body::Whoami(Default::default())).await?)
    }

    /// Sets a node's data, if its version is `version` (any when `None`).
    pub async fn set(&self, path: &str, data: impl Into<Bytes>, version: Option<i32>) -> Result<Stat> {
        let resp = self.call(request::Body::Set(SetOp { path: path.to_string(), data: data.into(), version })).await?;
        match resp.body {
            Some(response::Body::Set(s)) => Ok(stat(s.stat)),
            _ => Err(Error::unexpected()),
        }
    }

    /// Deletes a node, if its version is `version` (any when `None`).
    pub async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        self.call(request::Body::Delete(DeleteOp { path: path.to_string(), version })).await.map(|_| ())
    }

    /// Runs `ops` atomically: all succeed or none is applied. On failure the
    /// error names the failing op (`multi op #i failed: ...`).
    pub async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        let ops = ops.iter().map(Op::to_proto).collect();
        let resp = self.call(request::Body::Multi(MultiOp { ops })).await?;
        match resp.body {
            Some(response::Body::Multi(m)) => {
                Ok(m.results.into_iter().map(|r| OpResult { path: r.path, stat: r.stat.map(Stat::from) }).collect())
            }
            _ => Err(Error::unexpected()),
        }
    }

    fn read(path: &str, stale: bool, watch: Option<WatchSpec>) -> ReadReq {
        ReadReq { path: path.to_string(), stale, watch }
    }

    /// Linearizable read of a node's data and stat.
    pub async fn get(&self, path: &str) -> Result<(Bytes, Stat)> {
        self.get_opts(path, false).await
    }

    /// Read of a node; with `stale`, served from the member's local state
    /// without a ReadIndex round (faster, may lag the leader).
    pub async fn get_opts(&self, path: &str, stale: bool) -> Result<(Bytes, Stat)> {
        let resp = self.call(request::Body::Get(Self::read(path, stale, None))).await?;
        get_body(resp)
    }

    /// Linearizable check: the node's stat, or `None` if it does not exist.
    pub async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        let resp = self.call(request::Body::Exists(Self::read(path, false, None))).await?;
        match resp.body {
            Some(response::Body::Exists(e)) => Ok(e.stat.map(Stat::from)),
            _ => Err(Error::unexpected()),
        }
    }

    /// Child names, sorted.
    pub async fn children(&self, path: &str) -> Result<Vec<String>> {
        Ok(self.children_stat(path).await?.0)
    }

    /// Child names, sorted, and the node's stat (linearizable).
    pub async fn children_stat(&self, path: &str) -> Result<(Vec<String>, Stat)> {
        self.children_opts(path, false).await
    }

    /// Children and stat; with `stale`, from the member's local state.
    pub async fn children_opts(&self, path: &str, stale: bool) -> Result<(Vec<String>, Stat)> {
        let resp = self.call(request::Body::Children(Self::read(path, stale, None))).await?;
        children_body(resp)
    }

    /// Registers a watch with the actor; the read that follows carries it
    /// to the server (same queue, so in order).
    async fn new_watch(&self, path: &str, kind: WatchKind, persistent: bool) -> Result<(WatchSpec, Watcher)> {
        self.new_watch_as(path, kind, persistent, false).await
    }

    /// [`Client::new_watch`]; `for_create`: a create's FIRST watch, which
    /// stands on the path the create answers (session.rs).
    async fn new_watch_as(
        &self,
        path: &str,
        kind: WatchKind,
        persistent: bool,
        for_create: bool,
    ) -> Result<(WatchSpec, Watcher)> {
        baton_proto::validate_path(path).map_err(Error::Invalid)?;
        let id = self.inner.next_watch.fetch_add(1, Ordering::Relaxed);
        let session = self.session();
        let (w, events) = Watcher::pair(id, self.inner.watch_buffer, session.cmds.clone());
        let kind = kind.to_wire() as i32;
        let spec = WatchSpec { watch_id: id, path: path.to_string(), kind, persistent, existed: false };
        let cmd = Cmd::NewWatch { spec: spec.clone(), events, for_create };
        session.cmds.send(cmd).await.map_err(|_| Error::Closed)?;
        Ok((spec, w))
    }

    async fn watch_seen(&self, id: u64, existed: bool) {
        let _ = self.session().cmds.send(Cmd::WatchSeen { id, existed }).await;
    }

    /// Reads a node and sets a one-shot data watch (fires on change or delete).
    pub async fn get_watch(&self, path: &str) -> Result<(Bytes, Stat, Watcher)> {
        let (spec, w) = self.new_watch(path, WatchKind::Data, false).await?;
        let resp = self.call(request::Body::Get(Self::read(path, false, Some(spec.clone())))).await?;
        let (data, stat) = get_body(resp)?;
        self.watch_seen(spec.watch_id, true).await;
        Ok((data, stat, w))
    }

    /// Checks a node and sets a one-shot exists watch (fires on create,
    /// change or delete).
    pub async fn exists_watch(&self, path: &str) -> Result<(Option<Stat>, Watcher)> {
        self.exists_watch_opts(path, false).await
    }

    /// [`Client::exists_watch`]; with `stale`, registered against the
    /// member's local state without a ReadIndex round.
    pub async fn exists_watch_opts(&self, path: &str, stale: bool) -> Result<(Option<Stat>, Watcher)> {
        let (spec, w) = self.new_watch(path, WatchKind::Exists, false).await?;
        let resp = self.call(request::Body::Exists(Self::read(path, stale, Some(spec.clone())))).await?;
        let stat = match resp.body {
            Some(response::Body::Exists(e)) => e.stat.map(Stat::from),
            _ => return Err(Error::unexpected()),
        };
        self.watch_seen(spec.watch_id, stat.is_some()).await;
        Ok((stat, w))
    }

    /// Lists children and sets a one-shot children watch.
    pub async fn children_watch(&self, path: &str) -> Result<(Vec<String>, Stat, Watcher)> {
        let (spec, w) = self.new_watch(path, WatchKind::Children, false).await?;
        let resp = self.call(request::Body::Children(Self::read(path, false, Some(spec.clone())))).await?;
        let (c, s) = children_body(resp)?;
        self.watch_seen(spec.watch_id, true).await;
        Ok((c, s, w))
    }

    /// Adds a watch of `kind` on `path` without reading; with
    /// [`WatchMode::Persistent`] it stays after it fires (a
    /// [`WatchKind::Recursive`] watch always does).
    pub async fn watch(&self, path: &str, kind: WatchKind, mode: WatchMode) -> Result<Watcher> {
        let persistent = mode == WatchMode::Persistent;
        // Registered by a linearizable exists read that carries the watch:
        // the server adds it at exactly the state the read reflects, so no
        // change can fall between reading and watching.
        let (spec, w) = self.new_watch(path, kind, persistent).await?;
        let resp = self.call(request::Body::Exists(Self::read(path, false, Some(spec.clone())))).await?;
        let existed = matches!(resp.body, Some(response::Body::Exists(baton_proto::ExistsResp { stat: Some(_) })));
        self.watch_seen(spec.watch_id, existed).await;
        Ok(w)
    }

    /// Status of the member this client is connected to.
    pub async fn status(&self) -> Result<MemberStatus> {
        let resp = self.call(request::Body::Status(Default::default())).await?;
        match resp.body {
            Some(response::Body::Status(s)) => Ok(s.into()),
            _ => Err(Error::unexpected()),
        }
    }

    /// Closes the session (its ephemeral nodes are deleted) and the client
    /// (a renewing client opens no new session after it).
    pub async fn close(&self) -> Result<()> {
        self.inner.closed.store(true, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        self.session().cmds.send(Cmd::Close(Some(tx))).await.map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }
}

fn data_len(body: &request::Body) -> Option<usize> {
    match body {
        request::Body::Create(c) => Some(c.data.len()),
        request::Body::Set(s) => Some(s.data.len()),
        request::Body::Multi(m) => m
            .ops
            .iter()
            .map(|o| match &o.op {
                Some(op::Op::Create(c)) => c.data.len(),
                Some(op::Op::Set(s)) => s.data.len(),
                _ => 0,
            })
            .max(),
        _ => None,
    }
}

fn names_body(resp: Response) -> Result<Vec<String>> {
    match resp.body {
        Some(response::Body::Names(n)) => Ok(n.names),
        _ => Err(Error::unexpected()),
    }
}

fn get_body(resp: Response) -> Result<(Bytes, Stat)> {
    match resp.body {
        Some(response::Body::Get(g)) => Ok((g.data, stat(g.stat))),
        _ => Err(Error::unexpected()),
    }
}

fn children_body(resp: Response) -> Result<(Vec<String>, Stat)> {
    match resp.body {
        Some(response::Body::Children(c)) => Ok((c.children, stat(c.stat))),
        _ => Err(Error::unexpected()),
    }
}

/// Asks one member for its status, without a session.
pub async fn member_status(endpoint: &str, timeout: Duration) -> Result<MemberStatus> {
    member_status_with(endpoint, timeout, None).await
}

/// [`member_status`] over TLS when `tls` is given.
pub async fn member_status_with(endpoint: &str, timeout: Duration, tls: Option<&ClientTls>) -> Result<MemberStatus> {
    let resp = session::one_shot(endpoint, request::Body::Status(Default::default()), timeout, tls, None).await?;
    match resp.body {
        Some(response::Body::Status(s)) => Ok(s.into()),
        _ => Err(Error::Server {
            kind: ErrorKind::from_wire(resp.error).unwrap_or(ErrorKind::Internal),
            message: resp.message,
        }),
    }
}

/// The local cluster `batond cluster` starts by default.
pub const DEFAULT_ENDPOINTS: &str = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";

/// Splits `a,b,c`.
pub fn parse_endpoints(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|e| !e.is_empty()).map(String::from).collect()
}

/// Checks that `endpoint` is `HOST:PORT` (a name, an IPv4 address, or an
/// IPv6 address in brackets) with a port from 1 to 65535.
pub fn check_endpoint(endpoint: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::Invalid(format!("endpoint {endpoint:?}: {why} (want HOST:PORT)")));
    let Some((host, port)) = endpoint.rsplit_once(':') else { return bad("no port") };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return bad("bad port"),
    }
    let ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && !host.contains([':', '/', ' ']),
    };
    if !ok {
        return bad("bad host (an IPv6 address goes in brackets)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_endpoint;

    #[test]
    fn endpoints_are_host_colon_port() {
        for ok in ["127.0.0.1:7101", "localhost:1", "db-1.example.com:65535", "[::1]:7101"] {
            assert!(check_endpoint(ok).is_ok(), "{ok}");
        }
        for bad in ["127.0.0.1", "host:0", "host:70000", ":7101", "host:port", "a b:1", "::1:7101", "http://x:1"] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }
}
