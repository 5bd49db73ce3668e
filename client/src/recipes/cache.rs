//! A tree cache (Curator's `CuratorCache`): a local copy of a subtree that
//! follows the cluster, for configuration and service discovery.
//!
//! Rules:
//! - Start registers one recursive watch on the root *before* reading the
//!   subtree (depth first, linearizable reads), so no change between the
//!   reads and the watch is lost.
//! - Each event re-reads the node it names; events are handled one at a
//!   time, in order. `NodeDeleted` drops the node and everything cached
//!   below it; `NodeChildrenChanged` (a recursive watch's report of a gap,
//!   after a reconnect) re-lists that node's children, dropping the gone and
//!   loading the new. So the cache converges to the cluster's subtree once
//!   changes stop.
//! - Reads are served from memory and may lag the cluster: a cache is for
//!   reading configuration, never for deciding who holds a lock.
//! - The root need not exist; it is cached once created.
//! - When its watch ends the cache resumes if it can: after it fell
//!   `watch_buffer` events behind, at once; after its session expired,
//!   once a client that renews sessions (`renew_session(true)`, renew.rs)
//!   has opened the next one. It watches the root again *then* reads the
//!   whole subtree again (the order of a start), replaces the copy with
//!   what it read and reports each difference: `Created`, `Changed`, and
//!   `Deleted` for every node gone. While it waits the copy stays as it
//!   was (stale: [`TreeCache::is_current`] is false). A read that fails
//!   meanwhile is tried again after a pause; a session that expires again
//!   is waited out again.
//! - It stops only when it cannot resume: the session expired and the
//!   client does not renew, or the client was closed.
//!   [`TreeCache::next_event`] then yields [`CacheEvent::Stopped`] and the
//!   copy stays as it was. Curator's `CuratorCache` also survives a new
//!   session; build a new cache for a new client.
//! - Events for the caller are hints, bounded (1,024): unread ones beyond
//!   that are dropped; the copy itself is always complete.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::{Client, Error, EventType, Result, Stat, WatchEnd, WatchKind, WatchMode, Watcher};

/// One cached node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedNode {
    /// Its data when last read.
    pub data: Bytes,
    /// Its stat when last read.
    pub stat: Stat,
}

/// What changed in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheEvent {
    /// The first full read is done (each node it found was reported as
    /// `Created` before this).
    Initialized,
    /// A node appeared in the cache.
    Created(String),
    /// A cached node's data or stat changed.
    Changed(String),
    /// A node (and everything below it) left the cache.
    Deleted(String),
    /// The cache stopped following the cluster (see the module doc).
    Stopped(Option<WatchEnd>),
}

type Nodes = Arc<RwLock<BTreeMap<String, CachedNode>>>;

