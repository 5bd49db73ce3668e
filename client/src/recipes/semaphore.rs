//! A counting semaphore: at most `size` holders at once, each with its
//! own fencing token (Curator's `InterProcessSemaphoreV2`).
//!
//! `client.semaphore(name, size)` names it (no I/O); each
//! [`Semaphore::acquire`] takes one permit with a node of its own, so
//! tasks sharing one client are separate holders (recipes/lock.rs, "Many
//! tasks, one client").
//!
//! # The protocol (Curator's, for named semaphores too)
//! An acquirer takes the mutex at `<dir>/locks` (an `InterProcessMutex`
//! there: a queue, each waiter watching its predecessor), creates its
//! lease `<dir>/leases/_c_<uuid>-lease-<seq>`, and while it holds the
//! mutex waits (watching `<dir>/leases`) until at most `size` leases
//! exist, then releases the mutex and holds its lease. Only the mutex's
//! holder waits on the leases, so at most `size` leases are held at once,
//! and any lease leaving wakes exactly that one waiter: no herd, and no
//! free permit while someone waits. A lease that vanished (the session
//! expired) fails the acquire. `<dir>` is the path given to
//! [`Client::semaphore_at`], shared with Curator's recipe there, or
//! `/_baton/semaphores/<name>`.
//!
//! Until 2026-12-07 a named semaphore queued its holders directly under
//! its folder (the first `size` held; a waiter watched the node `size`
//! places ahead of it). That leaves a permit free while a waiter waits:
//! with holders `[A, B]` and waiter `C` watching `A`, `B` leaving moves `C`
//! within the first two, and nothing tells it until `A` leaves. The
//! harness's semaphore workload found it (`permit-idle`: a 4 s wait beside
//! a free permit, docs/testing.md).
//!
//! The size is stored with a named semaphore: the first participant
//! creates its folder holding the count (as Curator's `SharedCount` keeps
//! one), and a participant asking with another count is refused
//! (`Error::Invalid`, nothing queued), so two holders of a 2-permit
//! semaphore never admit a third that asked for 3. A folder left without a
//! count (made before counts were stored) takes the first count asked
//! for, by a compare-and-set on its version. At a path the size is not
//! stored: every participant must pass the same one, as Curator requires.

use std::time::Duration;

use tokio::time::Instant;

use super::lock::{still_mine, HeldMark};
use super::queue::{delete_own, enqueue, may_be_taken, queue_dir, recipe_dir, session_lost, within, QueueNode};
use crate::{Client, CreateOptions, Error, ErrorKind, Result, SessionState};

/// Curator's `InterProcessSemaphoreV2` layout under its path.
const V2_LOCKS: &str = "locks";
const V2_LEASES: &str = "leases";
const V2_LEASE: &str = "lease-";

/// A held permit; returned on [`Permit::release`] or drop.
#[derive(Debug)]
pub struct Permit {
    node: QueueNode,
    _held: HeldMark,
}

impl Permit {
    /// This permit's fencing token (creation index of its node).
    pub fn fencing_token(&self) -> u64 {
        self.node.czxid
    }
    /// Resolves when the permit is in doubt or gone (Suspended or Expired).
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
    /// Gives the permit back; the next waiter goes.
    pub async fn release(mut self) -> Result<()> {
        self.node.disarm();
        delete_own(&self.node.client, &self.node.path).await
    }
}

/// A named semaphore of a fixed size, bound to a client (see the module
/// doc). Cheap to clone; every acquire is a holder of its own.
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: Client,
    name: String,
    size: usize,
    /// Made at a path (no stored size; the module doc).
    curator: bool,
}

impl Client {
    /// Semaphore `name` admitting at most `size` holders at once. Nothing
    /// is sent until an acquire; every participant must use the same size.
    pub fn semaphore(&self, name: &str, size: usize) -> Semaphore {
        Semaphore { client: self.clone(), name: name.to_string(), size, curator: false }
    }

    /// The semaphore at `path` (absolute, not `/`) admitting at most `size`
    /// holders, shared with Curator's `InterProcessSemaphoreV2(client,
    /// path, size)` (the module doc). Nothing is sent until an acquire.
    pub fn semaphore_at(&self, path: &str, size: usize) -> Result<Semaphore> {
        queue_dir(path)?;
        if size == 0 {
            return Err(Error::Invalid(format!("semaphore at {path}: its size must be at least 1")));
        }
        Ok(Semaphore { client: self.clone(), name: path.to_string(), size, curator: true })
    }
}

