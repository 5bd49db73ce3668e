//! Async Rust client for Baton.
//!
//! A [`Client`] holds one session on a cluster. It talks to one member at a
//! time; when that connection breaks it moves to the next endpoint and
//! resumes the *same* session, re-registering its watches with the last log
//! index it saw so that no change is missed. Its state (Connected /
//! Suspended / Expired) is a `tokio::sync::watch` channel, like Curator's
//! connection states.
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
//!         println!("{:?} on {} at index {}", event.r#type(), event.path, event.zxid);
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
//!     println!("leading scheduler with token {}", lead.token());
//!     lead.resign().await?;
//!
//!     client.close().await
//! }
//! ```
//!
//! # Calls and their errors
//! `Client::call` (every operation goes through it) refuses data over
//! 1 MiB before sending (`Error::Server { code: TOO_LARGE }`), holds one of
//! [`MAX_WRITES_IN_FLIGHT`] slots for a write, hands the request to the
//! session actor (session.rs: ids, `seq`, resends, deadlines), and maps
//! its final answer: `OK` to success, `SESSION_EXPIRED` to
//! [`Error::SessionExpired`], `NO_AUTH` to [`Error::NoAuth`], an ambiguous
//! code (`TIMEOUT`, `LEADER_CHANGED`, `INTERNAL`) on a write to
//! [`Error::Ambiguous`], anything else to [`Error::Server`]. The actor
//! itself returns `Ambiguous`, `Unavailable` or `SessionExpired` when no
//! usable answer came (session.rs, "Answers and retries").
//!
//! # Watches
//! `get_watch`, `exists_watch` and `children_watch` register a one-shot
//! watch with their (linearizable) read; [`Client::watch`] registers one,
//! one-shot or persistent, with a linearizable `exists` read, so no change
//! can fall between reading and watching. Each returns a [`Watcher`]:
//! `next` yields events and returns `None` once a one-shot watch fired or
//! the session expired. The actor re-registers every live watch when it
//! attaches to another member. Dropping a `Watcher` forgets the watch and,
//! if the server still holds it, sends `remove_watch`.
//!
//! # Layout
//! - this file: the public API ([`Client`], [`Watcher`], [`Error`]).
//! - `session.rs`: the actor task that owns the connection.
//! - [`liveness`]: when the client may say `Connected` (the rule).
//! - [`recipes`]: locks, elections, read-write locks, semaphores.
//! - [`admin`]: sessionless operator calls (members, status, health).

pub mod admin;
pub mod liveness;
pub mod recipes;
mod session;

pub use recipes::{LeaderInfo, Leadership, LockGuard, Observer, Permit, RwGuard};

use std::sync::Arc;
use std::time::Duration;

pub use baton_proto::{acl, Acl, ErrorCode, EventType, Stat, StatusResp, WatchEvent, WatchKind};
use baton_proto::{
    op, request, response, AddUserOp, CheckFenceOp, CheckOp, CreateOp, DeleteOp, MultiOp, ReadReq, RemoveUserOp,
    Request, Response, SetAclOp, SetOp, WatchSpec,
};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

use session::Cmd;

/// Default client-side deadline for one operation.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(15);
/// Writes one client may have unanswered at once: well under the server's
/// per-session reply cache (4,096), so a retry always finds its reply.
pub const MAX_WRITES_IN_FLIGHT: usize = 1024;
pub use liveness::KEEPALIVE_FRACTION;

/// The session as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// The cluster vouched for the session recently enough that no leader
    /// can have expired it yet (see [`liveness`]): a lock held is held.
    Connected,
    /// No recent proof (connection lost, the member cut off from the
    /// leader, no leader): the session may still be alive on the servers,
    /// but anything that depends on it (a lock) is in doubt.
    Suspended,
    /// The session is gone: a member said it expired, it was closed, or no
    /// member answered anything for three session timeouts (and nothing
    /// vouched for it for one: [`liveness::GIVE_UP_TIMEOUTS`]). Its
    /// ephemeral nodes are or will be deleted.
    Expired,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The server refused the request; nothing changed.
    #[error("{code:?}: {message}")]
    Server { code: ErrorCode, message: String },
    /// A write was sent and no answer came in time: it may or may not have
    /// been applied.
    #[error("outcome unknown (the write may have been applied): {0}")]
    Ambiguous(String),
    /// The session expired or was closed; create a new client.
    #[error("session expired")]
    SessionExpired,
    /// No member could serve the request in time; it was not applied.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Bad argument, caught before sending.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The cluster refused this client's identity (no or a wrong TLS
    /// certificate, a plaintext client on a TLS port, an ACL), or this
    /// client refused a member's certificate. Nothing was applied.
    #[error("not authorized: {0}")]
    NoAuth(String),
    /// The client was closed.
    #[error("client closed")]
    Closed,
}