/// A subtree kept up to date in memory (see the module doc).
#[derive(Debug)]
pub struct TreeCache {
    root: String,
    nodes: Nodes,
    events: mpsc::Receiver<CacheEvent>,
    /// False while the cache waits to resume (module doc).
    current: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TreeCache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TreeCache {
    /// Watches `root`, reads its subtree, and keeps following it. Returns
    /// once the first read is done.
    pub async fn start(client: &Client, root: &str) -> Result<TreeCache> {
        let session = client.session_id();
        let watcher = client.watch(root, WatchKind::Recursive, WatchMode::Persistent).await?;
        let nodes: Nodes = Default::default();
        let (tx, events) = mpsc::channel(1024);
        let current = Arc::new(AtomicBool::new(true));
        let mut follower = Follower {
            client: client.clone(),
            root: root.to_string(),
            nodes: nodes.clone(),
            tx,
            current: current.clone(),
            session,
        };
        follower.load(root).await?;
        follower.emit(CacheEvent::Initialized);
        let task = tokio::spawn(follower.follow(watcher));
        Ok(TreeCache { root: root.to_string(), nodes, events, current, task })
    }

    /// True while the copy follows the cluster; false while the cache waits
    /// to resume after its watch ended, and once it stopped (module doc).
    pub fn is_current(&self) -> bool {
        self.current.load(Ordering::SeqCst) && !self.task.is_finished()
    }

    /// The root this cache follows.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// A cached node.
    pub fn get(&self, path: &str) -> Option<CachedNode> {
        self.read().get(path).cloned()
    }

    /// The cached children's names of `path`, sorted.
    pub fn children(&self, path: &str) -> Vec<String> {
        let prefix = below(path);
        child_paths(&self.read(), path).iter().map(|p| p[prefix.len()..].to_string()).collect()
    }

    /// A copy of every cached node, by path.
    pub fn snapshot(&self) -> BTreeMap<String, CachedNode> {
        self.read().clone()
    }

    /// Cached nodes.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True when nothing is cached (the root does not exist).
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// True while the cache follows the cluster.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// The next change (`None` after [`CacheEvent::Stopped`] was read).
    pub async fn next_event(&mut self) -> Option<CacheEvent> {
        self.events.recv().await
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, CachedNode>> {
        self.nodes.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// The task that applies events to the copy.
struct Follower {
    client: Client,
    root: String,
    nodes: Nodes,
    tx: mpsc::Sender<CacheEvent>,
    current: Arc<AtomicBool>,
    /// The session the watch was registered under.
    session: u64,
}

/// Pause before reading again after a failed read (the client already
/// retried it for a whole operation timeout).
const REREAD_PAUSE: Duration = Duration::from_millis(200);

impl Follower {
    fn emit(&self, ev: CacheEvent) {
        let _ = self.tx.try_send(ev);
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, CachedNode>> {
        self.nodes.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows each watch until it ends, and resumes while it can (module
    /// doc).
    async fn follow(mut self, mut watcher: Watcher) {
        loop {
            let end = self.follow_watch(&mut watcher).await;
            drop(watcher);
            self.current.store(false, Ordering::SeqCst);
            match self.resume(end).await {
                Some(w) => watcher = w,
                None => {
                    self.emit(CacheEvent::Stopped(end));
                    return;
                }
            }
            self.current.store(true, Ordering::SeqCst);
        }
    }

    /// Applies `watcher`'s events until it ends; why it ended.
    async fn follow_watch(&mut self, watcher: &mut Watcher) -> Option<WatchEnd> {
        while let Some(ev) = watcher.next().await {
            loop {
                match self.apply(ev.event_type, &ev.path).await {
                    Ok(()) => break,
                    Err(Error::SessionExpired) | Err(Error::Closed) => return Some(WatchEnd::SessionEnded),
                    // Unavailable for a whole operation timeout: read again.
                    Err(_) => tokio::time::sleep(REREAD_PAUSE).await,
                }
            }
        }
        watcher.end_reason()
    }

    /// A new watch on the root with the copy read again, once the cache
    /// can resume; None if it never can (module doc).
    async fn resume(&mut self, mut end: Option<WatchEnd>) -> Option<Watcher> {
        loop {
            if end == Some(WatchEnd::SessionEnded) && !self.client.next_session(self.session).await {
                return None;
            }
            self.session = self.client.session_id();
            let watched = self.client.watch(&self.root, WatchKind::Recursive, WatchMode::Persistent).await;
            let r = match watched {
                Ok(w) => self.reread_all().await.map(|()| w),
                Err(e) => Err(e),
            };
            match r {
                Ok(w) => return Some(w),
                Err(Error::Closed) => return None,
                // This session is gone too: wait for the next.
                Err(Error::SessionExpired) => end = Some(WatchEnd::SessionEnded),
                Err(_) => tokio::time::sleep(REREAD_PAUSE).await,
            }
        }
    }

    /// Reads the whole subtree again, makes it the copy, and reports what
    /// differs from the copy it replaces.
    async fn reread_all(&mut self) -> Result<()> {
        let fresh = self.read_subtree().await?;
        let old = std::mem::replace(&mut *self.write(), fresh.clone());
        for gone in old.keys().filter(|p| !fresh.contains_key(*p)) {
            self.emit(CacheEvent::Deleted(gone.clone()));
        }
        for (path, node) in &fresh {
            match old.get(path) {
                None => self.emit(CacheEvent::Created(path.clone())),
                Some(o) if o != node => self.emit(CacheEvent::Changed(path.clone())),
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The subtree as it is now, read depth first (not into the copy).
    async fn read_subtree(&self) -> Result<BTreeMap<String, CachedNode>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![self.root.clone()];
        while let Some(path) = stack.pop() {
            let (data, stat) = match self.client.get(&path).await {
                Ok(found) => found,
                Err(e) if e.is_no_node() => continue,
                Err(e) => return Err(e),
            };
            match self.client.children(&path).await {
                Ok(kids) => stack.extend(kids.iter().rev().map(|k| format!("{}{k}", below(&path)))),
                // Deleted between the two reads.
                Err(e) if e.is_no_node() => continue,
                Err(e) => return Err(e),
            }
            out.insert(path, CachedNode { data, stat });
        }
        Ok(out)
    }

    async fn apply(&mut self, ty: EventType, path: &str) -> Result<()> {
        match ty {
            EventType::NodeCreated | EventType::NodeDataChanged => self.reread(path).await,
            EventType::NodeDeleted => {
                self.drop_subtree(path);
                Ok(())
            }
            EventType::NodeChildrenChanged => self.relist(path).await,
            // Only a FIRST watch fires it; the cache's recursive one never.
            EventType::NodeFirst => Ok(()),
        }
    }

    /// Reads one node again (gone: dropped with its subtree).
    async fn reread(&mut self, path: &str) -> Result<()> {
        match self.client.get(path).await {
            Ok((data, stat)) => {
                let node = CachedNode { data, stat };
                let old = self.write().insert(path.to_string(), node.clone());
                match old {
                    None => self.emit(CacheEvent::Created(path.to_string())),
                    Some(o) if o != node => self.emit(CacheEvent::Changed(path.to_string())),
                    Some(_) => {}
                }
                Ok(())
            }
            Err(e) if e.is_no_node() => {
                self.drop_subtree(path);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Lists `path`'s children again: drops the cached ones that are gone,
    /// loads the ones not cached yet.
    async fn relist(&mut self, path: &str) -> Result<()> {
        let kids = match self.client.children(path).await {
            Ok(k) => k,
            Err(e) if e.is_no_node() => {
                self.drop_subtree(path);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let wanted: Vec<String> = kids.iter().map(|k| format!("{}{k}", below(path))).collect();
        let cached = child_paths(&self.nodes.read().unwrap_or_else(|p| p.into_inner()), path);
        for gone in cached.iter().filter(|c| !wanted.contains(c)) {
            self.drop_subtree(gone);
        }
        for new in wanted.iter().filter(|w| !cached.contains(w)) {
            self.load(new).await?;
        }
        self.reread(path).await
    }

    /// Reads `top` and everything below it into the cache.
    async fn load(&mut self, top: &str) -> Result<()> {
        let mut stack = vec![top.to_string()];
        while let Some(path) = stack.pop() {
            self.reread(&path).await?;
            match self.client.children(&path).await {
                Ok(kids) => stack.extend(kids.iter().rev().map(|k| format!("{}{k}", below(&path)))),
                Err(e) if e.is_no_node() => self.drop_subtree(&path),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Removes `path` and everything cached below it.
    fn drop_subtree(&mut self, path: &str) {
        let prefix = below(path);
        let removed = {
            let mut nodes = self.write();
            let under: Vec<String> = nodes
                .range(prefix.clone()..)
                .take_while(|(p, _)| p.starts_with(&prefix))
                .map(|(p, _)| p.clone())
                .collect();
            let mut any = nodes.remove(path).is_some();
            for p in under {
                any |= nodes.remove(&p).is_some();
            }
            any
        };
        if removed {
            self.emit(CacheEvent::Deleted(path.to_string()));
        }
    }
}

/// The prefix every path below `path` starts with.
fn below(path: &str) -> String {
    if path == "/" {
        "/".to_string()
    } else {
        format!("{path}/")
    }
}

/// The cached direct children of `path`, as full paths, sorted.
fn child_paths(nodes: &BTreeMap<String, CachedNode>, path: &str) -> Vec<String> {
    let prefix = below(path);
    nodes
        .range(prefix.clone()..)
        .take_while(|(p, _)| p.starts_with(&prefix))
        .map(|(p, _)| p)
        .filter(|p| p.len() > prefix.len() && !p[prefix.len()..].contains('/'))
        .cloned()
        .collect()
}
