//! A read-write lock (ZooKeeper's shared-lock recipe).
//!
//! Readers queue as `read-<seq>`, writers as `write-<seq>` in one queue
//! under `/_baton/rwlocks/<name>`; the sequence counter is shared, so the
//! queue is in arrival order. A reader holds the lock when no writer is
//! ahead of it and waits for the nearest writer ahead; a writer holds it
//! when it is first and waits for its immediate predecessor. Readers that
//! arrive after a waiting writer queue behind it: no writer starvation.

use super::lock::{wait_first, Blocker, HeldMark};
use super::queue::{delete_own, enqueue, recipe_dir, session_lost, QueueNode};
use crate::{Client, Result, SessionState};

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
    /// Releases it; the next waiter(s) go.
    pub async fn release(mut self) -> Result<()> {
        self.node.disarm();
        delete_own(&self.node.client, &self.node.path).await
    }
}

fn nearest_writer_ahead(kids: &[String], me: usize) -> Option<String> {
    kids[..me].iter().rev().find(|k| k.starts_with(WRITE)).cloned()
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

    async fn rw_lock(&self, name: &str, write: bool) -> Result<RwGuard> {
        let dir = recipe_dir("rwlocks", name)?;
        let held = HeldMark::take(self, "rwlock", name)?;
        let node = enqueue(self, &dir, if write { WRITE } else { READ }, Vec::new()).await?;
        let ahead: &Blocker = if write { &predecessor } else { &nearest_writer_ahead };
        wait_first(self, &dir, &node, Some(ahead)).await?;
        Ok(RwGuard { node, write, _held: held })
    }
}
