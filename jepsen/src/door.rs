//! The doors a client comes through: the native protocol (`baton-client`),
//! the ZooKeeper port (the `zookeeper-client` crate, a real ZooKeeper
//! client with its own session state machine and timeouts), or `baton
//! lock` / `baton elect` processes (cli_door.rs: the lock, election and
//! read-write lock workloads, the ones through which a client holds).
//! Every workload runs through [`DoorClient`], so every check and every
//! nemesis of `baton-jepsen test` runs through each door (`--door`).
//!
//! Through the ZooKeeper door the workloads use ZooKeeper's own recipes,
//! as Curator and kazoo users do:
//! - lock and election: an ephemeral sequential node under the recipe's
//!   folder, named with the session id (a create whose answer was lost is
//!   found again), an exists-watch on the node just ahead until it is the
//!   lowest; the token is the node's czxid (on Baton, the Raft index that
//!   created it: the same fencing token as the native recipe's). A wait
//!   that gives up deletes its node; if that fails the error is not
//!   `TimedOut`, so the worker retires the session (and the node with it).
//! - read-write lock: Curator's `InterProcessReadWriteLock` recipe, nodes
//!   `<session>-__READ__` and `<session>-__WRIT__` with a sequence in one
//!   queue; a read hold waits (exists-watch) for the nearest writer ahead,
//!   a write hold for its predecessor.
//! - the lock's fence: a multi of `check` on the holder's lock node and
//!   the write (ZooKeeper's fence: the write applies only while the lock
//!   node exists, i.e. while no later holder can have been granted).
//! - linearizable reads: `sync` then `getData` (`--zk-reads sync`, the
//!   default), or plain `getData` on members started with
//!   `--zk-linearizable-reads` (`linearizable`); `local` is plain
//!   `getData` on default members, a control that is not linearizable
//!   under partitions. "Stale" reads are plain
//!   local reads; persistent watches are `addWatch`.
//! - session states: `SyncConnected` is `Connected`, `Disconnected` is
//!   `Suspended`, and `Expired`, `Closed` and `AuthFailed` are `Expired`,
//!   recorded from the client's own state events, so
//!   `holder-connected-after-expiry` judges what a ZooKeeper application
//!   would believe.
//!
//! Errors: a ZooKeeper write that failed in a way the server did not
//! answer about the write itself may have happened
//! ([`write_surely_failed`]); every ZooKeeper call is bounded by
//! [`ZK_OP_TIMEOUT`] (a timed-out write may have happened).
//!
//! Shared with `baton-bench` (its ZooKeeper target and its zk-register
//! test, which use this crate, never the reverse): [`ZkReads`],
//! [`write_surely_failed`], [`persistent`] and [`ensure_path`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::{Client, Op, SessionState, WatchKind};
use serde_json::json;
use tokio::sync::watch;
use zookeeper_client as zk;
use zookeeper_client::{Acls, CreateMode, CreateOptions};

use crate::cli_door::{CliClient, CliHold};
use crate::record::OpError;

/// Bound on one ZooKeeper call (the native client's op timeout is 5 s).
pub const ZK_OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the ZooKeeper door's recipes keep their queues.
const ZK_LOCKS: &str = "/jepsen/zk-locks";
const ZK_ELECTIONS: &str = "/jepsen/zk-elections";
const ZK_RWLOCKS: &str = "/jepsen/zk-rwlocks";
const ZK_SEMAPHORES: &str = "/jepsen/zk-semaphores";
/// Curator's `InterProcessReadWriteLock` node names: a writer is a node
/// whose name holds `__WRIT__`.
const ZK_READ: &str = "__READ__";
const ZK_WRITE: &str = "__WRIT__";

/// Whose turn a queue node waits for.
#[derive(Clone, Copy)]
enum Turn {
    /// The lowest node (a lock, a candidate, a write hold).
    First,
    /// No writer ahead (a read hold).
    Read,
}

/// How reads go through the ZooKeeper port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ZkReads {
    /// `sync` then `getData`, default members.
    Sync,
    /// Plain `getData`, members started with `--zk-linearizable-reads`.
    Linearizable,
    /// Plain `getData`, default members: sequentially consistent only (a
    /// control; not linearizable under `partition`).
    Local,
}

impl ZkReads {
    pub fn name(self) -> &'static str {
        match self {
            ZkReads::Sync => "sync",
            ZkReads::Linearizable => "linearizable",
            ZkReads::Local => "local",
        }
    }
}

