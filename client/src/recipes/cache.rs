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
//! - The cache stops when its watch ends (the session expired, or it fell
//!   `watch_buffer` events behind): [`TreeCache::next_event`] then yields
//!   [`CacheEvent::Stopped`] and the copy stays as it was. Build a new one.
//! - Events for the caller are hints, bounded (1,024): unread ones beyond
//!   that are dropped; the copy itself is always complete.

use std::collections::BTreeMap;
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
        let watcher = client.watch(root, WatchKind::Recursive, WatchMode::Persistent).await?;
        let nodes: Nodes = Default::default();
        let (tx, events) = mpsc::channel(1024);
        let mut follower = Follower { client: client.clone(), nodes: nodes.clone(), tx };
        follower.load(root).await?;
        follower.emit(CacheEvent::Initialized);
        let task = tokio::spawn(follower.follow(watcher));
        Ok(TreeCache { root: root.to_string(), nodes, events, task })
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
    nodes: Nodes,
    tx: mpsc::Sender<CacheEvent>,
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

    async fn follow(mut self, mut watcher: Watcher) {
        while let Some(ev) = watcher.next().await {
            loop {
                match self.apply(ev.event_type, &ev.path).await {
                    Ok(()) => break,
                    Err(Error::SessionExpired) | Err(Error::Closed) => {
                        self.emit(CacheEvent::Stopped(Some(WatchEnd::SessionEnded)));
                        return;
                    }
                    // Unavailable for a whole operation timeout: read again.
                    Err(_) => tokio::time::sleep(REREAD_PAUSE).await,
                }
            }
        }
        self.emit(CacheEvent::Stopped(watcher.end_reason()));
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
