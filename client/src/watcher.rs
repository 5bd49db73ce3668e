//! Watchers: a stream of [`WatchEvent`]s for one watch.
//!
//! Rules:
//! - A one-shot watch yields one event and ends; a persistent or recursive
//!   one runs until dropped, the session ends, or it overflows.
//! - Each watcher's buffer is bounded (`ClientConfig::watch_buffer`). A
//!   watcher whose reader falls that far behind is ended, not blocked on and
//!   not grown: the session never stalls for one slow reader. After the
//!   buffered events it ends, and [`Watcher::end_reason`] says
//!   [`WatchEnd::Overflow`]: re-read what it watched and watch again.
//! - Across a reconnect the watch is re-registered with the last index the
//!   client saw, so nothing is missed (the server reports what changed in
//!   between).
//! - Dropping a watcher removes the watch on the server.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::session::Cmd;
use crate::WatchEvent;

/// Why a watcher ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WatchEnd {
    /// A one-shot watch fired.
    Fired,
    /// The session expired or was closed.
    SessionEnded,
    /// The reader fell `watch_buffer` events behind (see the module doc).
    Overflow,
}

/// The actor's end of a watcher.
pub(crate) struct WatchTx {
    pub(crate) tx: mpsc::Sender<WatchEvent>,
    pub(crate) end: Arc<OnceLock<WatchEnd>>,
}

impl WatchTx {
    /// Delivers `ev`; false when the watcher is gone or overflowed (then
    /// the watch must be dropped).
    pub(crate) fn deliver(&self, ev: WatchEvent) -> bool {
        match self.tx.try_send(ev) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                let _ = self.end.set(WatchEnd::Overflow);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Marks why it ends (the first reason wins); the caller drops it.
    pub(crate) fn ended(&self, why: WatchEnd) {
        let _ = self.end.set(why);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// A stream of watch events (implements [`futures::Stream`]). Dropping it
/// removes the watch.
pub struct Watcher {
    pub(crate) id: u64,
    pub(crate) rx: mpsc::Receiver<WatchEvent>,
    pub(crate) end: Arc<OnceLock<WatchEnd>>,
    pub(crate) cmds: mpsc::Sender<Cmd>,
}

impl Watcher {
    /// A connected pair: the watcher for the caller, its sender for the
    /// actor.
    pub(crate) fn pair(id: u64, buffer: usize, cmds: mpsc::Sender<Cmd>) -> (Watcher, WatchTx) {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let end = Arc::new(OnceLock::new());
        (Watcher { id, rx, end: end.clone(), cmds }, WatchTx { tx, end })
    }

    /// The next event, or `None` when the watch ended (see
    /// [`Watcher::end_reason`]).
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }

    /// Why the watch ended, once it has (`None` while it runs).
    pub fn end_reason(&self) -> Option<WatchEnd> {
        self.end.get().copied()
    }
}

impl futures::Stream for Watcher {
    type Item = WatchEvent;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchEvent>> {
        self.rx.poll_recv(cx)
    }
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("id", &self.id).field("end", &self.end_reason()).finish()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // Bounded and never awaited here: if the actor's queue is full the
        // watch stays registered until the connection closes, and its
        // events are dropped (the receiver is gone).
        let _ = self.cmds.try_send(Cmd::DropWatch(self.id));
    }
}
