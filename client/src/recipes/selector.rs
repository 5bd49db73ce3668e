//! Leader selector (Curator's `LeaderSelector` with `autoRequeue`): run a
//! piece of work while leader of an election, then give leadership up and
//! queue again.
//!
//! Rules:
//! - One term: campaign ([`Client::campaign`]), run `work(term)` to its
//!   end, resign, campaign again. Each term has its own fencing token
//!   ([`LeaderTerm::fencing_token`]), higher than every earlier leader's.
//! - When leadership is in doubt ([`crate::Leadership::lost`]: the session
//!   is Suspended or Expired) the work future is dropped at its next await
//!   point (Curator's default: interrupt on SUSPENDED). Work that writes to
//!   a shared resource fences those writes with the term's token.
//! - A session that expired ends the selector, unless the client renews
//!   sessions ([`crate::ClientConfig::renew_session`]): then the selector
//!   waits for the new session and campaigns again under it (the term that
//!   was running ended when the old session was lost, as on any loss, and
//!   the next term's token is higher than every earlier one).
//!   [`LeaderSelector::close`] ends it too, cancelling the work
//!   and resigning if it leads, or withdrawing its candidacy if it waits.
//!   When `close` returns, the selector's node is gone (unless the cluster
//!   did not answer for a whole session timeout, after which the session
//!   ends it anyway).
//! - A failed campaign (e.g. no member answered) is retried after a pause.
//! - Where it queues: [`LeaderSelector::start`] in election `name`, the
//!   election's queue (`/_baton/election/<name>`, Curator's `LeaderLatch`
//!   layout, so it takes turns with [`Client::campaign`] candidates);
//!   [`LeaderSelector::start_at`] in the queue at a path laid out as
//!   Curator's `LeaderSelector` lays out its own (an `InterProcessMutex`
//!   there: `_c_<uuid>-lock-<seq>` nodes, each candidate's id as its
//!   node's data), so Baton and Curator selectors at one path take turns
//!   and each reads the other's id as the leader's
//!   ([`crate::Election::leader`] at that path, Curator's `getLeader()`).
//!   An invalid name or path ends the selector at once.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::election::Seat;
use crate::{Client, Result};

/// Pause before campaigning again after a campaign failed.
const CAMPAIGN_RETRY: Duration = Duration::from_millis(500);

/// One term as leader, handed to the work.
#[derive(Debug, Clone)]
pub struct LeaderTerm {
    /// The election's name ([`LeaderSelector::start_at`]: its path).
    pub name: String,
    /// This term's fencing token.
    pub fencing_token: u64,
    /// Terms this selector led before this one.
    pub number: u64,
}

/// Runs work each time it leads (see the module doc). Dropping it stops it
/// like [`LeaderSelector::close`], without waiting.
#[derive(Debug)]
pub struct LeaderSelector {
    stop: watch::Sender<bool>,
    terms: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl LeaderSelector {
    /// Starts campaigning in election `name` with `value`, running
    /// `work(term)` each time it leads.
    pub fn start<F, Fut>(client: &Client, name: &str, value: impl Into<Vec<u8>>, work: F) -> LeaderSelector
    where
        F: FnMut(LeaderTerm) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self::spawn(client, Seat::named(name), value.into(), work)
    }

    /// Starts campaigning in the queue at `path` (absolute, not `/`) laid
    /// out as Curator's `LeaderSelector(client, path, listener)` with
    /// `setId(value)`: the two take turns (the module doc).
    pub fn start_at<F, Fut>(client: &Client, path: &str, value: impl Into<Vec<u8>>, work: F) -> LeaderSelector
    where
        F: FnMut(LeaderTerm) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self::spawn(client, Seat::curator_selector(path), value.into(), work)
    }

    fn spawn<F, Fut>(client: &Client, seat: Result<Seat>, value: Vec<u8>, work: F) -> LeaderSelector
    where
        F: FnMut(LeaderTerm) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        let terms = Arc::new(AtomicU64::new(0));
        let task = match seat {
            Ok(seat) => {
                let run = Run { client: client.clone(), seat, value, terms: terms.clone() };
                Some(tokio::spawn(run.go(work, stopped)))
            }
            Err(e) => {
                tracing::warn!("leader selector not started: {e}");
                None
            }
        };
        LeaderSelector { stop, terms, task }
    }

    /// Terms led so far (a term counts from the moment it leads).
    pub fn terms(&self) -> u64 {
        self.terms.load(Ordering::SeqCst)
    }

    /// True while it campaigns or leads.
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops: cancels the work if leading, resigns, stops campaigning.
    pub async fn close(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for LeaderSelector {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

struct Run {
    client: Client,
    seat: Seat,
    value: Vec<u8>,
    terms: Arc<AtomicU64>,
}

impl Run {
    async fn go<F, Fut>(self, mut work: F, mut stopped: watch::Receiver<bool>)
    where
        F: FnMut(LeaderTerm) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        while !*stopped.borrow() {
            let stop = async {
                let _ = stopped.changed().await;
            };
            let session = self.client.session_id();
            let lead = match self.client.campaign_until(&self.seat, self.value.clone(), stop).await {
                Ok(Some(l)) => l,
                // Stopped while queued: the candidacy is already withdrawn.
                Ok(None) => return,
                Err(e) if e.kind() == crate::ErrorKind::Closed => return,
                Err(e) if e.is_session_expired() => {
                    tokio::select! {
                        renewed = self.client.next_session(session) => if !renewed { return },
                        _ = stopped.changed() => return,
                    }
                    continue;
                }
                Err(_) => {
                    tokio::time::sleep(CAMPAIGN_RETRY).await;
                    continue;
                }
            };
            let number = self.terms.fetch_add(1, Ordering::SeqCst);
            let term = LeaderTerm { name: self.seat.label.clone(), fencing_token: lead.fencing_token(), number };
            tokio::select! {
                _ = work(term) => {}
                _ = lead.lost() => {}
                _ = stopped.changed() => {}
            }
            // Bounded: after a loss the session may be gone.
            let _ = tokio::time::timeout(Duration::from_secs(2), lead.resign()).await;
        }
    }
}
