//! A read-write lock (ZooKeeper's shared-lock recipe).
//!
//! Readers queue as `_c_<uuid>-read-<seq>`, writers as
//! `_c_<uuid>-write-<seq>` in one queue
//! under `/_baton/rwlocks/<name>`; the sequence counter is shared, so the
//! queue is in arrival order. A reader holds the lock when no writer is
//! ahead of it and waits for the nearest writer ahead; a writer holds it
//! when it is first and waits for its immediate predecessor. Readers that
//! arrive after a waiting writer queue behind it: no writer starvation.
//!
//! At a path ([`Client::rw_lock_at`]) the queue is laid out as Curator's
//! `InterProcessReadWriteLock` lays out its own: readers
//! `_c_<uuid>-__READ__<seq>`, writers `_c_<uuid>-__WRIT__<seq>` (a writer
//! is a node whose name holds `__WRIT__`, as Curator tells them). The rule
//! above is Curator's too (its read lock's predicate: no writer ahead; its
//! write lock: first of all), so Baton and Curator readers and writers at
//! one path share one lock (docs/zookeeper.md, "Recipes that
//! interoperate").

use super::lock::{still_mine, wait_first, HeldMark};
use super::queue::{
    delete_own, enqueue, may_be_taken, queue_dir, recipe_dir, session_lost, sorted_children, QueueNode,
};
use crate::{Client, Error, Result, SessionState};

const READ: &str = "read-";
const WRITE: &str = "write-";
/// Curator's `InterProcessReadWriteLock` node names.
const CURATOR_READ: &str = "__READ__";
const CURATOR_WRITE: &str = "__WRIT__";

/// A queue's place and node names.
#[derive(Debug, Clone)]
struct Layout {
    dir: String,
    curator: bool,
}

impl Layout {
    fn prefix(&self, write: bool) -> &'static str {
        match (self.curator, write) {
            (false, false) => READ,
            (false, true) => WRITE,
            (true, false) => CURATOR_READ,
            (true, true) => CURATOR_WRITE,
        }
    }

    fn is_writer(&self, name: &str) -> bool {
        match self.curator {
            true => name.contains(CURATOR_WRITE),
            false => is_writer(name),
        }
    }

    /// Whom a reader (the nearest writer ahead) or a writer (its
    /// predecessor) waits for.
    fn blocker(&self, write: bool, kids: &[String], me: usize) -> Option<String> {
        match write {
            true => me.checked_sub(1).map(|i| kids[i].clone()),
            false => kids[..me].iter().rev().find(|k| self.is_writer(k)).cloned(),
        }
    }
}

/// A read-write lock at any path, laid out as Curator's
/// `InterProcessReadWriteLock` (the module doc). Cheap to clone; every
/// hold is a holder of its own.
#[derive(Debug, Clone)]
pub struct RwLock {
    client: Client,
    layout: Layout,
}

impl RwLock {
    /// The lock's path (the parent of its nodes).
    pub fn path(&self) -> &str {
        &self.layout.dir
    }
    /// Waits for a shared (read) hold.
    pub async fn read(&self) -> Result<RwGuard> {
        self.client.rw_lock(&self.layout, false).await
    }
    /// Waits for the exclusive (write) hold.
    pub async fn write(&self) -> Result<RwGuard> {
        self.client.rw_lock(&self.layout, true).await
    }
    /// A read hold if one is free now (no writer holds or waits ahead).
    pub async fn try_read(&self) -> Result<Option<RwGuard>> {
        self.client.try_rw_lock(&self.layout, false).await
    }
    /// The write hold if it is free now.
    pub async fn try_write(&self) -> Result<Option<RwGuard>> {
        self.client.try_rw_lock(&self.layout, true).await
    }
}

/// A held read or write lock; released on [`RwGuard::release`] or drop.
#[derive(Debug)]
pub struct RwGuard {
    node: QueueNode,
    write: bool,
    _held: HeldMark,
}

