//! baton-checker: what Baton's Jepsen-style harness concludes from a
//! recorded history, with no I/O beyond reading and writing history files
//! (no network, no async runtime, no Baton client or server): a history
//! can be checked again, or checked from a test, without a cluster.
//!
//! # Layout
//! - [`history`]: operations as recorded (invoke / ok / fail / info) and
//!   the clients' session-state notes.
//! - [`verdict`]: one [`Validity`] for every checker, and the
//!   [`CheckResult`] that goes into `results.json`.
//! - [`linearizability`]: the WGL search ([`linearizability::Search`])
//!   over any sequential [`linearizability::Model`].
//! - [`register`]: the register model and the per-key checker of the
//!   register workload.
//! - [`lock`], [`election`], [`rwlock`], [`semaphore`], [`session`]: the
//!   checkers of the lock, election, read-write lock, semaphore and session
//!   workloads; [`holds`] what the first four share (mutual exclusion
//!   outside faults, read holds shared, a semaphore's permits,
//!   `holder-connected-after-expiry`).

pub mod election;
pub mod history;
pub mod holds;
pub mod linearizability;
pub mod lock;
pub mod register;
pub mod rwlock;
pub mod semaphore;
pub mod session;
pub mod verdict;

pub use verdict::{CheckResult, Validity};
