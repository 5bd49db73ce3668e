//! The queue every recipe stands on: an ephemeral sequential node per
//! participant under one parent, ordered by sequence number, each waiter
//! watching exactly one node ahead of it (no herd effect).
//!
//! Names: Curator's protected layout, `_c_<uuid>-<prefix><10-digit seq>`
//! (`_c_<uuid>-lock-0000000007`), where `<uuid>` is random per enqueue.
//! After an ambiguous create the participant finds *its* node by that
//! name, never an older leftover of the same session (a cancelled attempt
//! whose delete is still on its way). Every queue is ordered by the
//! trailing sequence number alone (`baton_proto::queue_key`), which is how
//! Curator (the part after `lock-`) and kazoo (the digits after its node
//! name) order theirs, so a Curator or kazoo client on the ZooKeeper port
//! that queues under the same path with the same `<prefix>` contends in
//! the same queue (docs/zookeeper.md, "Recipes that interoperate").
//!
//! Cancellation: the create runs in its own task. If the caller is dropped
//! before the reply, the task deletes the node when the reply arrives; if
//! the reply is lost (ambiguous), the node is found again by its attempt
//! name rather than orphaned. After that, [`QueueNode`]'s `Drop` deletes the
//! node in the background unless it was handed to a guard. Every background
//! delete retries (with backoff) until the node is gone or the session is,
//! however long the cluster cannot answer (a partition): a waiter that gave
//! up never blocks the next one for longer than the cluster needs to
//! answer. Only a refusal no retry can pass ends it early. A process about to
//! exit should close its client instead, which ends the session and deletes
//! every node it owns at once (the CLI does).

use std::time::Duration;

use tokio::sync::oneshot;

use crate::{Client, CreateOptions, Error, ErrorKind, EventType, Result, SessionState, Watcher};

/// Where recipes keep their nodes.
pub const RECIPE_ROOT: &str = "/_baton";

/// `/_baton/<kind>/<name>`, with `name` checked.
pub(crate) fn recipe_dir(kind: &str, name: &str) -> Result<String> {
    if name.is_empty() || name.len() > 512 || name.contains('/') || name == "." || name == ".." {
        return Err(Error::Invalid(format!("recipe name {name:?} must be 1..512 bytes without '/'")));
    }
    let dir = format!("{RECIPE_ROOT}/{kind}/{name}");
    baton_proto::validate_path(&dir).map_err(Error::Invalid)?;
    Ok(dir)
}

/// Checks a queue's parent given as a path (absolute, valid, not `/`).
pub(crate) fn queue_dir(path: &str) -> Result<()> {
    baton_proto::validate_path(path).map_err(Error::Invalid)?;
    if path == "/" {
        return Err(Error::Invalid("a recipe's queue cannot be the root: give it a path of its own".into()));
    }
    Ok(())
}

