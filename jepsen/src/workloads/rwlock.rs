//! The read-write lock workload: take a read hold (seven times in ten) or
//! the write hold of one read-write lock, hold it 10-40 ms, release; a
//! fresh process after an error or once its session expired (holding.rs). Checked by
//! `baton_checker::rwlock`: a write hold beside any other hold outside
//! faults, or a holder still `Connected` after a conflicting hold went to
//! another session, fails it; read holds may share.
//!
//! History: `rw-acquire` (invoke `{"write"}`, ok `{"token", "write"}`),
//! `rw-release` (ok `{"token", "lost"}`: whether the client had left
//! `Connected` first).

use std::sync::Arc;
use std::time::Duration;

use baton_checker::history::{FaultWindow, History};
use baton_checker::CheckResult;
use rand::rngs::StdRng;
use rand::Rng;

use super::holding::{Ask, Holding};
use crate::record::Run;

const NAME: &str = "jepsen-rw";
/// Chance that a hold is the write hold.
const WRITE: f64 = 0.3;

/// The read-write lock checker; `t` is the session timeout.
pub fn check(h: &History, faults: &[FaultWindow], t: Duration) -> CheckResult {
    baton_checker::rwlock::check(h, NAME, faults, t)
}

/// One client slot: acquire, hold, release.
pub(super) async fn worker(run: Arc<Run>, slot: usize, rng: StdRng) {
    let w = Holding { name: NAME, acquire: "rw-acquire", release: "rw-release" };
    super::holding::worker(run, slot, rng, &w, |r| Ask::Rw { write: r.gen_bool(WRITE) }, |_| false).await;
}