impl Error {
    /// True when the operation may have been applied despite the error.
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, Error::Ambiguous(_))
    }
    /// The server's error code, for definite server errors.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server { code, .. } => Some(*code),
            Error::SessionExpired => Some(ErrorCode::SessionExpired),
            Error::NoAuth(_) => Some(ErrorCode::NoAuth),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of the members' client ports.
    pub endpoints: Vec<String>,
    /// Requested session timeout (the server clamps it to its min/max).
    pub session_timeout: Duration,
    /// Deadline for each operation, retries included.
    pub op_timeout: Duration,
    /// Deadline for one TCP connect + attach to a member.
    pub connect_timeout: Duration,
    /// TLS to the members' client ports (None: plaintext).
    pub tls: Option<ClientTls>,
    /// User and password to `auth` with on every connection (identity
    /// `user:<name>`; see server/src/acl.rs). Use TLS: the password travels.
    pub auth: Option<(String, String)>,
}

/// TLS settings for the client port: the CA that signed the members'
/// certificates and, when members require client certificates, this
/// client's certificate and key (PEM files). A member is verified for the
/// host of its endpoint (a DNS name or an IP address in its certificate).
#[derive(Clone)]
pub struct ClientTls {
    pub(crate) config: Arc<baton_proto::tls::rustls::ClientConfig>,
}

impl ClientTls {
    pub fn load(
        ca: &std::path::Path,
        cert_key: Option<(&std::path::Path, &std::path::Path)>,
    ) -> std::result::Result<Self, baton_proto::tls::TlsError> {
        Ok(ClientTls { config: baton_proto::tls::client_config(ca, cert_key)? })
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientConfig {
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            session_timeout: Duration::from_secs(10),
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: Duration::from_secs(2),
            tls: None,
            auth: None,
        }
    }
    pub fn auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some((user.into(), password.into()));
        self
    }
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }
    pub fn session_timeout(mut self, d: Duration) -> Self {
        self.session_timeout = d;
        self
    }
    pub fn op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }
}

/// Options for [`Client::create`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CreateOptions {
    /// Deleted when the session ends.
    pub ephemeral: bool,
    /// The server appends a 10-digit, per-parent, never-reused counter.
    pub sequential: bool,
    /// Create missing parents (persistent, empty).
    pub parents: bool,
}

impl CreateOptions {
    pub fn persistent() -> Self {
        Self::default()
    }
    pub fn ephemeral() -> Self {
        CreateOptions { ephemeral: true, ..Self::default() }
    }
    pub fn ephemeral_sequential() -> Self {
        CreateOptions { ephemeral: true, sequential: true, ..Self::default() }
    }
    pub fn with_parents(mut self) -> Self {
        self.parents = true;
        self
    }
    pub fn sequential(mut self) -> Self {
        self.sequential = true;
        self
    }
}

/// One operation of a [`Client::multi`].
#[derive(Debug, Clone)]
pub enum Op {
    Create {
        path: String,
        data: Bytes,
        options: CreateOptions,
    },
    Set {
        path: String,
        data: Bytes,
        version: Option<i32>,
    },
    Delete {
        path: String,
        version: Option<i32>,
    },
    /// Fails the multi unless the node exists (at `version`, if given).
    Check {
        path: String,
        version: Option<i32>,
    },
    /// Fails the multi with `FENCE_REJECTED` if a higher token was already
    /// used on `resource`; records `token` otherwise.
    CheckFence {
        resource: String,
        token: u64,
    },
}

