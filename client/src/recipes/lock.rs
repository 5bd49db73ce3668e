//! A distributed mutex with fencing tokens (ZooKeeper's lock recipe).
//!
//! `lock(name)` creates an ephemeral sequential node under
//! `/_baton/locks/<name>` (created on demand, like MySQL's GET_LOCK); the
//! lock is held once that node is the first of the queue. The grant is
//! pushed: the create's answer says whether the node is first, and if not
//! the member registers a FIRST watch on it that fires when it is, from the
//! entry that made it so (its predecessor's release, or that holder's
//! expiry). A release wakes exactly one waiter, once, and the waiter reads
//! nothing after it; a waiter that leaves from the middle of the queue wakes
//! no one. It is the classic recipe's rule (lowest sequence number holds,
//! checked on the member's applied state) evaluated by the member
//! (server/src/watches.rs, "The pushed grant"). The ZooKeeper port keeps the
//! classic recipe: list the queue, watch the predecessor, list again.
//!
//! Curator's layout: the queue nodes are named as Curator's
//! `InterProcessMutex` names its own (`_c_<uuid>-lock-<seq>`) and ordered
//! by the trailing sequence number alone, so a Curator (or kazoo) client on
//! the ZooKeeper port that locks the same path queues in the same queue:
//! [`Client::mutex`] takes any path, `lock(name)` is the lock at
//! `/_baton/locks/<name>` (docs/zookeeper.md, "Recipes that interoperate").
//!
//! The guard's [`LockGuard::fencing_token`] is the log index that created
//! its node: unique and strictly increasing across every grant of every
//! lock. A resource that remembers the highest token it has seen can refuse
//! a holder that was paused past its session and lost the lock without
//! knowing ([`LockGuard::fenced`] does this inside Baton with `check_fence`).
//!
//! Cancellation: dropping a waiting `lock` future (or a timeout) deletes its
//! node. Dropping a guard releases the lock in the background.
//!
//! Many tasks, one client: each `lock(name)` call queues a node of its
//! own, so tasks sharing one (cloned) `Client` queue for the same lock as
//! separate holders, granted one at a time in the order their nodes were
//! created (the same order that separate clients get; etcd's mutexes on one
//! lease and Curator's per-thread mutexes behave alike). Every holder in
//! that process shares the session: when it expires, all of them lose the
//! lock at once.
//!
//! Reentrancy: the lock is not reentrant. A second `lock(name)` from the
//! *task* that holds (or waits for) `name` through the same client would
//! wait for itself forever, so it fails at once with `Error::Invalid`. The
//! mark belongs to the task that called `lock` (code outside any spawned
//! task, such as `#[tokio::main]`'s body, counts as one task); a guard
//! moved to another task keeps its mark on the first. Two futures polled
//! by one task (`join!`) are one task too: the second is refused, because
//! the first's guard could never be dropped while `join!` waits for both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::queue::{
    delete_own, enqueue_first, may_be_taken, queue_dir, recipe_dir, session_lost, sorted_children, wait_gone,
    wait_pushed, within, Place, QueueNode,
};
use crate::{Client, Error, Op, OpResult, Result, SessionState};

/// Prefix of lock queue nodes (after the protection prefix: Curator's
/// `InterProcessMutex` names its nodes `_c_<uuid>-lock-<seq>`).
pub(crate) const PREFIX: &str = "lock-";

/// Where named locks live.
const LOCKS: &str = "/_baton/locks/";

/// A held lock. Released by [`LockGuard::release`] or on drop.
#[derive(Debug)]
pub struct LockGuard {
    node: QueueNode,
    name: String,
    wakeups: u64,
    _held: HeldMark,
}

/// Marks `name` as held (or awaited) by the calling task through this
/// client until dropped (the reentrancy rule in the module doc).
#[derive(Debug)]
pub(crate) struct HeldMark {
    client: Client,
    name: String,
}

