//! Shutdown, by design rather than drop order (mini-redis's `server.rs`:
//! a broadcast notice and a completion channel).
//!
//! The order, on SIGTERM or SIGINT:
//! 1. The driver gets `Input::Shutdown`. It answers every write still
//!    pending with TIMEOUT (ambiguous: a proposal already in the log may
//!    still commit on the other members) and stops the syncer once the
//!    writes already queued to it are synced; the node thread returns.
//! 2. [`Shutdown::finish`] sends the notice. Every task that holds a
//!    [`Signal`] reacts: the listeners stop accepting; each client
//!    connection stops reading, writes out what is queued for it (the
//!    TIMEOUT answers of step 1 among them) and closes; peer links close;
//!    the HTTP endpoint stops.
//! 3. `finish` waits until every [`Signal`] is dropped (each task drops its
//!    own when it is done), at most the grace period, then returns whether
//!    all finished; the runtime is shut down after it.
//!
//! A client therefore always gets an answer for a write the member
//! accepted (the result, or TIMEOUT) unless the member is killed.

use std::time::Duration;

use tokio::sync::{mpsc, watch};

/// The owner's side: hands out [`Signal`]s, then sends the notice and
/// waits for every holder to finish.
pub struct Shutdown {
    notice: watch::Sender<bool>,
    done_tx: mpsc::Sender<()>,
    done_rx: mpsc::Receiver<()>,
}

/// A task's side: [`Signal::wait`] resolves once shutdown began; dropping
/// the signal tells the owner this task is done.
#[derive(Clone, Debug)]
pub struct Signal {
    notice: watch::Receiver<bool>,
    _done: mpsc::Sender<()>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// No notice sent yet.
    pub fn new() -> Self {
        let (notice, _) = watch::channel(false);
        let (done_tx, done_rx) = mpsc::channel(1);
        Shutdown { notice, done_tx, done_rx }
    }

    /// A signal for one more task.
    pub fn signal(&self) -> Signal {
        Signal { notice: self.notice.subscribe(), _done: self.done_tx.clone() }
    }

    /// Sends the notice and waits up to `grace` for every signal to be
    /// dropped; true when all were.
    pub async fn finish(self, grace: Duration) -> bool {
        let Shutdown { notice, done_tx, mut done_rx } = self;
        let _ = notice.send(true);
        drop(done_tx);
        // recv() is None once every sender (every Signal) is gone.
        tokio::time::timeout(grace, done_rx.recv()).await.is_ok()
    }
}

impl Signal {
    /// Resolves once shutdown began (at once if it already has).
    pub async fn wait(&mut self) {
        let _ = self.notice.wait_for(|begun| *begun).await;
    }

    /// True once shutdown began.
    pub fn begun(&self) -> bool {
        *self.notice.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finish_notifies_every_holder_and_waits_for_each_to_be_done() {
        let s = Shutdown::new();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for i in 0..3u64 {
            let mut sig = s.signal();
            let tx = tx.clone();
            tokio::spawn(async move {
                sig.wait().await;
                tokio::time::sleep(Duration::from_millis(20 * i)).await;
                let _ = tx.send(i);
            });
        }
        drop(tx);
        assert!(s.finish(Duration::from_secs(5)).await, "every task finished");
        let mut done = Vec::new();
        while let Some(i) = rx.recv().await {
            done.push(i);
        }
        assert_eq!(done, [0, 1, 2], "finish returned before a task was done");
    }

    #[tokio::test]
    async fn finish_gives_up_after_the_grace_period() {
        let s = Shutdown::new();
        let stuck = s.signal();
        assert!(!s.finish(Duration::from_millis(50)).await);
        drop(stuck);
    }
}