impl Op {
    fn to_proto(&self) -> baton_proto::Op {
        let o = match self {
            Op::Create { path, data, options } => op::Op::Create(create_op(path, data.clone(), *options)),
            Op::Set { path, data, version } => {
                op::Op::Set(SetOp { path: path.clone(), data: data.clone(), version: *version })
            }
            Op::Delete { path, version } => op::Op::Delete(DeleteOp { path: path.clone(), version: *version }),
            Op::Check { path, version } => op::Op::Check(CheckOp { path: path.clone(), version: *version }),
            Op::CheckFence { resource, token } => {
                op::Op::CheckFence(CheckFenceOp { resource: resource.clone(), token: *token })
            }
        };
        baton_proto::Op { op: Some(o) }
    }
}

/// The result of one op of a successful multi.
#[derive(Debug, Clone)]
pub struct OpResult {
    /// The created path, for creates.
    pub path: String,
    pub stat: Option<Stat>,
}

fn create_op(path: &str, data: Bytes, o: CreateOptions) -> CreateOp {
    CreateOp {
        path: path.to_string(),
        data,
        ephemeral: o.ephemeral,
        sequential: o.sequential,
        parents: o.parents,
        acl: Vec::new(),
    }
}

/// A stream of watch events. A one-shot watch yields one event and ends; a
/// persistent one runs until dropped or the session expires. Dropping it
/// removes the watch.
pub struct Watcher {
    id: u64,
    rx: mpsc::UnboundedReceiver<WatchEvent>,
    cmds: mpsc::UnboundedSender<Cmd>,
}

impl Watcher {
    /// The next event, or `None` when the watch ended (one-shot fired, or
    /// the session expired).
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::DropWatch(self.id));
    }
}

/// A Baton client with one session. Cheap to clone; the session closes when
/// the last clone is dropped (or on [`Client::close`]).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Recipe names this client holds or waits for (recipes are not
    /// reentrant: a second acquire by the same client is refused).
    pub(crate) held: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Bounds writes in flight (see [`MAX_WRITES_IN_FLIGHT`]); a slot is
    /// held by the session actor until it is done with the write, even if
    /// the caller stopped waiting.
    write_slots: Arc<tokio::sync::Semaphore>,
    state: watch::Receiver<SessionState>,
    session_id: u64,
    timeout: Duration,
    op_timeout: Duration,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Close(None));
    }
}

