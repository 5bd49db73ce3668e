//! A read-write lock (ZooKeeper's shared-lock recipe).
//!
//! Readers queue as `_c_<uuid>-read-<seq>`, writers as
//! `_c_<uuid>-write-<seq>` in one queue
//! under `/_baton/rwlocks/<name>`; the sequence counter is shared, so the
//! queue is in arrival order. A reader holds the lock when no writer is
//! ahead of it and waits for the nearest writer ahead; a writer holds it
//! when it is first and waits for its immediate predecessor. Readers that
//! arrive after a waiting writer queue behind it: no writer starvation.

use super::lock::{still_mine, wait_first, Blocker, HeldMark};
use super::queue::{delete_own, enqueue, may_be_taken, recipe_dir, session_lost, sorted_children, QueueNode};
use crate::{Client, Error, Result, SessionState};

const READ: &str = "read-";
const WRITE: &str = "write-";

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
    /// Resolves when someone else may hold it: the session expired, or went
    /// a whole session timeout without proof of life (see
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

fn nearest_writer_ahead(kids: &[String], me: usize) -> Option<String> {
    kids[..me].iter().rev().find(|k| is_writer(k)).cloned()
}

fn predecessor(kids: &[String], me: usize) -> Option<String> {
    me.checked_sub(1).map(|i| kids[i].clone())
}

impl Client {
    /// Waits for a shared (read) hold of `name`.
    pub async fn read_lock(&self, name: &str) -> Result<RwGuard> {
        self.rw_lock(name, false).await
    }

    /// Waits for an exclusive (write) hold of `name`.
    pub async fn write_lock(&self, name: &str) -> Result<RwGuard> {
        self.rw_lock(name, true).await
    }

    /// A read hold of `name` if one is free now (no writer holds or waits
    /// ahead); `None` otherwise (nothing is left queued).
    pub async fn try_read_lock(&self, name: &str) -> Result<Option<RwGuard>> {
        self.try_rw_lock(name, false).await
    }

    /// The write hold of `name` if it is free now; `None` otherwise.
    pub async fn try_write_lock(&self, name: &str) -> Result<Option<RwGuard>> {
        self.try_rw_lock(name, true).await
    }

    async fn rw_lock(&self, name: &str, write: bool) -> Result<RwGuard> {
        let (dir, held, node) = self.rw_enqueue(name, write).await?;
        wait_first(&node.client.clone(), &dir, &node, Some(blocker(write))).await?;
        Ok(RwGuard { node, write, _held: held })
    }

    async fn try_rw_lock(&self, name: &str, write: bool) -> Result<Option<RwGuard>> {
        let (dir, held, mut node) = self.rw_enqueue(name, write).await?;
        let kids = sorted_children(&node.client, &dir).await?;
        let me = kids.iter().position(|k| *k == node.name).ok_or(Error::SessionExpired)?;
        if blocker(write)(&kids, me).is_none() {
            return Ok(Some(RwGuard { node, write, _held: held }));
        }
        node.disarm();
        delete_own(&node.client, &node.path).await?;
        Ok(None)
    }

    async fn rw_enqueue(&self, name: &str, write: bool) -> Result<(String, HeldMark, QueueNode)> {
        let dir = recipe_dir("rwlocks", name)?;
        let held = HeldMark::take(self, "rwlock", &dir)?;
        let node = enqueue(self, &dir, if write { WRITE } else { READ }, Vec::new()).await?;
        Ok((dir, held, node))
    }
}

/// Whom a reader or a writer waits for.
fn blocker(write: bool) -> &'static Blocker {
    if write {
        &predecessor
    } else {
        &nearest_writer_ahead
    }
}