/// True when a write that failed with `e` was surely not applied: the
/// server answered about the write itself. Anything else (a connection
/// loss, a timeout, an expired session, an I/O error, a code the client
/// does not know) may have happened.
pub fn write_surely_failed(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::NoNode
            | zk::Error::NodeExists
            | zk::Error::BadVersion
            | zk::Error::NotEmpty
            | zk::Error::NoAuth
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::InvalidAcl
            | zk::Error::BadArguments(_)
            | zk::Error::Unimplemented
            | zk::Error::RuntimeInconsistent
    )
}

/// Persistent, open to anyone: how the recipes' folders are created.
pub fn persistent() -> CreateOptions<'static> {
    CreateMode::Persistent.with_acls(Acls::anyone_all())
}

/// Creates `path` and its missing parents (persistent, empty).
pub async fn ensure_path(c: &zk::Client, path: &str) -> Result<(), zk::Error> {
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        match c.create(&at, &[], &persistent()).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Which door a run's workload clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Door {
    /// The native protocol (`baton-client`).
    Native,
    /// The ZooKeeper port, through the `zookeeper-client` crate.
    Zookeeper,
    /// `baton lock` and `baton elect` processes (cli_door.rs): the lock
    /// and election workloads.
    Cli,
}

impl Door {
    pub fn name(self) -> &'static str {
        match self {
            Door::Native => "native",
            Door::Zookeeper => "zookeeper",
            Door::Cli => "cli",
        }
    }
}

/// One workload client: one session through one door.
#[derive(Clone)]
pub enum DoorClient {
    Native(Client),
    Zk(Arc<ZkSession>),
    Cli(Arc<CliClient>),
}

/// What a CLI client cannot do: it only holds (cli_door.rs).
fn cli_only() -> OpError {
    OpError::Cli("the CLI door only locks and campaigns".into())
}

/// A ZooKeeper session and its state as a `SessionState` channel.
pub struct ZkSession {
    /// Taken out (and so dropped, which closes the session) by `close`.
    client: Mutex<Option<zk::Client>>,
    sid: u64,
    state: watch::Receiver<SessionState>,
    /// Linearizable reads are `sync` + `getData` (else plain `getData`,
    /// on members with `--zk-linearizable-reads`, or the `local` control).
    sync_reads: bool,
}

/// A ZooKeeper error as the recorder's: ambiguous for a `write` unless
/// the server answered about the write itself.
fn zk_err(e: zk::Error, write: bool) -> OpError {
    let ambiguous = write && !write_surely_failed(&e);
    OpError::Zk { error: format!("zookeeper: {e}"), ambiguous }
}

fn zk_timeout(write: bool) -> OpError {
    OpError::Zk { error: "zookeeper: no answer in 5 s".into(), ambiguous: write }
}

/// The session state a ZooKeeper client state stands for (module doc).
fn zk_state(s: zk::SessionState) -> SessionState {
    match s {
        zk::SessionState::SyncConnected => SessionState::Connected,
        zk::SessionState::Disconnected | zk::SessionState::ConnectedReadOnly => SessionState::Suspended,
        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed => SessionState::Expired,
    }
}

/// The 10-digit sequence ZooKeeper appended to a sequential node's name.
fn sequence(name: &str) -> &str {
    &name[name.len().saturating_sub(10)..]
}

impl ZkSession {
    /// A session through `endpoints` (the crate picks the member).
    pub async fn connect(endpoints: &[String], session: Duration, sync_reads: bool) -> anyhow::Result<Arc<ZkSession>> {
        let c = tokio::time::timeout(
            ZK_OP_TIMEOUT,
            zk::Client::connector()
                .with_session_timeout(session)
                .with_connection_timeout(session / 2)
                .connect(&endpoints.join(",")),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no ZooKeeper session in 5 s"))??;
        let sid = c.session_id().0 as u64;
        let mut sw = c.state_watcher();
        let (tx, rx) = watch::channel(zk_state(sw.state()));
        // Forwards the client's state events; holds only the state
        // watcher, never the session.
        tokio::spawn(async move {
            loop {
                let s = zk_state(sw.changed().await);
                if tx.send(s).is_err() || s == SessionState::Expired {
                    return;
                }
            }
        });
        Ok(Arc::new(ZkSession { client: Mutex::new(Some(c)), sid, state: rx, sync_reads }))
    }

    fn client(&self) -> Result<zk::Client, OpError> {
        self.client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| OpError::Zk { error: "zookeeper: session closed".into(), ambiguous: false })
    }