/// Curator's protected name for one enqueue: `_c_<uuid>-<prefix>`.
fn protected(prefix: &str) -> String {
    let u: u128 = rand::random();
    let h = format!("{u:032x}");
    format!("_c_{}-{}-{}-{}-{}-{prefix}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// One participant's node. Deleted in the background when dropped, unless
/// [`QueueNode::disarm`]ed.
#[derive(Debug)]
pub(crate) struct QueueNode {
    pub client: Client,
    pub path: String,
    pub name: String,
    pub czxid: u64,
    armed: bool,
}

impl QueueNode {
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for QueueNode {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (c, p) = (self.client.clone(), self.path.clone());
            rt.spawn(async move { delete_in_background(&c, &p).await });
        }
    }
}

/// Deletes `path` until it is gone or the session is (or the client is
/// closed), retrying what may pass (no leader, a busy or unreachable
/// member, an unknown outcome) with backoff 50 ms doubling to 1 s, for as
/// long as that takes: a waiter that gave up while its member was cut off
/// must not leave its node ahead of everyone for the rest of its session
/// (the harness found a lock stalled for 197 s when this stopped after
/// one session timeout). A refusal that cannot pass (the node has
/// children, no permission) ends it; the node then goes with the session.
/// client/tests/queue_rules.rs holds it to that against a member that
/// refuses for three session timeouts.
pub(crate) async fn delete_in_background(c: &Client, path: &str) {
    let _ = until_answered(c, || c.delete(path, None)).await;
}

/// Runs `attempt` until it gets an answer other than a refusal that may
/// pass, or the session ends: backoff 50 ms doubling to 1 s, no limit.
async fn until_answered<T, F: std::future::Future<Output = Result<T>>>(
    c: &Client,
    mut attempt: impl FnMut() -> F,
) -> Result<T> {
    let mut pause = Duration::from_millis(50);
    loop {
        match attempt().await {
            Err(e) if may_pass(&e) => {}
            r => return r,
        }
        if *c.state().borrow() == SessionState::Expired {
            return Err(Error::SessionExpired);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// A refusal that a retry may get past: nothing is wrong with the request,
/// the cluster could not serve it (or its outcome is unknown).
pub(crate) fn may_pass(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Ambiguous
            | ErrorKind::Unavailable
            | ErrorKind::NoLeader
            | ErrorKind::Busy
            | ErrorKind::ShuttingDown
            | ErrorKind::Timeout
            | ErrorKind::LeaderChanged
    )
}

/// Where a queue create put its node (the pushed grant: watches.rs on the
/// server, docs/protocol.md).
#[derive(Debug)]
pub(crate) enum Place {
    /// First in its queue when it was created: it holds, for as long as it
    /// exists (nodes ahead only ever leave; none can join).
    First,
    /// Behind another; this FIRST watch fires when it is first.
    Behind(Watcher),
    /// Not known (an ambiguous create found again, or a member that did
    /// not register the watch): ask with [`Client::watch_first`].
    Unknown,
}

/// Creates `dir/_c_<uuid>-<prefix><seq>` (ephemeral, sequential, parents
/// on demand).
pub(crate) async fn enqueue(client: &Client, dir: &str, prefix: &str, data: Vec<u8>) -> Result<QueueNode> {
    Ok(enqueue_as(client, dir, prefix, data, false).await?.0)
}

/// [`enqueue`], and where the node stands in its queue ([`Place`]).
pub(crate) async fn enqueue_first(
    client: &Client,
    dir: &str,
    prefix: &str,
    data: Vec<u8>,
) -> Result<(QueueNode, Place)> {
    enqueue_as(client, dir, prefix, data, true).await
}

async fn enqueue_as(
    client: &Client,
    dir: &str,
    prefix: &str,
    data: Vec<u8>,
    placed: bool,
) -> Result<(QueueNode, Place)> {
    // The node, and every call made for it, belong to the session that
    // creates it (renew.rs).
    let client = &client.pinned();
    let (tx, rx) = oneshot::channel::<Result<(String, u64, Place)>>();
    let (c, d, p) = (client.clone(), dir.to_string(), protected(prefix));
    tokio::spawn(async move {
        let r = create_or_find(&c, &d, &p, data, placed).await;
        if let Err(Ok((path, _, _))) = tx.send(r) {
            // The caller went away: do not leave its node behind.
            delete_in_background(&c, &path).await;
        }
    });
    let (path, czxid, place) = rx.await.map_err(|_| Error::Closed)??;
    let name = path.rsplit('/').next().unwrap_or_default().to_string();
    Ok((QueueNode { client: client.clone(), path, name, czxid, armed: true }, place))
}

async fn create_or_find(
    c: &Client,
    dir: &str,
    prefix: &str,
    data: Vec<u8>,
    placed: bool,
) -> Result<(String, u64, Place)> {
    let opts = CreateOptions::ephemeral_sequential().with_parents();
    let path = format!("{dir}/{prefix}");
    let created = match placed {
        true => c.create_queued(&path, data.into(), opts).await,
        false => c.create(&path, data, opts).await.map(|(p, s)| (p, s, Place::Unknown)),
    };
    match created {
        Ok((path, stat, place)) => Ok((path, stat.czxid, place)),
        Err(e) if e.is_ambiguous() => {
            // Did it happen? Ask until the cluster answers (or the session
            // ends): a node created but not found would sit in the queue,
            // owned by a live session, and once first stall it for good.
            match until_answered(c, || find_attempt(c, dir, prefix)).await? {
                Some(found) => Ok(found),
                None => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// This attempt's node, if it was created: it carries the attempt's name
/// (the prefix holds a random attempt id), and this session owns it.
async fn find_attempt(c: &Client, dir: &str, prefix: &str) -> Result<Option<(String, u64, Place)>> {
    let kids = match c.children(dir).await {
        Err(e) if e.is_no_node() => return Ok(None),
        r => r?,
    };
    for kid in kids {
        if !kid.starts_with(prefix) || kid.len() != prefix.len() + 10 {
            continue;
        }
        let path = format!("{dir}/{kid}");
        if let Some(s) = c.exists(&path).await? {
            if s.ephemeral_owner == c.session_id() {
                return Ok(Some((path, s.czxid, Place::Unknown)));
            }
        }
    }
    Ok(None)
}

/// The timed acquire every recipe offers: `now` (take it if free, leave
/// nothing queued) for a zero timeout, else `wait` for at most `timeout`
/// (`None` when it ran out; dropping `wait` deletes its node).
pub(crate) async fn within<G>(
    timeout: Duration,
    now: impl std::future::Future<Output = Result<Option<G>>>,
    wait: impl std::future::Future<Output = Result<G>>,
) -> Result<Option<G>> {
    if timeout.is_zero() {
        return now.await;
    }
    match tokio::time::timeout(timeout, wait).await {
        Ok(r) => r.map(Some),
        Err(_) => Ok(None),
    }
}

/// Children of `dir` sorted by sequence number.
///
/// Read from the member's local state, without a ReadIndex round: that is
/// safe for a queue. A state that already shows the caller's own node holds
/// every node created before it (sequence numbers only grow, so no lower
/// one can appear later), and nodes only ever leave. A lagging state can
/// only show *more* nodes ahead, which makes the caller wait again, never
/// go early. The caller's node is always visible: the member that answered
/// its create had applied it, and a member it moves to first catches up to
/// the last index the client saw.
pub(crate) async fn sorted_children(c: &Client, dir: &str) -> Result<Vec<String>> {
    let mut kids = match c.children_opts(dir, true).await {
        Ok((k, _)) => k,
        Err(e) if e.is_no_node() => Vec::new(),
        Err(e) => return Err(e),
    };
    kids.sort_by(|a, b| baton_proto::queue_key(a).cmp(&baton_proto::queue_key(b)));
    Ok(kids)
}

/// Waits until `path` is deleted or changes (returns at once if it does
/// not exist). Fails if the session expires meanwhile.
pub(crate) async fn wait_gone(c: &Client, path: &str) -> Result<()> {
    // Local state is enough (see `sorted_children`): if the node is gone
    // there it is gone for good, and if not, the watch fires when this
    // member applies its deletion.
    let (stat, mut w) = c.exists_watch_opts(path, true).await?;
    if stat.is_none() {
        return Ok(());
    }
    let mut state = c.state();
    loop {
        tokio::select! {
            _ = w.next() => return Ok(()),
            r = state.changed() => {
                if r.is_err() || *state.borrow() == SessionState::Expired {
                    return Err(Error::SessionExpired);
                }
            }
        }
    }
}

/// Waits until `node` is first in its queue, told by the member (the
/// pushed grant): one wake-up, whatever leaves the queue ahead of it.
/// Returns the wake-ups (0: it was first already, 1: it waited). A watch
/// that ends without an event (a full buffer) is set again with a read;
/// `NodeDeleted` (the node went with its session) is `SessionExpired`.
///
/// A member too old to know FIRST watches (a rolling upgrade, clients
/// first) answers the read that sets one `BAD_REQUEST`: then the classic
/// recipe waits instead (`wait_first`: list the queue, watch the
/// predecessor).
pub(crate) async fn wait_pushed(c: &Client, dir: &str, node: &QueueNode, place: Place) -> Result<u64> {
    let mut w = match place {
        Place::First => return Ok(0),
        Place::Behind(w) => w,
        Place::Unknown => match c.watch_first(&node.path).await {
            Ok(w) => w,
            Err(e) if e.kind() == ErrorKind::BadRequest => return super::lock::wait_first(c, dir, node, None).await,
            Err(e) => return Err(e),
        },
    };
    let mut state = c.state();
    for _ in 0..WATCH_AGAIN_LIMIT {
        let ended = tokio::select! {
            ev = w.next() => ev,
            r = state.changed() => {
                if r.is_err() || *state.borrow() == SessionState::Expired {
                    return Err(Error::SessionExpired);
                }
                continue;
            }
        };
        match ended.map(|e| e.event_type) {
            Some(EventType::NodeFirst) => {
                super::lock::woke();
                return Ok(1);
            }
            Some(EventType::NodeDeleted) => return Err(Error::SessionExpired),
            Some(_) => {}
            None if *state.borrow() == SessionState::Expired => return Err(Error::SessionExpired),
            None => {}
        }
        w = c.watch_first(&node.path).await?;
    }
    Err(Error::Invalid(format!("the FIRST watch on {} ended {WATCH_AGAIN_LIMIT} times", node.path)))
}

/// How many times [`wait_pushed`] sets its watch again before it gives up
/// (each time needs a watch that ended without firing: a full buffer).
const WATCH_AGAIN_LIMIT: usize = 1000;

/// Resolves when `client`'s session is no longer `Connected` (Suspended:
/// in doubt; Expired: gone). This cannot fire while the process itself is
/// paused: only a fence checked by the resource protects against that.
pub(crate) async fn session_lost(c: &Client) -> SessionState {
    let mut st = c.state();
    loop {
        let s = *st.borrow_and_update();
        if s != SessionState::Connected {
            return s;
        }
        if st.changed().await.is_err() {
            return SessionState::Expired;
        }
    }
}

/// Resolves when another session may hold what `client`'s session holds:
/// the session is Expired, or its last proof of life is 2/3 of the timeout
/// old ([`Client::may_be_lost_at`]; with clock rates 10% apart the cluster
/// may expire it soon after). Until then a `Suspended` session (a dropped
/// connection, a member without a leader) still holds everything, as in
/// Curator's session-based error policy, but ends sooner: Curator waits for
/// the expiry itself, which a client that cannot reach the cluster learns
/// only after the next holder may have been granted. `session_lost` is the
/// cautious choice that gives up at `Suspended`.
pub(crate) async fn may_be_taken(c: &Client) -> SessionState {
    let mut st = c.state();
    loop {
        let s = *st.borrow_and_update();
        match s {
            SessionState::Expired => return s,
            SessionState::Connected => {
                if st.changed().await.is_err() {
                    return SessionState::Expired;
                }
            }
            SessionState::Suspended => {
                let at = tokio::time::Instant::from_std(c.may_be_lost_at().await);
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {
                        if *st.borrow() != SessionState::Connected {
                            return *st.borrow();
                        }
                    }
                    r = st.changed() => {
                        if r.is_err() {
                            return SessionState::Expired;
                        }
                    }
                }
            }
        }
    }
}

/// Deletes a node that this session owns, retrying briefly.
pub(crate) async fn delete_own(c: &Client, path: &str) -> Result<()> {
    let mut last = Error::Closed;
    for _ in 0..3 {
        match c.delete(path, Some(0)).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_no_node() => return Ok(()),
            Err(e @ Error::SessionExpired) => return Err(e),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}