impl HeldMark {
    pub(crate) fn take(client: &Client, kind: &str, name: &str) -> Result<HeldMark> {
        let task = tokio::task::try_id().map_or_else(|| "outside-tasks".to_string(), |id| id.to_string());
        // Per session too: a guard of an expired session (renew.rs) waits
        // for nothing, so it blocks no new acquire.
        let key = format!("{kind}/{name}@{task}#{}", client.session_id());
        let mut held = client.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(key.clone()) {
            return Err(Error::Invalid(format!(
                "{kind} {name:?} is already held or awaited by this task through this client: it is not \
                 reentrant, and waiting would wait for itself (other tasks may share the client and queue)"
            )));
        }
        Ok(HeldMark { client: client.clone(), name: key })
    }
}

impl Drop for HeldMark {
    fn drop(&mut self) {
        let mut held = self.client.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&self.name);
    }
}

impl LockGuard {
    /// The fencing token: the log index that created this holder's node.
    pub fn fencing_token(&self) -> u64 {
        self.node.czxid
    }
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The queue node that holds the lock.
    pub fn path(&self) -> &str {
        &self.node.path
    }
    /// How many times this holder was woken while waiting (1 per
    /// predecessor that left; a herd would show many).
    pub fn wakeups(&self) -> u64 {
        self.wakeups
    }
    /// Resolves when the lock is in doubt (session Suspended) or gone
    /// (Expired). Stop work on the protected resource when it does. It
    /// cannot fire while this process is paused: fence your writes.
    pub async fn lost(&self) -> SessionState {
        session_lost(&self.node.client).await
    }
    /// Resolves when someone else may hold the lock: the session expired,
    /// or its last proof of life (a vouched keepalive's send) is 2/3 of the
    /// session timeout old ([`crate::Client::may_be_lost_at`]: the third
    /// left before the cluster can expire it is the allowance for clock
    /// rates 10% apart and for stopping). Later than [`LockGuard::lost`]
    /// (which fires at the first doubt, e.g. a dropped connection): use it
    /// to ride out a member restart, with fenced writes.
    pub async fn may_be_taken(&self) -> SessionState {
        may_be_taken(&self.node.client).await
    }
    /// Runs `ops` atomically, only if no higher token than this guard's was
    /// used on `resource` before (and records this token).
    pub async fn fenced(&self, resource: &str, ops: &[Op]) -> Result<Vec<OpResult>> {
        let mut all = Vec::with_capacity(ops.len() + 1);
        all.push(Op::CheckFence { resource: resource.to_string(), token: self.fencing_token() });
        all.extend_from_slice(ops);
        let mut r = self.node.client.multi(&all).await?;
        r.remove(0);
        Ok(r)
    }
    /// Asks the cluster (linearizable read) whether this guard still holds
    /// the lock: its node exists and belongs to this session.
    pub async fn verify(&self) -> Result<bool> {
        still_mine(&self.node).await
    }
    /// Releases the lock (deletes this holder's node, and only it).
    pub async fn release(mut self) -> Result<()> {
        self.node.disarm();
        delete_own(&self.node.client, &self.node.path).await
    }
}

pub(crate) async fn still_mine(node: &QueueNode) -> Result<bool> {
    if *node.client.state().borrow() == SessionState::Expired {
        return Ok(false);
    }
    match node.client.exists(&node.path).await {
        Ok(Some(s)) => Ok(s.ephemeral_owner == node.client.session_id() && s.czxid == node.czxid),
        Ok(None) | Err(Error::SessionExpired) => Ok(false),
        Err(e) => Err(e),
    }
}

static WAKEUPS: AtomicU64 = AtomicU64::new(0);

/// Total waiter wake-ups in this process (for herd-effect tests).
pub fn total_wakeups() -> u64 {
    WAKEUPS.load(Ordering::Relaxed)
}

/// Counts one waiter wake-up.
pub(crate) fn woke() {
    WAKEUPS.fetch_add(1, Ordering::Relaxed);
}

/// A lock at any path (Curator's `InterProcessMutex` at the same path is
/// the same lock: the module doc, "Curator's layout"). Cheap to clone;
/// every [`Mutex::lock`] is a holder of its own.
#[derive(Debug, Clone)]
pub struct Mutex {
    client: Client,
    dir: String,
}