    /// Runs one call, bounded by [`ZK_OP_TIMEOUT`].
    async fn call<T>(
        &self,
        write: bool,
        f: impl AsyncFnOnce(zk::Client) -> Result<T, zk::Error>,
    ) -> Result<T, OpError> {
        self.raw(write, f).await?.map_err(|e| zk_err(e, write))
    }

    /// [`ZkSession::call`] with the client's own error kept.
    async fn raw<T>(
        &self,
        write: bool,
        f: impl AsyncFnOnce(zk::Client) -> Result<T, zk::Error>,
    ) -> Result<Result<T, zk::Error>, OpError> {
        let c = self.client()?;
        tokio::time::timeout(ZK_OP_TIMEOUT, f(c)).await.map_err(|_| zk_timeout(write))
    }

    /// Closes the session: its ephemerals go at once. Ok once the client
    /// reports it closed.
    async fn close(&self) -> Result<(), OpError> {
        let c = self.client.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(c) = c else { return Ok(()) };
        let mut sw = c.state_watcher();
        drop(c);
        let closed = async {
            while !sw.state().is_terminated() {
                sw.changed().await;
            }
        };
        tokio::time::timeout(ZK_OP_TIMEOUT, closed).await.map_err(|_| OpError::Unconfirmed("close not confirmed"))
    }

    /// Creates this session's node in queue `dir` (data `value`), named
    /// `<session>-<tag>` and a sequence; returns its path and czxid. A lost
    /// answer is looked for by name.
    async fn enqueue(&self, dir: &str, tag: &str, value: &[u8]) -> Result<(String, u64), OpError> {
        let prefix = format!("{dir}/{:x}-{tag}", self.sid);
        let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        for attempt in 0..3 {
            let r = self.raw(true, async |c| c.create(&prefix, value, &opts).await).await;
            match r {
                Ok(Ok((stat, seq))) => return Ok((format!("{prefix}{seq}"), stat.czxid as u64)),
                Ok(Err(zk::Error::NoNode)) if attempt < 2 => {
                    self.call(true, async |c| ensure_path(&c, dir).await).await?;
                }
                Ok(Err(e)) if attempt < 2 && !write_surely_failed(&e) && !e.to_string().contains("expired") => {
                    if let Some(found) = self.find_own(dir, tag).await? {
                        return Ok(found);
                    }
                }
                Err(_) if attempt < 2 => {
                    if let Some(found) = self.find_own(dir, tag).await? {
                        return Ok(found);
                    }
                }
                Ok(Err(e)) => return Err(zk_err(e, true)),
                Err(e) => return Err(e),
            }
        }
        Err(OpError::Zk { error: "could not create the queue node".into(), ambiguous: false })
    }

    async fn find_own(&self, dir: &str, tag: &str) -> Result<Option<(String, u64)>, OpError> {
        let kids = self.call(false, async |c| c.list_children(dir).await).await?;
        let own = format!("{:x}-{tag}", self.sid);
        for k in kids.iter().filter(|k| k.starts_with(&own)) {
            let path = format!("{dir}/{k}");
            if let Some(s) = self.call(false, async |c| c.check_stat(&path).await).await? {
                return Ok(Some((path, s.czxid as u64)));
            }
        }
        Ok(None)
    }

    /// Waits until `path` is the lowest node of `dir` (`turn` [`Turn::First`]),
    /// or for a read hold until no writer is ahead of it (Curator's read
    /// lock, [`Turn::Read`]), watching the node it waits for.
    async fn wait_first(&self, dir: &str, path: &str, turn: Turn) -> Result<(), OpError> {
        let mine = path.rsplit('/').next().unwrap_or_default();
        loop {
            let mut kids = self.call(false, async |c| c.list_children(dir).await).await?;
            kids.sort_by(|a, b| sequence(a).cmp(sequence(b)));
            let Some(pos) = kids.iter().position(|k| k == mine) else {
                return Err(OpError::Zk { error: "queue node vanished (session expired)".into(), ambiguous: false });
            };
            let blocker = match turn {
                Turn::First => pos.checked_sub(1).map(|i| &kids[i]),
                Turn::Read => kids[..pos].iter().rev().find(|k| k.contains(ZK_WRITE)),
            };
            let Some(blocker) = blocker else { return Ok(()) };
            let ahead = format!("{dir}/{blocker}");
            let (stat, w) = self.call(false, async |c| c.check_and_watch_stat(&ahead).await).await?;
            if stat.is_some() {
                let ev = w.changed().await;
                if ev.event_type == zk::EventType::Session && ev.session_state.is_terminated() {
                    return Err(OpError::Zk { error: format!("zookeeper: {:?}", ev.session_state), ambiguous: false });
                }
            }
        }
    }

