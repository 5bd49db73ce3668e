//! Sessions that come back: [`crate::ClientConfig::renew_session`].
//!
//! A client holds one session at a time ([`Session`]: the actor's queue,
//! its state, its id and timeout). By default an expired session ends the
//! client: every call fails with `SessionExpired` from then on. With
//! `renew_session(true)` the client opens a new session after expiry, as
//! Curator's framework does, and the rules are:
//!
//! - The old session is gone for good, and with it every lock, leadership,
//!   permit and ephemeral node it held. The client says so on
//!   [`crate::Client::connection_events`]: `Lost` when it expired, then
//!   [`crate::ConnectionEvent::NewSession`] naming both ids once the new
//!   one is open. [`crate::Client::state`] reads `Expired` in between, then
//!   follows the new session; [`crate::Client::session_id`] changes.
//! - What was taken under a session stays bound to it. A lock guard, a
//!   leadership, a permit (and a read-write guard) answers from its own
//!   session: `lost()` resolves `Expired`, `is_leader()` is false,
//!   `verify()` is false, and `fenced()`, `proclaim()` and `release()` fail
//!   with `SessionExpired` instead of running under the new session. No
//!   write made for an old holder can ride on the new session.
//! - Nothing is re-acquired for the caller, except by a
//!   [`crate::LeaderSelector`], which campaigns again under the new session
//!   (its term ends when the old one is lost, as on any loss).
//!   Watches registered under the old session end (`SessionEnded`);
//!   register them again. A [`crate::TreeCache`] does that itself: it
//!   resumes under the new session (recipes/cache.rs).
//! - A call made while the old session is expired and the new one not yet
//!   open fails with `SessionExpired` (it did not happen); retry it.
//! - The new session is opened like the first ([`crate::ClientConfig`]'s
//!   endpoints and timeouts), retried with the retry policy's delays until
//!   it opens or the client is closed or dropped. `close()` never renews.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tracing::debug;

use crate::session::{self, Cmd, Started};
use crate::{ClientConfig, ConnectionEvent, Inner, SessionState};

/// One session's handles. Dropping the last one closes the session.
pub(crate) struct Session {
    pub(crate) cmds: mpsc::Sender<Cmd>,
    pub(crate) state: watch::Receiver<SessionState>,
    pub(crate) id: u64,
    pub(crate) timeout: Duration,
}

impl From<Started> for Session {
    fn from(s: Started) -> Self {
        Session { cmds: s.cmds, state: s.state, id: s.session_id, timeout: s.timeout }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Never blocks: if the queue is full the actor still closes the
        // session when it sees the queue's last sender gone.
        let _ = self.cmds.try_send(Cmd::Close(None));
    }
}

/// Mirrors the current session's state into the client's, and opens a new
/// session each time one expires (the module doc), until the client is
/// closed or dropped.
pub(crate) async fn keep(
    inner: Weak<Inner>,
    cfg: ClientConfig,
    state: watch::Sender<SessionState>,
    edges: broadcast::Sender<ConnectionEvent>,
) {
    loop {
        let (mut st, old) = match inner.upgrade() {
            Some(i) => {
                let s = i.current();
                (s.state.clone(), s.id)
            }
            None => return,
        };
        loop {
            let now = *st.borrow_and_update();
            state.send_if_modified(|v| std::mem::replace(v, now) != now);
            if now == SessionState::Expired {
                break;
            }
            if st.changed().await.is_err() {
                state.send_replace(SessionState::Expired);
                break;
            }
        }
        let mut attempt = 0u32;
        let new = loop {
            match inner.upgrade() {
                Some(i) if !i.closed.load(Ordering::SeqCst) => {}
                _ => return,
            }
            match session::start(cfg.clone(), edges.clone()).await {
                Ok(s) => break Session::from(s),
                Err(e) => {
                    debug!(expired = old, "no new session yet: {e}");
                    tokio::time::sleep(cfg.retry.delay(attempt)).await;
                    attempt = attempt.saturating_add(1);
                }
            }
        };
        // Closed or dropped while it opened: dropping `new` closes it.
        let Some(i) = inner.upgrade() else { return };
        if i.closed.load(Ordering::SeqCst) {
            return;
        }
        let id = new.id;
        *i.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        debug!(expired = old, session = id, "a new session after expiry");
        state.send_replace(SessionState::Connected);
        let _ = edges.send(ConnectionEvent::NewSession { expired: old, session: id });
    }
}
