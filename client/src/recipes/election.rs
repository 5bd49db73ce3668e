//! Leader election (etcd's `concurrency.Election`, ZooKeeper's recipe).
//!
//! Candidates queue as ephemeral sequential nodes under
//! `/_baton/election/<name>`, each node holding the candidate's value. The
//! first node is the leader; the member tells a candidate when its node
//! becomes first (the pushed grant, as the lock's: recipes/lock.rs), so a
//! leader's exit wakes only the next candidate. The leader's token is its node's creation index, so tokens
//! only grow from one leader to the next and a resource can fence a deposed
//! leader exactly as it fences a stale lock holder.
//!
//! A leader learns it may no longer be leader through
//! [`Leadership::lost`] (session Suspended or Expired); once the session is
//! expired it is never reported as leader again ([`Leadership::is_leader`]).
//!
//! Observing ([`Client::observe`], [`Election::observe`]): a task watches
//! the candidates' queue, then reads the leader (in that order, so no
//! change slips between) and yields it whenever it differs from the last
//! one yielded; the leader's own node is watched too (a new value). A read
//! the cluster cannot answer is tried again after 200 ms. When its session
//! expires, an observer on a client that renews sessions goes on under the
//! next one, and yields the leader as it then is; otherwise, or when the
//! client is closed or a read is refused for good (no permission), the
//! stream ends.

use tokio::sync::mpsc;

use super::lock::HeldMark;
use super::queue::{
    delete_in_background, enqueue_first, may_be_taken, may_pass, queue_dir, recipe_dir, session_lost, sorted_children,
    wait_pushed, QueueNode,
};
use crate::{Client, Error, Result, SessionState};

/// Candidates' node prefix, after the protection prefix: Curator's
/// `LeaderLatch` names its nodes `_c_<uuid>-latch-<seq>`.
const PREFIX: &str = "latch-";

/// Where a candidate queues: the queue's path, its nodes' prefix, and the
/// name its leaderships report.
#[derive(Debug, Clone)]
pub(crate) struct Seat {
    pub dir: String,
    pub prefix: &'static str,
    pub label: String,
}

impl Seat {
    /// Election `name` (`/_baton/election/<name>`, `latch-` nodes).
    pub fn named(name: &str) -> Result<Seat> {
        Ok(Seat { dir: recipe_dir("election", name)?, prefix: PREFIX, label: name.to_string() })
    }

    /// The queue at `path` as Curator's `LeaderSelector` lays it out: an
    /// `InterProcessMutex` there (`lock-` nodes), the candidate's id as
    /// each node's data (recipes/selector.rs).
    pub fn curator_selector(path: &str) -> Result<Seat> {
        queue_dir(path)?;
        Ok(Seat { dir: path.to_string(), prefix: super::lock::PREFIX, label: path.to_string() })
    }
}

/// An election at any path (Curator's `LeaderLatch` at the same path takes
/// part in it: docs/zookeeper.md). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    dir: String,
}

impl Election {
    /// The election's path (the parent of its candidates' nodes).
    pub fn path(&self) -> &str {
        &self.dir
    }
    /// Campaigns with `value`; returns once leader (see
    /// [`Client::campaign`]).
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership> {
        self.client.campaign_in(&self.dir, &self.dir, value.into()).await
    }
    /// The current leader, if any.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        leader_of(&self.client, &self.dir).await
    }
    /// The current leader, then every change (see [`Client::observe`]).
    pub async fn observe(&self) -> Result<Observer> {
        Ok(self.client.observe_in(self.dir.clone()))
    }
}

/// Who leads an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The value the leader campaigned with.
    pub value: Vec<u8>,
    /// The leader's fencing token (creation index of its node).
    pub fencing_token: u64,
    /// Its node.
    pub path: String,
}

/// This client's leadership. Resign with [`Leadership::resign`] or drop.
#[derive(Debug)]
pub struct Leadership {
    node: QueueNode,
    name: String,
    _held: HeldMark,
}

impl Leadership {
    /// This leadership's fencing token (its node's creation index).
    pub fn fencing_token(&self) -> u64 {
        self.node.czxid
    }
    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// True while the session is `Connected`: the cluster vouched for it
    /// recently enough that no other candidate can lead yet.
    pub fn is_leader(&self) -> bool {
        *self.node.client.state().borrow() == SessionState::Connected
    }
    /// Asks the cluster (linearizable read) whether this is still the
    /// leader's node. (Leadership is by queue position: while the node
    /// exists, no one ahead of it can appear.)
    pub async fn verify(&self) -> Result<bool> {
        super::lock::still_mine(&self.node).await
    }
    /// Resolves when leadership is in doubt or gone.
    pub async fn lost(&self) -> SessionState {
        session_lost(&self.node.client).await
    }
    /// Resolves when another candidate may lead: the session expired, or
    /// its last proof of life is 2/3 of the session timeout old (as
    /// [`crate::LockGuard::may_be_taken`]).
    pub async fn may_be_replaced(&self) -> SessionState {
        may_be_taken(&self.node.client).await
    }
    /// Changes the value observers see, without giving up leadership.
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<()> {
        self.node.client.set(&self.node.path, value.into(), None).await.map(|_| ())
    }
    /// Gives up leadership; the next candidate takes over.
    pub async fn resign(mut self) -> Result<()> {
        self.node.disarm();
        match self.node.client.delete(&self.node.path, None).await {
            Err(e) if e.is_no_node() => Ok(()),
            r => r,
        }
    }
}