impl Client {
    /// The lock whose queue is the children of `path` (an absolute path;
    /// created with its parents on the first lock). Nothing is sent yet.
    pub fn mutex(&self, path: &str) -> Result<Mutex> {
        queue_dir(path)?;
        Ok(Mutex { client: self.clone(), dir: path.to_string() })
    }

    /// Waits until this client holds lock `name`: the lock at
    /// `/_baton/locks/<name>`.
    pub async fn lock(&self, name: &str) -> Result<LockGuard> {
        self.named_mutex(name)?.lock().await
    }

    /// Takes lock `name` if it is free now; `None` if someone holds it.
    pub async fn try_lock(&self, name: &str) -> Result<Option<LockGuard>> {
        self.named_mutex(name)?.try_lock().await
    }

    /// Waits at most `timeout` for lock `name`; `None` when it timed out
    /// (the waiter's node is deleted). A zero timeout is [`Client::try_lock`].
    pub async fn lock_with_timeout(&self, name: &str, timeout: Duration) -> Result<Option<LockGuard>> {
        self.named_mutex(name)?.lock_with_timeout(timeout).await
    }

    fn named_mutex(&self, name: &str) -> Result<Mutex> {
        Ok(Mutex { client: self.clone(), dir: recipe_dir("locks", name)? })
    }
}

impl Mutex {
    /// The lock's path (the parent of its queue nodes).
    pub fn path(&self) -> &str {
        &self.dir
    }

    /// The name guards report: a named lock's name, or the path.
    fn label(&self) -> String {
        self.dir.strip_prefix(LOCKS).unwrap_or(&self.dir).to_string()
    }

    /// Waits until this client holds the lock.
    pub async fn lock(&self) -> Result<LockGuard> {
        let held = HeldMark::take(&self.client, "lock", &self.dir)?;
        let (node, place) = enqueue_first(&self.client, &self.dir, PREFIX, Vec::new()).await?;
        let wakeups = wait_pushed(&node.client.clone(), &self.dir, &node, place).await?;
        Ok(LockGuard { node, name: self.label(), wakeups, _held: held })
    }

    /// Takes the lock if it is free now; `None` if someone holds it
    /// (nothing is left queued).
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        let held = HeldMark::take(&self.client, "lock", &self.dir)?;
        let (mut node, place) = enqueue_first(&self.client, &self.dir, PREFIX, Vec::new()).await?;
        let first = match place {
            Place::First => true,
            Place::Behind(_) => false,
            Place::Unknown => sorted_children(&node.client, &self.dir).await?.first() == Some(&node.name),
        };
        if first {
            return Ok(Some(LockGuard { node, name: self.label(), wakeups: 0, _held: held }));
        }
        node.disarm();
        delete_own(&node.client, &node.path).await?;
        Ok(None)
    }

    /// Waits at most `timeout` for the lock; `None` when it timed out (the
    /// waiter's node is deleted). A zero timeout is [`Mutex::try_lock`].
    pub async fn lock_with_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        within(timeout, self.try_lock(), self.lock()).await
    }
}

/// Picks, from the sorted queue and this waiter's position, the node it
/// must wait for (None: it holds).
pub(crate) type Blocker = dyn Fn(&[String], usize) -> Option<String> + Send + Sync;

/// Waits until `node` is first in `dir`'s queue (or, with `ahead`, until
/// the predecessor chosen by `ahead` is gone). Returns the wake-up count.
pub(crate) async fn wait_first(c: &Client, dir: &str, node: &QueueNode, ahead: Option<&Blocker>) -> Result<u64> {
    let mut wakeups = 0;
    loop {
        let kids = sorted_children(c, dir).await?;
        let Some(me) = kids.iter().position(|k| *k == node.name) else {
            // Our node is gone: the session expired under us.
            return Err(Error::SessionExpired);
        };
        let blocker = match ahead {
            Some(f) => f(&kids, me),
            None => me.checked_sub(1).map(|i| kids[i].clone()),
        };
        let Some(pred) = blocker else { return Ok(wakeups) };
        wait_gone(c, &format!("{dir}/{pred}")).await?;
        wakeups += 1;
        woke();
    }
}