impl RwGuard {
    /// Creation index of this holder's node (a fencing token).
    pub fn fencing_token(&self) -> u64 {
        self.node.czxid
    }
    /// True for the write (exclusive) side.
    pub fn is_write(&self) -> bool {
        self.write
    }
    /// Resolves when the hold is in doubt or gone (Suspended or Expired).
    pub async fn lost(&self) -> SessionState {
        session_lost(&self.node.client).await
    }
    /// Resolves when someone else may hold it: the session expired, or its
    /// last proof of life is 2/3 of the session timeout old (see
    /// [`crate::LockGuard::may_be_taken`]).
    pub async fn may_be_taken(&self) -> SessionState {
        may_be_taken(&self.node.client).await
    }
    /// Asks the cluster (linearizable read) whether this is still held:
    /// its node exists and belongs to this session.
    pub async fn verify(&self) -> Result<bool> {
        still_mine(&self.node).await
    }
    /// Releases it; the next waiter(s) go.
    pub async fn release(mut self) -> Result<()> {
        self.node.disarm();
        delete_own(&self.node.client, &self.node.path).await
    }
}

/// A writer's node: `_c_<uuid>-write-<seq>` (a uuid holds no `-write-`),
/// or `write-<seq>` from a client before Curator's names.
fn is_writer(name: &str) -> bool {
    name.starts_with(WRITE) || name.contains(&format!("-{WRITE}"))
}

impl Client {
    /// The read-write lock whose queue is the children of `path` (an
    /// absolute path; created with its parents on the first hold), laid
    /// out as Curator's `InterProcessReadWriteLock` at `path`: the two
    /// share it. Nothing is sent yet.
    pub fn rw_lock_at(&self, path: &str) -> Result<RwLock> {
        queue_dir(path)?;
        Ok(RwLock { client: self.clone(), layout: Layout { dir: path.to_string(), curator: true } })
    }

    fn named_rw(name: &str) -> Result<Layout> {
        Ok(Layout { dir: recipe_dir("rwlocks", name)?, curator: false })
    }

    /// Waits for a shared (read) hold of `name`.
    pub async fn read_lock(&self, name: &str) -> Result<RwGuard> {
        self.rw_lock(&Self::named_rw(name)?, false).await
    }

    /// Waits for an exclusive (write) hold of `name`.
    pub async fn write_lock(&self, name: &str) -> Result<RwGuard> {
        self.rw_lock(&Self::named_rw(name)?, true).await
    }

    /// A read hold of `name` if one is free now (no writer holds or waits
    /// ahead); `None` otherwise (nothing is left queued).
    pub async fn try_read_lock(&self, name: &str) -> Result<Option<RwGuard>> {
        self.try_rw_lock(&Self::named_rw(name)?, false).await
    }

    /// The write hold of `name` if it is free now; `None` otherwise.
    pub async fn try_write_lock(&self, name: &str) -> Result<Option<RwGuard>> {
        self.try_rw_lock(&Self::named_rw(name)?, true).await
    }

    async fn rw_lock(&self, at: &Layout, write: bool) -> Result<RwGuard> {
        let (held, node) = self.rw_enqueue(at, write).await?;
        let layout = at.clone();
        let blocker = move |kids: &[String], me: usize| layout.blocker(write, kids, me);
        wait_first(&node.client.clone(), &at.dir, &node, Some(&blocker)).await?;
        Ok(RwGuard { node, write, _held: held })
    }

    async fn try_rw_lock(&self, at: &Layout, write: bool) -> Result<Option<RwGuard>> {
        let (held, mut node) = self.rw_enqueue(at, write).await?;
        let kids = sorted_children(&node.client, &at.dir).await?;
        let me = kids.iter().position(|k| *k == node.name).ok_or(Error::SessionExpired)?;
        if at.blocker(write, &kids, me).is_none() {
            return Ok(Some(RwGuard { node, write, _held: held }));
        }
        node.disarm();
        delete_own(&node.client, &node.path).await?;
        Ok(None)
    }

    async fn rw_enqueue(&self, at: &Layout, write: bool) -> Result<(HeldMark, QueueNode)> {
        let held = HeldMark::take(self, "rwlock", &at.dir)?;
        let node = enqueue(self, &at.dir, at.prefix(write), Vec::new()).await?;
        Ok((held, node))
    }
}