impl Semaphore {
    /// The semaphore's name (its path, made by [`Client::semaphore_at`]).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// How many holders it admits at once.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Waits for one permit.
    pub async fn acquire(&self) -> Result<Permit> {
        let dir = self.dir().await?;
        self.acquire_v2(&dir, None).await?.ok_or(Error::SessionExpired)
    }

    /// One permit if one is free now; `None` otherwise (nothing is left
    /// queued). "Now" includes the wait for the acquirers' mutex, which
    /// is held only while its holder's permit is being counted or no
    /// permit is free.
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        let dir = self.dir().await?;
        self.acquire_v2(&dir, Some(Instant::now())).await
    }

    /// The semaphore's folder: its path, or for a named one
    /// `/_baton/semaphores/<name>`, made (with its size stored) if new.
    async fn dir(&self) -> Result<String> {
        if self.curator {
            return Ok(self.name.clone());
        }
        if self.size == 0 {
            return Err(Error::Invalid(format!("semaphore {:?}: its size must be at least 1", self.name)));
        }
        let dir = recipe_dir("semaphores", &self.name)?;
        self.client.agree_permits(&dir, &self.name, self.size).await?;
        Ok(dir)
    }

    /// Waits at most `timeout` for one permit; `None` when it timed out
    /// (the waiter's node is deleted). A zero timeout is
    /// [`Semaphore::try_acquire`].
    pub async fn acquire_with_timeout(&self, timeout: Duration) -> Result<Option<Permit>> {
        within(timeout, self.try_acquire(), self.acquire()).await
    }

    /// One permit by Curator's protocol (the module doc), waiting until
    /// `deadline` (None: no limit); None if it passed. A lease not granted
    /// is deleted; the mutex is released either way.
    async fn acquire_v2(&self, dir: &str, deadline: Option<Instant>) -> Result<Option<Permit>> {
        let held = HeldMark::take(&self.client, "semaphore", dir)?;
        let mutex = self.client.mutex(&format!("{dir}/{V2_LOCKS}"))?;
        let guard = match deadline {
            None => mutex.lock().await?,
            Some(d) => match mutex.lock_with_timeout(d.saturating_duration_since(Instant::now())).await? {
                Some(g) => g,
                None => return Ok(None),
            },
        };
        let leases = format!("{dir}/{V2_LEASES}");
        let mut node = enqueue(&self.client, &leases, V2_LEASE, Vec::new()).await?;
        let c = node.client.clone();
        let granted = loop {
            let (kids, _, mut changed) = c.children_watch(&leases).await?;
            if !kids.contains(&node.name) {
                return Err(Error::SessionExpired);
            }
            if kids.len() <= self.size {
                break true;
            }
            match deadline {
                None => {
                    changed.next().await;
                }
                Some(d) => {
                    if tokio::time::timeout_at(d, changed.next()).await.is_err() {
                        break false;
                    }
                }
            }
        };
        if !granted {
            node.disarm();
            delete_own(&c, &node.path).await?;
        }
        // The next acquirer may go: the guard's node is deleted in the
        // background as it drops, retried until it is gone (queue.rs).
        drop(guard);
        Ok(granted.then_some(Permit { node, _held: held }))
    }
}

impl Client {
    /// Makes sure semaphore folder `dir` stores `permits` (module doc).
    async fn agree_permits(&self, dir: &str, name: &str, permits: usize) -> Result<()> {
        let want = permits.to_string();
        for _ in 0..5 {
            match self.create(dir, want.clone(), CreateOptions::persistent().with_parents()).await {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::NodeExists => {}
                Err(e) => return Err(e),
            }
            let (data, stat) = match self.get(dir).await {
                Ok(x) => x,
                Err(e) if e.is_no_node() => continue,
                Err(e) => return Err(e),
            };
            if data.is_empty() {
                match self.set(dir, want.clone(), Some(stat.version)).await {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == ErrorKind::BadVersion || e.is_no_node() => continue,
                    Err(e) => return Err(e),
                }
            }
            let stored = String::from_utf8_lossy(&data);
            if stored.trim() == want {
                return Ok(());
            }
            return Err(Error::Invalid(format!(
                "semaphore {name:?} has {} permits (stored with it by its first holder); asked for {permits}: \
                 every participant must ask for the same number",
                stored.trim()
            )));
        }
        Err(Error::Invalid(format!("semaphore {name:?}: its folder kept changing while its permits were read")))
    }
}