    /// Queues in `dir` for up to `wait`: the node's path and czxid once
    /// first, None (node deleted) when the wait ran out.
    async fn queue(&self, dir: &str, value: &[u8], wait: Duration) -> Result<Option<(String, u64)>, OpError> {
        self.queue_as(dir, "n-", Turn::First, value, wait).await
    }

    /// [`ZkSession::queue`] with the node named `tag` and waiting for
    /// `turn` (a read-write lock's holds).
    async fn queue_as(
        &self,
        dir: &str,
        tag: &str,
        turn: Turn,
        value: &[u8],
        wait: Duration,
    ) -> Result<Option<(String, u64)>, OpError> {
        let (path, czxid) = self.enqueue(dir, tag, value).await?;
        match tokio::time::timeout(wait, self.wait_first(dir, &path, turn)).await {
            Ok(Ok(())) => Ok(Some((path, czxid))),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                // Give the place up; if that fails the caller retires the
                // session, which removes the node.
                self.delete(&path).await?;
                Ok(None)
            }
        }
    }

    /// Curator's `InterProcessSemaphoreV2` at `dir` with `permits`: take
    /// the mutex at `dir/locks`, create a lease in `dir/leases`, wait
    /// (watching the leases) until at most `permits` exist, release the
    /// mutex. The lease's path and czxid; None when `wait` ran out (the
    /// lease, if made, deleted).
    async fn semaphore(&self, dir: &str, permits: usize, wait: Duration) -> Result<Option<(String, u64)>, OpError> {
        let deadline = tokio::time::Instant::now() + wait;
        let Some((mutex, _)) = self.queue(&format!("{dir}/locks"), &[], wait).await? else { return Ok(None) };
        let leases = format!("{dir}/leases");
        let leased = async {
            let (path, czxid) = self.enqueue(&leases, "lease-", &[]).await?;
            let mine = path.rsplit('/').next().unwrap_or_default().to_string();
            loop {
                let (kids, w) = self.call(false, async |c| c.list_and_watch_children(&leases).await).await?;
                if !kids.contains(&mine) {
                    let error = "lease vanished (session expired)".into();
                    return Err(OpError::Zk { error, ambiguous: false });
                }
                if kids.len() <= permits {
                    return Ok(Some((path, czxid)));
                }
                match tokio::time::timeout_at(deadline, w.changed()).await {
                    Ok(ev) if ev.event_type == zk::EventType::Session && ev.session_state.is_terminated() => {
                        let error = format!("zookeeper: {:?}", ev.session_state);
                        return Err(OpError::Zk { error, ambiguous: false });
                    }
                    Ok(_) => {}
                    Err(_) => {
                        self.delete(&path).await?;
                        return Ok(None);
                    }
                }
            }
        }
        .await;
        // The next acquirer may go. If this fails the caller retires the
        // session, which removes the mutex node (and any lease).
        self.delete(&mutex).await?;
        leased
    }

    async fn delete(&self, path: &str) -> Result<(), OpError> {
        match self.raw(true, async |c| c.delete(path, None).await).await? {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(zk_err(e, true)),
        }
    }
}

/// A held lock (its fence and its release).
pub enum DoorLock {
    Native(baton_client::LockGuard),
    NativeRw(baton_client::RwGuard),
    NativePermit(baton_client::Permit),
    Zk { s: Arc<ZkSession>, path: String, token: u64 },
    Cli(CliHold),
}

/// What a fenced write needs of its lock: the token (native fence), and
/// the lock node (ZooKeeper's fence).
#[derive(Debug, Clone)]
pub struct Fence {
    pub token: u64,
    pub node: Option<String>,
}

impl DoorLock {
    pub fn token(&self) -> u64 {
        match self {
            DoorLock::Native(g) => g.fencing_token(),
            DoorLock::NativeRw(g) => g.fencing_token(),
            DoorLock::NativePermit(g) => g.fencing_token(),
            DoorLock::Zk { token, .. } => *token,
            DoorLock::Cli(h) => h.token(),
        }
    }

    pub fn fence(&self) -> Fence {
        match self {
            DoorLock::Native(g) => Fence { token: g.fencing_token(), node: None },
            DoorLock::NativeRw(g) => Fence { token: g.fencing_token(), node: None },
            DoorLock::NativePermit(g) => Fence { token: g.fencing_token(), node: None },
            DoorLock::Zk { path, token, .. } => Fence { token: *token, node: Some(path.clone()) },
            DoorLock::Cli(h) => Fence { token: h.token(), node: None },
        }
    }