/// A stream of leader changes; ends when dropped or the session expires.
#[derive(Debug)]
pub struct Observer {
    rx: mpsc::Receiver<Option<LeaderInfo>>,
}

impl Observer {
    /// The next leader (None: no leader at the moment). Every change is
    /// reported; the first item is the leader at subscription time.
    pub async fn next(&mut self) -> Option<Option<LeaderInfo>> {
        self.rx.recv().await
    }
}

impl Client {
    /// Campaigns in election `name` with `value`; returns once leader.
    /// Dropping the future withdraws the candidacy.
    pub async fn campaign(&self, name: &str, value: impl Into<Vec<u8>>) -> Result<Leadership> {
        let dir = recipe_dir("election", name)?;
        self.campaign_in(&dir, name, value.into()).await
    }

    /// The election whose candidates are the children of `path` (an
    /// absolute path; created with its parents on the first campaign).
    pub fn election(&self, path: &str) -> Result<Election> {
        queue_dir(path)?;
        Ok(Election { client: self.clone(), dir: path.to_string() })
    }

    async fn campaign_in(&self, dir: &str, name: &str, value: Vec<u8>) -> Result<Leadership> {
        let held = HeldMark::take(self, "election", dir)?;
        let (node, place) = enqueue_first(self, dir, PREFIX, value).await?;
        wait_pushed(&node.client.clone(), dir, &node, place).await?;
        Ok(Leadership { node, name: name.to_string(), _held: held })
    }

    /// Campaigns like [`Client::campaign`] until leader or until `stop`
    /// resolves. On `stop` the candidacy is withdrawn (its node deleted,
    /// retried for up to one session timeout) before this returns
    /// `Ok(None)`, so a caller that then reads the election sees it gone.
    /// The create itself is not raced with `stop` (it is bounded by the
    /// request timeout); a stop during it is seen right after.
    pub(crate) async fn campaign_until(
        &self,
        at: &Seat,
        value: Vec<u8>,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<Option<Leadership>> {
        let dir = at.dir.as_str();
        let held = HeldMark::take(self, "election", dir)?;
        let (mut node, place) = enqueue_first(self, dir, at.prefix, value).await?;
        tokio::pin!(stop);
        let c = node.client.clone();
        tokio::select! {
            r = wait_pushed(&c, dir, &node, place) => {
                r?;
                Ok(Some(Leadership { node, name: at.label.clone(), _held: held }))
            }
            _ = &mut stop => {
                node.disarm();
                delete_in_background(&node.client, &node.path).await;
                Ok(None)
            }
        }
    }

    /// The current leader of election `name`, if any.
    pub async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        let dir = recipe_dir("election", name)?;
        leader_of(self, &dir).await
    }

    /// Watches election `name`: yields the current leader, then every change.
    pub async fn observe(&self, name: &str) -> Result<Observer> {
        Ok(self.observe_in(recipe_dir("election", name)?))
    }

    fn observe_in(&self, dir: String) -> Observer {
        let (tx, rx) = mpsc::channel(64);
        let c = self.clone();
        tokio::spawn(async move {
            let mut last: Option<Option<LeaderInfo>> = None;
            loop {
                let session = c.session_id();
                // Watch the queue first, then read: no change slips between.
                let w = c.children_watch(&dir).await;
                let mut w = match w {
                    Ok((_, _, w)) => Some(w),
                    Err(e) if e.is_no_node() => None,
                    Err(e) if goes_on(&c, &e, session).await => continue,
                    Err(_) => return,
                };
                let now = match leader_of(&c, &dir).await {
                    Ok(l) => l,
                    Err(e) if goes_on(&c, &e, session).await => continue,
                    Err(_) => return,
                };
                if last.as_ref() != Some(&now) {
                    if tx.send(now.clone()).await.is_err() {
                        return;
                    }
                    last = Some(now.clone());
                }
                // Also wake when the leader's own node changes (proclaim).
                let lw = match &now {
                    Some(l) => c.get_watch(&l.path).await.ok().map(|x| x.2),
                    None => None,
                };
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = async {
                        match w.as_mut() {
                            Some(w) => { w.next().await; }
                            // No election yet: wait for its node to appear.
                            None => match c.exists_watch(&dir).await {
                                Ok((None, mut e)) => { e.next().await; }
                                Ok((Some(_), _)) => {}
                                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
                            },
                        }
                    } => {}
                    _ = async { match lw { Some(mut lw) => { lw.next().await; } None => std::future::pending::<()>().await } } => {}
                }
            }
        });
        Observer { rx }
    }
}

/// Whether an observer goes on after a failed read (the module doc,
/// "Observing"): after a pause when the cluster could not answer; once a
/// renewing client has opened its next session when `session` expired;
/// never when the client was closed, did not renew, or was refused for
/// good (no permission).
async fn goes_on(c: &Client, e: &Error, session: u64) -> bool {
    match e {
        Error::SessionExpired => c.next_session(session).await,
        e if may_pass(e) => {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            true
        }
        _ => false,
    }
}

async fn leader_of(c: &Client, dir: &str) -> Result<Option<LeaderInfo>> {
    for first in sorted_children(c, dir).await? {
        let path = format!("{dir}/{first}");
        match c.get(&path).await {
            Ok((value, stat)) => {
                return Ok(Some(LeaderInfo { value: value.to_vec(), fencing_token: stat.czxid, path }))
            }
            // Gone between the listing and the read: the next one leads.
            Err(e) if e.is_no_node() => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}