impl Client {
    /// Connects to any of `endpoints` and creates a session with defaults.
    pub async fn connect(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Result<Client> {
        Self::connect_with(ClientConfig::new(endpoints)).await
    }

    pub async fn connect_with(cfg: ClientConfig) -> Result<Client> {
        if cfg.endpoints.is_empty() {
            return Err(Error::Invalid("no endpoints".into()));
        }
        let op_timeout = cfg.op_timeout;
        let (cmds, state, session_id, timeout) = session::start(cfg).await?;
        Ok(Client {
            inner: Arc::new(Inner {
                cmds,
                held: Default::default(),
                write_slots: Arc::new(tokio::sync::Semaphore::new(MAX_WRITES_IN_FLIGHT)),
                state,
                session_id,
                timeout,
                op_timeout,
            }),
        })
    }

    pub fn session_id(&self) -> u64 {
        self.inner.session_id
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The session's state, as a watch channel.
    pub fn state(&self) -> watch::Receiver<SessionState> {
        self.inner.state.clone()
    }

    /// The last log index this client has seen in any reply or event.
    pub async fn last_zxid(&self) -> u64 {
        let (tx, rx) = oneshot::channel();
        if self.inner.cmds.send(Cmd::LastZxid(tx)).is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
    }

    /// The earliest moment the cluster may have expired this session, as
    /// far as this client knows: one session timeout after the send of the
    /// last keepalive it vouched for ([`liveness`]). Until then a lock this
    /// client holds cannot have gone to anyone else (clocks running at the
    /// same rate); after it, it may have.
    pub async fn may_be_lost_at(&self) -> std::time::Instant {
        let (tx, rx) = oneshot::channel();
        let now = std::time::Instant::now();
        if self.inner.cmds.send(Cmd::Proven(tx)).is_err() {
            return now;
        }
        rx.await.map(|p| p + self.inner.timeout).unwrap_or(now)
    }

    async fn call(&self, body: request::Body) -> Result<Response> {
        if let Some(n) = data_len(&body) {
            if n > baton_proto::MAX_DATA {
                // Definite: never sent (the server would refuse it too).
                return Err(Error::Server {
                    code: ErrorCode::TooLarge,
                    message: format!("data is {n} bytes, over {}", baton_proto::MAX_DATA),
                });
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
        let req = Request { body: Some(body), ..Default::default() };
        self.inner
            .cmds
            .send(Cmd::Call { req, is_write, reply: tx, timeout: self.inner.op_timeout, slot })
            .map_err(|_| Error::Closed)?;
        let resp = rx.await.map_err(|_| Error::Closed)??;
        match ErrorCode::try_from(resp.error).unwrap_or(ErrorCode::Internal) {
            ErrorCode::Ok => Ok(resp),
            ErrorCode::SessionExpired => Err(Error::SessionExpired),
            ErrorCode::NoAuth => Err(Error::NoAuth(resp.message)),
            code if code.is_ambiguous() && is_write => Err(Error::Ambiguous(format!("{code:?}: {}", resp.message))),
            code => Err(Error::Server { code, message: resp.message }),
        }
    }

    /// Creates a node; returns its path (with the sequential suffix) and stat.
    pub async fn create(&self, path: &str, data: impl Into<Bytes>, options: CreateOptions) -> Result<(String, Stat)> {
        let resp = self.call(request::Body::Create(create_op(path, data.into(), options))).await?;
        match resp.body {
            Some(response::Body::Create(c)) => Ok((c.path, c.stat.unwrap_or_default())),
            _ => Err(unexpected()),
        }
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
        op.acl = acl;
        let resp = self.call(request::Body::Create(op)).await?;
        match resp.body {
            Some(response::Body::Create(c)) => Ok((c.path, c.stat.unwrap_or_default())),
            _ => Err(unexpected()),
        }
    }

    /// A node's ACL and stat (needs READ).
    pub async fn get_acl(&self, path: &str) -> Result<(Vec<Acl>, Stat)> {
        let resp = self.call(request::Body::GetAcl(Self::read(path, false, None))).await?;
        match resp.body {
            Some(response::Body::Acl(a)) => Ok((a.acl, a.stat.unwrap_or_default())),
            _ => Err(unexpected()),
        }
    }

    /// Replaces a node's ACL (needs ADMIN), if its ACL version is `version`.
    pub async fn set_acl(&self, path: &str, acl: Vec<Acl>, version: Option<i32>) -> Result<Stat> {
        let resp = self.call(request::Body::SetAcl(SetAclOp { path: path.to_string(), acl, version })).await?;
        match resp.body {
            Some(response::Body::Set(s)) => Ok(s.stat.unwrap_or_default()),
            _ => Err(unexpected()),
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
            Some(response::Body::Set(s)) => Ok(s.stat.unwrap_or_default()),
            _ => Err(unexpected()),
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
                Ok(m.results.into_iter().map(|r| OpResult { path: r.path, stat: r.stat }).collect())
            }
            _ => Err(unexpected()),
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

    pub async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        let resp = self.call(request::Body::Exists(Self::read(path, false, None))).await?;
        match resp.body {
            Some(response::Body::Exists(e)) => Ok(e.stat),
            _ => Err(unexpected()),
        }
    }

    /// Child names, sorted.
    pub async fn children(&self, path: &str) -> Result<Vec<String>> {
        Ok(self.children_stat(path).await?.0)
    }

    pub async fn children_stat(&self, path: &str) -> Result<(Vec<String>, Stat)> {
        self.children_opts(path, false).await
    }

    /// Children and stat; with `stale`, from the member's local state.
    pub async fn children_opts(&self, path: &str, stale: bool) -> Result<(Vec<String>, Stat)> {
        let resp = self.call(request::Body::Children(Self::read(path, stale, None))).await?;
        children_body(resp)
    }

    async fn new_watch(&self, path: &str, kind: WatchKind, persistent: bool) -> Result<(WatchSpec, Watcher)> {
        baton_proto::validate_path(path).map_err(Error::Invalid)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (id_tx, id_rx) = oneshot::channel();
        let spec = WatchSpec { watch_id: 0, path: path.to_string(), kind: kind as i32, persistent, existed: false };
        self.inner.cmds.send(Cmd::NewWatch { spec, events: tx, id: id_tx }).map_err(|_| Error::Closed)?;
        let spec = id_rx.await.map_err(|_| Error::Closed)?;
        let w = Watcher { id: spec.watch_id, rx, cmds: self.inner.cmds.clone() };
        Ok((spec, w))
    }

    /// Reads a node and sets a one-shot data watch (fires on change or delete).
    pub async fn get_watch(&self, path: &str) -> Result<(Bytes, Stat, Watcher)> {
        let (spec, w) = self.new_watch(path, WatchKind::Data, false).await?;
        let resp = self.call(request::Body::Get(Self::read(path, false, Some(spec.clone())))).await?;
        let (data, stat) = get_body(resp)?;
        let _ = self.inner.cmds.send(Cmd::WatchSeen { id: spec.watch_id, existed: true });
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
            Some(response::Body::Exists(e)) => e.stat,
            _ => return Err(unexpected()),
        };
        let _ = self.inner.cmds.send(Cmd::WatchSeen { id: spec.watch_id, existed: stat.is_some() });
        Ok((stat, w))
    }

    /// Lists children and sets a one-shot children watch.
    pub async fn children_watch(&self, path: &str) -> Result<(Vec<String>, Stat, Watcher)> {
        let (spec, w) = self.new_watch(path, WatchKind::Children, false).await?;
        let resp = self.call(request::Body::Children(Self::read(path, false, Some(spec.clone())))).await?;
        let (c, s) = children_body(resp)?;
        let _ = self.inner.cmds.send(Cmd::WatchSeen { id: spec.watch_id, existed: true });
        Ok((c, s, w))
    }

    /// Adds a watch of `kind` on `path` without reading; `persistent` keeps
    /// it after it fires.
    pub async fn watch(&self, path: &str, kind: WatchKind, persistent: bool) -> Result<Watcher> {
        // Registered by a linearizable exists read that carries the watch:
        // the server adds it at exactly the state the read reflects, so no
        // change can fall between reading and watching.
        let (spec, w) = self.new_watch(path, kind, persistent).await?;
        let resp = self.call(request::Body::Exists(Self::read(path, false, Some(spec.clone())))).await?;
        let existed = matches!(resp.body, Some(response::Body::Exists(baton_proto::ExistsResp { stat: Some(_) })));
        let _ = self.inner.cmds.send(Cmd::WatchSeen { id: spec.watch_id, existed });
        Ok(w)
    }

    /// Status of the member this client is connected to.
    pub async fn status(&self) -> Result<StatusResp> {
        let resp = self.call(request::Body::Status(Default::default())).await?;
        match resp.body {
            Some(response::Body::Status(s)) => Ok(s),
            _ => Err(unexpected()),
        }
    }

    /// Closes the session (its ephemeral nodes are deleted) and the client.
    pub async fn close(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.inner.cmds.send(Cmd::Close(Some(tx))).map_err(|_| Error::Closed)?;
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
        _ => Err(unexpected()),
    }
}

fn unexpected() -> Error {
    Error::Server { code: ErrorCode::Internal, message: "unexpected response body".into() }
}

fn get_body(resp: Response) -> Result<(Bytes, Stat)> {
    match resp.body {
        Some(response::Body::Get(g)) => Ok((g.data, g.stat.unwrap_or_default())),
        _ => Err(unexpected()),
    }
}

fn children_body(resp: Response) -> Result<(Vec<String>, Stat)> {
    match resp.body {
        Some(response::Body::Children(c)) => Ok((c.children, c.stat.unwrap_or_default())),
        _ => Err(unexpected()),
    }
}

/// Asks one member for its status, without a session.
pub async fn member_status(endpoint: &str, timeout: Duration) -> Result<StatusResp> {
    member_status_with(endpoint, timeout, None).await
}

/// [`member_status`] over TLS when `tls` is given.
pub async fn member_status_with(endpoint: &str, timeout: Duration, tls: Option<&ClientTls>) -> Result<StatusResp> {
    let resp = session::one_shot(endpoint, request::Body::Status(Default::default()), timeout, tls, None).await?;
    match resp.body {
        Some(response::Body::Status(s)) => Ok(s),
        _ => Err(Error::Server {
            code: ErrorCode::try_from(resp.error).unwrap_or(ErrorCode::Internal),
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
