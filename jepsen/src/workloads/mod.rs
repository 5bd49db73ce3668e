//! Workloads: what each client slot does, and the checker that judges what
//! it recorded. One file per workload: its setup, its client loop, its
//! final reading and the call into its checker (in `baton_checker`).
//!
//! - [`register`]: read / write / compare-and-set (by version) on a few
//!   keys; checked for linearizability per key.
//! - [`lock`]: take the lock, read a counter, write it +1 guarded by
//!   `check_fence` with the lock's token (through a separate "storage"
//!   session, as an external resource would be), release.
//! - [`rwlock`]: take a read hold (seven times in ten) or the write hold
//!   of one read-write lock, hold it briefly, release; read holds share,
//!   a write hold shares with nothing.
//! - [`semaphore`]: take one of a semaphore's two permits, hold it
//!   briefly (one slot sometimes for a few session timeouts), release; at
//!   most two hold at once.
//! - [`election`]: campaign, lead a while (half the time 2-4 session
//!   timeouts, until `is_leader()` turns false), resign; observers record
//!   every leader change.
//! - [`session`]: ephemeral nodes must live exactly as long as their
//!   session; one-shot watches fire once, in order. Half the slots also run
//!   a side task of stale reads and watch churn, answers a cut-off member
//!   gives from its own state, which must never count as contact.
//!
//! Every operation is recorded by [`Run::op`]. An operation whose outcome
//! is unknown is `info`, never `fail`, and the process that issued it is
//! retired (Jepsen's rule): its session is closed and a fresh process (new
//! id, new session) takes the slot. Every client's session state changes
//! are recorded as history notes ([`Run::watch_state`]); the lock and
//! election checkers judge grants against them
//! (`holder-connected-after-expiry`, `baton_checker::holds`).

use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::role::{MAIN, OBSERVER};
use baton_checker::history::{FaultWindow, History};
use baton_checker::CheckResult;
use baton_client::{Client, CreateOptions, Error, ErrorKind};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::door::DoorClient;
use crate::record::{retire, Run};

pub mod election;
mod holding;
pub mod lock;
pub mod register;
pub mod rwlock;
pub mod semaphore;
pub mod session;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Lock,
    Register,
    Election,
    Session,
    #[value(name = "rwlock")]
    #[serde(rename = "rwlock")]
    RwLock,
    Semaphore,
    All,
}

impl Workload {
    pub fn expand(self) -> Vec<Workload> {
        match self {
            Workload::All => {
                vec![
                    Workload::Register,
                    Workload::Lock,
                    Workload::Election,
                    Workload::Session,
                    Workload::RwLock,
                    Workload::Semaphore,
                ]
            }
            w => vec![w],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::Lock => "lock",
            Workload::Register => "register",
            Workload::Election => "election",
            Workload::Session => "session",
            Workload::RwLock => "rwlock",
            Workload::Semaphore => "semaphore",
            Workload::All => "all",
        }
    }

    /// Whether its clients hold a lock, leadership or a permit (what the
    /// CLI door runs, and what client freezes aim at).
    pub fn holds(self) -> bool {
        matches!(self, Workload::Lock | Workload::Election | Workload::RwLock | Workload::Semaphore)
    }

    /// Creates what the workload needs, through a direct client.
    pub async fn setup(self, c: &Client) -> anyhow::Result<()> {
        match self {
            Workload::Register => register::setup(c).await,
            Workload::Lock => lock::setup(c).await,
            Workload::Session => session::setup(c).await,
            Workload::Election | Workload::RwLock | Workload::Semaphore | Workload::All => Ok(()),
        }
    }

    /// Runs one client slot of the workload until the run stops: `idx` of
    /// the workload's `conc` slots.
    pub async fn worker(self, run: Arc<Run>, slot: usize, idx: usize, conc: usize, seed: u64) {
        let rng = StdRng::seed_from_u64(seed ^ (slot as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        match self {
            // Half the slots mostly read: a reader next to a cut-off member is
            // what exposes stale reads (a writer there just waits for commits).
            Workload::Register => register::worker(run, slot, idx >= conc / 2, rng).await,
            Workload::Lock => lock::worker(run, slot, rng).await,
            Workload::Election if idx == 0 => election::observer(run, slot).await,
            Workload::Election => election::worker(run, slot, rng).await,
            // Half the slots also poll stale reads and churn watches on the side.
            Workload::Session => session::worker(run, slot, idx % 2 == 1, rng).await,
            Workload::RwLock => rwlock::worker(run, slot, rng).await,
            // The first slot sometimes holds long (semaphore.rs).
            Workload::Semaphore => semaphore::worker(run, slot, idx == 0, rng).await,
            Workload::All => {}
        }
    }

    /// The workload's checker on history `h` (None for `All`, which is its
    /// parts); `t` is the run's session timeout.
    pub fn check(self, h: &History, faults: &[FaultWindow], finals: &Finals, t: Duration) -> Option<CheckResult> {
        match self {
            Workload::Register => Some(register::check(h)),
            Workload::Lock => Some(lock::check(h, faults, finals.counter, t)),
            Workload::Election => Some(election::check(h, faults, t)),
            Workload::Session => Some(session::check(h, finals.leftover.clone())),
            Workload::RwLock => Some(rwlock::check(h, faults, t)),
            Workload::Semaphore => Some(semaphore::check(h, faults, t)),
            Workload::All => None,
        }
    }
}

/// What the checkers need besides the history, read after the run (after
/// every session of it has ended or timed out) through a fresh, unproxied
/// client. None: not read (or not readable).
#[derive(Debug, Default)]
pub struct Finals {
    /// The lock workload's counter.
    pub counter: Option<i64>,
    /// The session workload's nodes left.
    pub leftover: Option<Vec<String>>,
}

impl Finals {
    pub async fn read(c: &Client, workloads: &[Workload]) -> Finals {
        Finals {
            counter: if workloads.contains(&Workload::Lock) { lock::read_counter(c).await } else { None },
            leftover: if workloads.contains(&Workload::Session) { session::leftover(c).await } else { None },
        }
    }
}

/// Creates persistent node `path` (and its parents) holding `data`, unless
/// it exists.
async fn create(c: &Client, path: &str, data: &'static str) -> anyhow::Result<()> {
    match c.create(path, data, CreateOptions::persistent().with_parents()).await {
        Ok(_) | Err(Error::Server { kind: ErrorKind::NodeExists, .. }) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("setup {path}: {e}")),
    }
}

/// A fresh process for `slot`: a new client (None once the run stops), a
/// new process id, and its client's session states noted in `role`.
async fn new_process(run: &Arc<Run>, slot: usize, role: &'static str) -> Option<(DoorClient, u64)> {
    let c = if role == OBSERVER { run.connect_observer(slot).await? } else { run.connect_slot(slot).await? };
    let p = run.new_process();
    run.watch_state(&c, p, role, slot);
    Some((c, p))
}

/// The process `slot` goes on with: `current` itself, or a fresh one if
/// `replace` is set or its client's session expired (Jepsen's rule: a
/// process with an unfinished operation is retired; one whose session
/// expired needs a new session anyway). None once the run stops.
async fn next_process(
    run: &Arc<Run>,
    slot: usize,
    current: (DoorClient, u64),
    replace: bool,
) -> Option<(DoorClient, u64)> {
    if !replace && !current.0.is_expired() {
        return Some(current);
    }
    retire(current.0);
    new_process(run, slot, MAIN).await
}
