//! SIGINT and SIGTERM, handled alike wherever a command blocks (waiting
//! for a lock, campaigning, watching a leader or a subtree): a service
//! manager's stop is as clean as a Ctrl-C. Interrupted waits exit
//! 128 + the signal, as a shell reports it.
//!
//! The handlers are installed when [`Interrupts::new`] is called, so
//! create it before the wait it guards (a signal that arrives between the
//! two is not lost: tokio buffers it).

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::Fail;

/// Listens for SIGINT and SIGTERM.
pub struct Interrupts {
    int: Signal,
    term: Signal,
}

impl Interrupts {
    pub fn new() -> anyhow::Result<Interrupts> {
        Ok(Interrupts { int: signal(SignalKind::interrupt())?, term: signal(SignalKind::terminate())? })
    }

    /// Resolves with the signal number when either arrives.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
        }
    }

    /// Resolves when either arrives, as the error for an interrupted `what`.
    pub async fn fail(&mut self, what: String) -> anyhow::Error {
        let signal = self.recv().await;
        Fail::Interrupted { what, signal }.into()
    }
}

/// `SIGINT`, `SIGTERM`, or the number.
pub fn name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}
