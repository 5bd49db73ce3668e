//! The queue every recipe stands on: an ephemeral sequential node per
//! participant under one parent, ordered by sequence number, each waiter
//! watching exactly one node ahead of it (no herd effect).
//!
//! Names: `<prefix><attempt>-<10-digit seq>`, where `<attempt>` is random
//! per enqueue (Curator's "protected" mode). After an ambiguous create the
//! participant finds *its* node by that name, never an older leftover of the
//! same session (a cancelled attempt whose delete is still on its way).
//!
//! Cancellation: the create runs in its own task. If the caller is dropped
//! before the reply, the task deletes the node when the reply arrives; if
//! the reply is lost (ambiguous), the node is found again by its attempt
//! name rather than orphaned. After that, [`QueueNode`]'s `Drop` deletes the
//! node in the background unless it was handed to a guard. Every background
//! delete retries (with backoff, for up to one session timeout) until the
//! node is gone or the session is: a waiter that gave up never blocks the
//! next one for longer than the cluster needs to answer. A process about to
//! exit should close its client instead, which ends the session and deletes
//! every node it owns at once (the CLI does).

use std::time::Duration;

use tokio::sync::oneshot;

use crate::{Client, CreateOptions, Error, Result, SessionState};

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

/// The 10-digit suffix of a sequential name (u64::MAX if absent).
pub(crate) fn seq_of(name: &str) -> u64 {
    if name.len() < 10 {
        return u64::MAX;
    }
    name[name.len() - 10..].parse().unwrap_or(u64::MAX)
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

/// Deletes `path` until it is gone, the session is, or one session timeout
/// has passed (backoff 50 ms doubling to 1 s).
pub(crate) async fn delete_in_background(c: &Client, path: &str) {
    let until = tokio::time::Instant::now() + c.session_timeout().max(Duration::from_secs(1));
    let mut pause = Duration::from_millis(50);
    loop {
        match c.delete(path, None).await {
            Ok(()) | Err(Error::SessionExpired) | Err(Error::Closed) => return,
            Err(e) if e.is_no_node() => return,
            Err(_) if tokio::time::Instant::now() + pause >= until => return,
            Err(_) => {}
        }
        if *c.state().borrow() == SessionState::Expired {
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Creates `dir/<prefix><attempt>-<seq>` (ephemeral, sequential, parents
/// on demand).
pub(crate) async fn enqueue(client: &Client, dir: &str, prefix: &str, data: Vec<u8>) -> Result<QueueNode> {
    let (tx, rx) = oneshot::channel::<Result<(String, u64)>>();
    let attempt: u64 = rand::random();
    let (c, d, p) = (client.clone(), dir.to_string(), format!("{prefix}{attempt:016x}-"));
    tokio::spawn(async move {
        let r = create_or_find(&c, &d, &p, data).await;
        if let Err(Ok((path, _))) = tx.send(r) {
            // The caller went away: do not leave its node behind.
            delete_in_background(&c, &path).await;
        }
    });
    let (path, czxid) = rx.await.map_err(|_| Error::Closed)??;
    let name = path.rsplit('/').next().unwrap_or_default().to_string();
    Ok(QueueNode { client: client.clone(), path, name, czxid, armed: true })
}

async fn create_or_find(c: &Client, dir: &str, prefix: &str, data: Vec<u8>) -> Result<(String, u64)> {
    let opts = CreateOptions::ephemeral_sequential().with_parents();
    match c.create(&format!("{dir}/{prefix}"), data, opts).await {
        Ok((path, stat)) => Ok((path, stat.czxid)),
        Err(e) if e.is_ambiguous() => {
            // Did it happen? Our node carries this attempt's name (the
            // prefix holds a random attempt id), and this session owns it.
            for kid in c.children(dir).await.unwrap_or_default() {
                if !kid.starts_with(prefix) || kid.len() != prefix.len() + 10 {
                    continue;
                }
                let path = format!("{dir}/{kid}");
                if let Ok(Some(s)) = c.exists(&path).await {
                    if s.ephemeral_owner == c.session_id() {
                        return Ok((path, s.czxid));
                    }
                }
            }
            Err(e)
        }
        Err(e) => Err(e),
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
    kids.sort_by_key(|k| (seq_of(k), k.clone()));
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
/// the session is Expired, or has gone without proof of life for a whole
/// timeout (the cluster may have expired it). Until then a `Suspended`
/// session still holds everything (Curator's session-based error policy);
/// `session_lost` is the cautious choice that gives up at `Suspended`.
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