    pub async fn release(self) -> Result<(), OpError> {
        match self {
            DoorLock::Native(g) => Ok(g.release().await?),
            DoorLock::NativeRw(g) => Ok(g.release().await?),
            DoorLock::NativePermit(g) => Ok(g.release().await?),
            DoorLock::Zk { s, path, .. } => s.delete(&path).await,
            DoorLock::Cli(h) => h.release().await,
        }
    }
}

/// Leadership won by `campaign`.
pub enum DoorLeadership {
    Native(baton_client::Leadership),
    Zk { s: Arc<ZkSession>, path: String, token: u64 },
    Cli(CliHold),
}

impl DoorLeadership {
    pub fn token(&self) -> u64 {
        match self {
            DoorLeadership::Native(l) => l.fencing_token(),
            DoorLeadership::Zk { token, .. } => *token,
            DoorLeadership::Cli(h) => h.token(),
        }
    }

    /// True while the session is `Connected` (what kazoo's and Curator's
    /// election tell their leader).
    pub fn is_leader(&self) -> bool {
        match self {
            DoorLeadership::Native(l) => l.is_leader(),
            DoorLeadership::Zk { s, .. } => *s.state.borrow() == SessionState::Connected,
            DoorLeadership::Cli(h) => h.holds(),
        }
    }

    pub async fn resign(self) -> Result<(), OpError> {
        match self {
            DoorLeadership::Native(l) => Ok(l.resign().await?),
            DoorLeadership::Zk { s, path, .. } => s.delete(&path).await,
            DoorLeadership::Cli(h) => h.release().await,
        }
    }
}

/// Leader changes of one election.
pub enum DoorObserver {
    Native(baton_client::Observer),
    Zk { s: Arc<ZkSession>, dir: String, last: Option<Option<u64>> },
}

impl DoorObserver {
    /// The next leader's token (None: no leader); None when the
    /// observation ended (session trouble).
    pub async fn next(&mut self) -> Option<Option<u64>> {
        match self {
            DoorObserver::Native(o) => o.next().await.map(|l| l.map(|l| l.fencing_token)),
            DoorObserver::Zk { s, dir, last } => loop {
                let (mut kids, w) = s.call(false, async |c| c.list_and_watch_children(dir).await).await.ok()?;
                kids.sort_by(|a, b| sequence(a).cmp(sequence(b)));
                let now = match kids.first() {
                    None => None,
                    Some(k) => {
                        let path = format!("{dir}/{k}");
                        match s.call(false, async |c| c.check_stat(&path).await).await.ok()? {
                            Some(st) => Some(st.czxid as u64),
                            None => continue, // gone meanwhile: look again
                        }
                    }
                };
                if *last != Some(now) {
                    *last = Some(now);
                    return Some(now);
                }
                let ev = w.changed().await;
                if ev.event_type == zk::EventType::Session {
                    return None;
                }
            },
        }
    }
}

/// One watch (a one-shot exists-watch, or a persistent one kept only to
/// be dropped).
pub enum DoorWatcher {
    Native(baton_client::Watcher),
    ZkOnce(Option<zk::OneshotWatcher>),
    ZkPersistent(zk::PersistentWatcher),
}

/// A node event: path, zxid, ZooKeeper's type name.
pub struct DoorEvent {
    pub path: String,
    pub zxid: i64,
    pub kind: &'static str,
}

fn zk_event_name(t: zk::EventType) -> &'static str {
    match t {
        zk::EventType::NodeCreated => "NODE_CREATED",
        zk::EventType::NodeDeleted => "NODE_DELETED",
        zk::EventType::NodeDataChanged => "NODE_DATA_CHANGED",
        zk::EventType::NodeChildrenChanged => "NODE_CHILDREN_CHANGED",
        zk::EventType::Session => "SESSION",
    }
}

/// A ZooKeeper node event as the workloads record it (None: a session
/// event, not a node's).
fn zk_event(e: zk::WatchedEvent) -> Option<DoorEvent> {
    (e.event_type != zk::EventType::Session).then(|| DoorEvent {
        path: e.path,
        zxid: e.zxid,
        kind: zk_event_name(e.event_type),
    })
}

impl DoorWatcher {
    /// The next node event (None: none will come).
    pub async fn next(&mut self) -> Option<DoorEvent> {
        match self {
            DoorWatcher::Native(w) => {
                let e = w.next().await?;
                Some(DoorEvent { path: e.path, zxid: e.zxid as i64, kind: e.event_type.as_str() })
            }
            DoorWatcher::ZkOnce(w) => zk_event(w.take()?.changed().await),
            DoorWatcher::ZkPersistent(w) => zk_event(w.changed().await),
        }
    }
}

impl DoorClient {
    pub fn session_id(&self) -> u64 {
        match self {
            DoorClient::Native(c) => c.session_id(),
            DoorClient::Zk(s) => s.sid,
            DoorClient::Cli(c) => c.session_id(),
        }
    }

    /// The session's state, as the client sees it (module doc).
    pub fn state(&self) -> watch::Receiver<SessionState> {
        match self {
            DoorClient::Native(c) => c.state(),
            DoorClient::Zk(s) => s.state.clone(),
            DoorClient::Cli(c) => c.state(),
        }
    }

    pub fn is_expired(&self) -> bool {
        *self.state().borrow() == SessionState::Expired
    }

    /// The member this client talks to, as that member says (native
    /// only: a ZooKeeper client cannot ask).
    pub async fn member(&self) -> Option<u64> {
        match self {
            DoorClient::Native(c) => c.status().await.ok().map(|s| s.id),
            DoorClient::Zk(_) | DoorClient::Cli(_) => None,
        }
    }

    pub async fn close(&self) -> Result<(), OpError> {
        match self {
            DoorClient::Native(c) => Ok(c.close().await?),
            DoorClient::Zk(s) => s.close().await,
            DoorClient::Cli(c) => {
                c.close();
                Ok(())
            }
        }
    }

    /// Linearizable read: data and version.
    pub async fn get(&self, path: &str) -> Result<(Vec<u8>, i32), OpError> {
        match self {
            DoorClient::Native(c) => {
                let (d, s) = c.get(path).await?;
                Ok((d.to_vec(), s.version))
            }
            DoorClient::Zk(s) => {
                if s.sync_reads {
                    s.call(false, async |c| c.sync(path).await).await?;
                }
                let (d, st) = s.call(false, async |c| c.get_data(path).await).await?;
                Ok((d, st.version))
            }
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }

    /// Writes `data` (at `version`, if given); returns the new version.
    pub async fn set(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<i32, OpError> {
        match self {
            DoorClient::Native(c) => Ok(c.set(path, data.to_vec(), version).await?.version),
            DoorClient::Zk(s) => Ok(s.call(true, async |c| c.set_data(path, data, version).await).await?.version),
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }

    /// True if `e` says the session expired (the process needs a new one).
    pub fn session_gone(e: &OpError) -> bool {
        match e {
            OpError::Client(baton_client::Error::SessionExpired) => true,
            OpError::Zk { error, .. } => {
                error.contains("session expired") || error.contains("session closed") || error.contains("been closed")
            }
            _ => false,
        }
    }

    /// Waits up to `wait` for lock `name`: `TimedOut` when the wait ran
    /// out (and this client's place was given up).
    pub async fn lock(&self, name: &str, wait: Duration) -> Result<DoorLock, OpError> {
        match self {
            DoorClient::Native(c) => {
                c.lock_with_timeout(name, wait).await?.map(DoorLock::Native).ok_or(OpError::TimedOut)
            }
            DoorClient::Zk(s) => match s.queue(&format!("{ZK_LOCKS}/{name}"), &[], wait).await? {
                Some((path, token)) => Ok(DoorLock::Zk { s: s.clone(), path, token }),
                None => Err(OpError::TimedOut),
            },
            DoorClient::Cli(c) => Ok(DoorLock::Cli(c.lock(name, wait).await?)),
        }
    }

    /// Waits up to `wait` for a read hold (`write` false) or the write
    /// hold of read-write lock `name`: `TimedOut` when the wait ran out
    /// (and the place was given up). Native: `read_lock`/`write_lock`;
    /// ZooKeeper: Curator's `InterProcessReadWriteLock` recipe; CLI:
    /// `baton lock NAME --shared|--write`.
    pub async fn rw_lock(&self, name: &str, write: bool, wait: Duration) -> Result<DoorLock, OpError> {
        match self {
            DoorClient::Native(c) => {
                let hold = async {
                    if write {
                        c.write_lock(name).await
                    } else {
                        c.read_lock(name).await
                    }
                };
                match tokio::time::timeout(wait, hold).await {
                    Ok(g) => Ok(DoorLock::NativeRw(g?)),
                    Err(_) => Err(OpError::TimedOut),
                }
            }
            DoorClient::Zk(s) => {
                let (tag, turn) = if write { (ZK_WRITE, Turn::First) } else { (ZK_READ, Turn::Read) };
                match s.queue_as(&format!("{ZK_RWLOCKS}/{name}"), tag, turn, &[], wait).await? {
                    Some((path, token)) => Ok(DoorLock::Zk { s: s.clone(), path, token }),
                    None => Err(OpError::TimedOut),
                }
            }
            DoorClient::Cli(c) => Ok(DoorLock::Cli(c.rw_lock(name, write, wait).await?)),
        }
    }

    /// Waits up to `wait` for a permit of semaphore `name` of `permits`:
    /// `TimedOut` when the wait ran out (and the place was given up).
    /// Native: `semaphore(name, permits)`; ZooKeeper: Curator's
    /// `InterProcessSemaphoreV2` recipe ([`ZkSession::semaphore`]); CLI:
    /// `baton lock NAME --limit N`.
    pub async fn semaphore(&self, name: &str, permits: usize, wait: Duration) -> Result<DoorLock, OpError> {
        match self {
            DoorClient::Native(c) => c
                .semaphore(name, permits)
                .acquire_with_timeout(wait)
                .await?
                .map(DoorLock::NativePermit)
                .ok_or(OpError::TimedOut),
            DoorClient::Zk(s) => match s.semaphore(&format!("{ZK_SEMAPHORES}/{name}"), permits, wait).await? {
                Some((path, token)) => Ok(DoorLock::Zk { s: s.clone(), path, token }),
                None => Err(OpError::TimedOut),
            },
            DoorClient::Cli(c) => Ok(DoorLock::Cli(c.semaphore(name, permits, wait).await?)),
        }
    }

    /// Writes `data` to `path` only while `fence` holds (native: the
    /// fence `resource` accepts the token; ZooKeeper: the lock node
    /// exists), atomically; returns the write's mzxid.
    pub async fn fenced_set(&self, fence: &Fence, resource: &str, path: &str, data: &[u8]) -> Result<u64, OpError> {
        match self {
            DoorClient::Native(c) => {
                let ops = [
                    Op::CheckFence { resource: resource.into(), token: fence.token },
                    Op::Set { path: path.into(), data: data.to_vec().into(), version: None },
                ];
                let r = c.multi(&ops).await?;
                Ok(r.get(1).and_then(|x| x.stat.as_ref()).map(|s| s.mzxid).unwrap_or(0))
            }
            DoorClient::Zk(s) => {
                let Some(node) = fence.node.as_deref() else {
                    return Err(OpError::Zk { error: "no lock node to fence with".into(), ambiguous: false });
                };
                let c = s.client()?;
                let mut w = c.new_multi_writer();
                w.add_check_version(node, -1).map_err(|e| zk_err(e, false))?;
                w.add_set_data(path, data, None).map_err(|e| zk_err(e, false))?;
                match tokio::time::timeout(ZK_OP_TIMEOUT, w.commit()).await {
                    Err(_) => Err(zk_timeout(true)),
                    Ok(Ok(r)) => Ok(match r.get(1) {
                        Some(zk::MultiWriteResult::SetData { stat }) => stat.mzxid as u64,
                        _ => 0,
                    }),
                    Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, source })) => Err(OpError::Zk {
                        error: format!("fence refused: lock node {node}: {source}"),
                        ambiguous: false,
                    }),
                    Ok(Err(zk::MultiWriteError::OperationFailed { source, .. }))
                    | Ok(Err(zk::MultiWriteError::RequestFailed { source })) => Err(zk_err(source, true)),
                }
            }
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }

    /// Campaigns in election `name` with `value` for up to `wait`
    /// (`TimedOut` when it ran out and the candidacy was withdrawn).
    pub async fn campaign(&self, name: &str, value: String, wait: Duration) -> Result<DoorLeadership, OpError> {
        match self {
            DoorClient::Native(c) => match tokio::time::timeout(wait, c.campaign(name, value)).await {
                Ok(l) => Ok(DoorLeadership::Native(l?)),
                Err(_) => Err(OpError::TimedOut),
            },
            DoorClient::Zk(s) => match s.queue(&format!("{ZK_ELECTIONS}/{name}"), value.as_bytes(), wait).await? {
                Some((path, token)) => Ok(DoorLeadership::Zk { s: s.clone(), path, token }),
                None => Err(OpError::TimedOut),
            },
            DoorClient::Cli(c) => Ok(DoorLeadership::Cli(c.campaign(name, &value, wait).await?)),
        }
    }

    /// Leader changes of election `name`: the current leader, then every
    /// change.
    pub async fn observe(&self, name: &str) -> Result<DoorObserver, OpError> {
        match self {
            DoorClient::Native(c) => Ok(DoorObserver::Native(c.observe(name).await?)),
            DoorClient::Zk(s) => {
                let dir = format!("{ZK_ELECTIONS}/{name}");
                s.call(true, async |c| ensure_path(&c, &dir).await).await?;
                Ok(DoorObserver::Zk { s: s.clone(), dir, last: None })
            }
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }

    /// Creates ephemeral node `path`; returns its czxid.
    pub async fn create_ephemeral(&self, path: &str) -> Result<u64, OpError> {
        match self {
            DoorClient::Native(c) => {
                let (_, s) = c.create(path, "", baton_client::CreateOptions::ephemeral()).await?;
                Ok(s.czxid)
            }
            DoorClient::Zk(s) => {
                let opts = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
                Ok(s.call(true, async |c| c.create(path, &[], &opts).await).await?.0.czxid as u64)
            }
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }

    /// Whether `path` exists (native: linearizable; ZooKeeper: an
    /// ordinary read, which sees this session's own writes).
    pub async fn exists(&self, path: &str) -> Result<bool, OpError> {
        match self {
            DoorClient::Native(c) => Ok(c.exists(path).await?.is_some()),
            DoorClient::Zk(s) => Ok(s.call(false, async |c| c.check_stat(path).await).await?.is_some()),
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }

    /// An exists-watch on `path` (`stale`: the member's own state, native
    /// only; ZooKeeper's reads are always the member's).
    pub async fn exists_watch(&self, path: &str, stale: bool) -> Result<(bool, DoorWatcher), OpError> {
        match self {
            DoorClient::Native(c) => {
                let (s, w) = c.exists_watch_opts(path, stale).await?;
                Ok((s.is_some(), DoorWatcher::Native(w)))
            }
            DoorClient::Zk(s) => {
                let (st, w) = s.call(false, async |c| c.check_and_watch_stat(path).await).await?;
                Ok((st.is_some(), DoorWatcher::ZkOnce(Some(w))))
            }
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }

    /// A read from the member's own state: (version, mzxid).
    pub async fn stale_get(&self, path: &str) -> Result<serde_json::Value, OpError> {
        let (version, mzxid) = match self {
            DoorClient::Native(c) => {
                let (_, s) = c.get_opts(path, true).await?;
                (s.version, s.mzxid as i64)
            }
            DoorClient::Zk(s) => {
                let (_, st) = s.call(false, async |c| c.get_data(path).await).await?;
                (st.version, st.mzxid)
            }
            DoorClient::Cli(_) => return Err(cli_only()),
        };
        Ok(json!({"version": version, "mzxid": mzxid}))
    }

    /// Children of `path` from the member's own state (their count).
    pub async fn stale_children(&self, path: &str) -> Result<usize, OpError> {
        match self {
            DoorClient::Native(c) => Ok(c.children_opts(path, true).await?.0.len()),
            DoorClient::Zk(s) => Ok(s.call(false, async |c| c.list_children(path).await).await?.len()),
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }

    /// A persistent watch on `path` (ZooKeeper: `addWatch`, recursive for
    /// `Children`).
    pub async fn watch_persistent(&self, path: &str, kind: WatchKind) -> Result<DoorWatcher, OpError> {
        match self {
            DoorClient::Native(c) => {
                Ok(DoorWatcher::Native(c.watch(path, kind, baton_client::WatchMode::Persistent).await?))
            }
            DoorClient::Zk(s) => {
                let mode = match kind {
                    WatchKind::Children => zk::AddWatchMode::PersistentRecursive,
                    _ => zk::AddWatchMode::Persistent,
                };
                Ok(DoorWatcher::ZkPersistent(s.call(false, async |c| c.watch(path, mode).await).await?))
            }
            DoorClient::Cli(_) => Err(cli_only()),
        }
    }
}

/// Makes sure the ZooKeeper door's recipe folders exist (through any
/// ZooKeeper session), so a queue's create never races a parent's.
pub async fn zk_setup(endpoints: &[String], session: Duration) -> anyhow::Result<()> {
    let s = ZkSession::connect(endpoints, session, true).await?;
    for dir in [ZK_LOCKS, ZK_ELECTIONS, ZK_RWLOCKS] {
        s.call(true, async |c| ensure_path(&c, dir).await).await.map_err(|e| anyhow::anyhow!("setup {dir}: {e}"))?;
    }
    let _ = s.close().await;
    Ok(())
}
